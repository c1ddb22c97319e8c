/**
 * A Triton user's repository moved over: the real server process never writes into a repository
 * it was given (even asked to --fetch-models), its banners and load errors tell the truth, and
 * what Trellis cannot run (backend "python", KIND_GPU without a GPU) is one clear line naming
 * what to use instead.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, readdir, readFile, rename, rm } from "node:fs/promises";
import { join, relative } from "node:path";
import { makeSeedRepository, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterEach, describe, expect, it } from "vitest";
import { postJson } from "./helpers.js";

/** Every file under `dir` (relative path) with the SHA-256 of its bytes. */
async function snapshot(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const path = join(entry.parentPath, entry.name);
    out[relative(dir, path)] = createHash("sha256")
      .update(await readFile(path))
      .digest("hex");
  }
  return out;
}

/** The server's stderr from now on. */
function stderrOf(server: ServerProcess): () => string {
  let text = "";
  server.proc.stderr?.on("data", (d) => {
    text += String(d);
  });
  return () => text;
}

type IndexRow = { name: string; state: string; reason?: string };
const indexOf = async (server: ServerProcess) =>
  (await postJson(`${server.http}/v2/repository/index`, {})).json as IndexRow[];

const dirs: string[] = [];
afterEach(async () => {
  for (const dir of dirs.splice(0)) {
    await chmod(dir, 0o755).catch(() => undefined);
    await removeDir(dir);
  }
});

describe("a repository the server is given", () => {
  it("stays byte-identical after a start with --fetch-models, and a model without its weights fails naming the file", async () => {
    const repo = await makeSeedRepository();
    dirs.push(repo);
    await rm(join(repo, "resnet50_inference", "1", "model.onnx"));
    // Read-only as a mounted repository would be (root writes anyway: the hashes are the check).
    await chmod(repo, 0o555);
    const before = await snapshot(repo);
    const server = await startServerProcess(["--model-repository", repo, "--fetch-models", "--exit-on-error=false"]);
    const stderr = stderrOf(server);
    try {
      const inference = (await indexOf(server)).find((m) => m.name === "resnet50_inference");
      expect(inference?.state).toBe("UNAVAILABLE");
      expect(inference?.reason).toMatch(/model\.onnx/);
      expect(inference?.reason).not.toContain("\n");
      const failures = server.logs.filter((l) => l.model === "resnet50_inference" && (l.level as number) >= 50);
      expect(failures).toHaveLength(1);
      expect(server.logs.some((l) => /SYNTHETIC/.test(String(l.msg)))).toBe(false);
    } finally {
      expect(await server.stop()).toBe(0);
    }
    expect(stderr()).not.toMatch(/SYNTHETIC/);
    expect(await snapshot(repo)).toEqual(before);
  });

  it("honours default_model_filename: its real weights load, nothing is written, no synthetic banner", async () => {
    const repo = await makeSeedRepository({
      editConfig: (model, config) =>
        model === "resnet50_inference" ? `${config}\ndefault_model_filename: "resnet50.onnx"\n` : config,
    });
    dirs.push(repo);
    const version = join(repo, "resnet50_inference", "1");
    await rename(join(version, "model.onnx"), join(version, "resnet50.onnx"));
    const before = await snapshot(repo);
    const server = await startServerProcess(["--model-repository", repo, "--fetch-models"]);
    const stderr = stderrOf(server);
    try {
      expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
      const loaded = server.logs.find((l) => l.msg === "onnxruntime model loaded");
      expect(loaded).toMatchObject({ model: "resnet50_inference", synthetic: false });
      expect(server.logs.some((l) => /SYNTHETIC/.test(String(l.msg)))).toBe(false);
    } finally {
      expect(await server.stop()).toBe(0);
    }
    expect(stderr()).not.toMatch(/SYNTHETIC/);
    expect(existsSync(join(version, "model.onnx"))).toBe(false);
    expect(await snapshot(repo)).toEqual(before);
  });
});

describe("what Trellis runs differently, in one clear line", () => {
  it('backend "python" names the Trellis package that replaces the seed model, with the config lines; KIND_GPU without a GPU is one line', async () => {
    const repo = await makeSeedRepository({
      editConfig: (model, config) => {
        if (model === "resnet50_inference") return config.replace("KIND_CPU", "KIND_GPU");
        if (model === "resnet50_ensemble") return config;
        // The seed's own configs: backend "python", no module parameter.
        return config.replace('backend: "typescript"', 'backend: "python"').replace(/parameters \{[\s\S]*\}\s*$/, "");
      },
    });
    dirs.push(repo);
    const server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
    try {
      const index = await indexOf(server);
      const reason = (name: string) => index.find((m) => m.name === name)?.reason ?? "";
      for (const [model, pkg] of [
        ["resnet50_preprocess", "@trellis/preprocess"],
        ["resnet50_postprocess", "@trellis/postprocess"],
      ] as const) {
        expect(reason(model)).toContain(pkg);
        expect(reason(model)).toContain('backend: "typescript"');
        expect(reason(model)).toContain(`parameters { key: "module" value: { string_value: "${pkg}" } }`);
      }
      const gpu = reason("resnet50_inference");
      if (existsSync("/dev/nvidia0")) {
        expect(index.find((m) => m.name === "resnet50_inference")?.state).toBe("READY");
      } else {
        expect(gpu).toMatch(/KIND_GPU/);
        expect(gpu).toMatch(/KIND_CPU/);
        expect(gpu).not.toContain("\n");
        expect(gpu.length).toBeLessThan(300);
        const logged = server.logs.filter((l) => l.model === "resnet50_inference" && (l.level as number) >= 50);
        expect(logged).toHaveLength(1);
        expect(String(logged[0]?.reason)).toBe(gpu);
        // onnxruntime was not asked for a provider it lacks, so it printed nothing of its own.
        expect(server.stderr()).not.toContain("onnxruntime");
      }
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });
});
