/**
 * The public packages as a user gets them: each is packed (`pnpm pack`, which
 * turns workspace:* into versions), the tarballs are installed with a plain
 * `npm install` into a scratch project in the system temp folder (outside the
 * workspace; third-party dependencies come from the npm registry, through
 * npm's cache), and then:
 *  (a) a plain ESM script chains @trellis/preprocess → @trellis/inference-onnx
 *      → @trellis/postprocess and classifies chelsea.jpg with the shared
 *      MobileNetV2 (copied into the scratch project at run time) as Egyptian cat;
 *  (b) the installed `trellis-server` bin serves a repository (another temp
 *      folder, no node_modules above it) whose model.mjs imports @trellis/stage.
 * Times of the pack and the install are printed.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { copyFile, cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import {
  fixtureImagesDir,
  LABELS_PATH,
  MOBILENET_PATH,
  makeSeedRepository,
  removeDir,
  repoRoot,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const run = promisify(execFile);

/** Every public package, by folder; @trellis/testing (and deploy) stay private. */
const PUBLIC = [
  "packages/stage",
  "packages/protocol",
  "packages/kserve",
  "packages/frontends",
  "packages/runtime",
  "packages/model-repository",
  "packages/ensemble-runner",
  "packages/preprocess",
  "packages/postprocess",
  "packages/inference-onnx",
  "packages/inference-trt-bridge",
  "packages/backend-python",
  "apps/client",
  "apps/server",
  "tooling",
];

/** This process's environment without what pnpm sets for the scripts it runs (npm would read npm_config_*). */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/^(npm_|pnpm_|PNPM_)/i.test(k)) env[k] = v;
  }
  return { ...env, ...extra };
}

const seconds = (since: number) => ((performance.now() - since) / 1000).toFixed(1);

let work: string;
let project: string;
let tarballs: string[] = [];
let installOutput = "";

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), "trellis-consumer-"));
  const packed = join(work, "tarballs");
  await mkdir(packed);
  let t = performance.now();
  for (const dir of PUBLIC) {
    await run("pnpm", ["pack", "--pack-destination", packed], { cwd: join(repoRoot, dir), env: process.env });
  }
  tarballs = (await readdir(packed)).filter((f) => f.endsWith(".tgz")).map((f) => join(packed, f));
  console.log(`packed ${tarballs.length} packages in ${seconds(t)} s`);

  project = join(work, "project");
  await mkdir(project);
  await writeFile(
    join(project, "package.json"),
    `${JSON.stringify({ name: "consumer", private: true, type: "module" })}\n`,
  );
  t = performance.now();
  const { stdout, stderr } = await run(
    "npm",
    ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=warn", ...tarballs],
    {
      cwd: project,
      env: userEnv({ ONNXRUNTIME_NODE_INSTALL: "skip" }),
      maxBuffer: 64 * 1024 * 1024,
      timeout: 600_000,
    },
  );
  installOutput = `${stdout}\n${stderr}`;
  console.log(`npm install of the tarballs took ${seconds(t)} s\n${installOutput.trim()}`);
}, 900_000);

afterAll(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

/** The names of the files a tarball holds (without npm's package/ prefix). */
async function tarList(tarball: string): Promise<string[]> {
  const { stdout } = await run("tar", ["-tzf", tarball], { maxBuffer: 16 * 1024 * 1024 });
  return stdout
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => l.replace(/^package\//, ""));
}

/** Runs a root devDependency's CLI on each tarball in turn; returns "<tarball>: <its output>" for each that failed. */
async function lintEach(bin: "publint" | "attw", argv: (tarball: string) => string[]): Promise<string[]> {
  expect(tarballs).toHaveLength(PUBLIC.length);
  const failures: string[] = [];
  for (const tarball of tarballs) {
    try {
      await run(join(repoRoot, "node_modules", ".bin", bin), argv(tarball), { maxBuffer: 16 * 1024 * 1024 });
    } catch (error) {
      const { stdout = "", stderr = "" } = error as { stdout?: string; stderr?: string };
      failures.push(`${tarball}: ${stdout}${stderr}`);
    }
  }
  return failures;
}

describe("the packed packages", () => {
  it("holds every public package, each with LICENSE, README and no workspace: ranges", async () => {
    expect(tarballs).toHaveLength(PUBLIC.length);
    for (const tarball of tarballs) {
      const files = await tarList(tarball);
      expect(files, tarball).toContain("LICENSE");
      expect(files, tarball).toContain("README.md");
      // What the package runs, not its sources, tests or benchmarks.
      expect(
        files.filter((f) => /^(src|test|bench)\/|^dist\/bench\//.test(f)),
        tarball,
      ).toEqual([]);
      const { stdout } = await run("tar", ["-xzOf", tarball, "package/package.json"]);
      const pkg = JSON.parse(stdout);
      expect(pkg.private, tarball).toBeUndefined();
      expect(pkg.license).toBe("Apache-2.0");
      expect(pkg.engines).toEqual({ node: ">=20.19" });
      expect(stdout).not.toContain("workspace:");
    }
  });

  it("ships @trellis/protocol's .proto files", async () => {
    const protocol = tarballs.find((t) => t.includes("trellis-protocol-"));
    const files = await tarList(protocol as string);
    expect(files).toEqual(
      expect.arrayContaining(["proto/grpc_service.proto", "proto/health.proto", "proto/model_config.proto"]),
    );
    const installed = join(project, "node_modules", "@trellis", "protocol", "proto", "grpc_service.proto");
    expect(await readFile(installed, "utf8")).toContain("service GRPCInferenceService");
  });

  it("installs with a plain npm install, with no engine warning on this Node", () => {
    expect(installOutput).not.toContain("EBADENGINE");
    for (const name of ["server", "client", "stage", "preprocess", "inference-onnx", "postprocess"]) {
      expect(existsSync(join(project, "node_modules", "@trellis", name, "package.json")), name).toBe(true);
    }
  });

  // The packaging linters, on the tarballs exactly as published (root devDependencies, run as their CLIs).
  it("passes publint --strict on every tarball (warnings count as errors)", async () => {
    const failures = await lintEach("publint", (tarball) => ["run", tarball, "--strict"]);
    expect(failures).toEqual([]);
  }, 300_000);

  it("passes attw (Are the Types Wrong) on every tarball, esm-only profile", async () => {
    // esm-only: the packages are ESM only, so attw ignores the node10 and node16-from-CJS resolutions
    // (a require() of an ESM package); every other problem (types missing, masquerading, unresolved) fails.
    const failures = await lintEach("attw", (tarball) => [
      tarball,
      "--profile",
      "esm-only",
      "--no-definitely-typed",
      "--no-color",
    ]);
    expect(failures).toEqual([]);
  }, 600_000);
});

/**
 * (a): a user's own pipeline from the three stage packages, no server, written as the 0.1 READMEs
 * showed (createOnnxStage with a config object and a model folder, createPreprocess used without
 * await, createPostprocess with labels): it must keep running unchanged.
 */
const CLASSIFY = `import { readFile } from "node:fs/promises";
import { createOnnxStage } from "@trellis/inference-onnx";
import { createPostprocess } from "@trellis/postprocess";
import { createPreprocess } from "@trellis/preprocess";
import { parseModelConfig } from "@trellis/protocol";
import { bytesTensor, bytesToStrings } from "@trellis/stage";

const [image, modelDir, labelsFile] = process.argv.slice(2);
const preprocess = createPreprocess({ mode: "seed" });
const config = parseModelConfig('name: "mobilenet"\\nbackend: "onnxruntime"\\nmax_batch_size: 8');
const inference = await createOnnxStage({ config, modelDir, version: "1" });
const postprocess = await createPostprocess({
  config: parseModelConfig(\`name: "postprocess"
max_batch_size: 8
input [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 1000 ] } ]
output [ { name: "OUTPUT_RESULTS" data_type: TYPE_STRING dims: [ 1 ] } ]\`),
  labels: (await readFile(labelsFile, "utf8")).split("\\n"),
});
const pixels = await preprocess.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [await readFile(image)])] });
const logits = await inference.infer({ inputs: [{ ...pixels.outputs[0], name: "input" }] });
const results = await postprocess.infer({ inputs: [{ ...logits.outputs[0], name: "LOGITS" }] });
console.log(bytesToStrings(results.outputs[0])[0]);
await Promise.all([preprocess.close(), inference.close(), postprocess.close()]);
`;

describe("(a) a 0.1-era script: createPreprocess → createOnnxStage → createPostprocess", () => {
  it("classifies chelsea.jpg as Egyptian cat with the bundled MobileNetV2", async () => {
    const modelDir = join(project, "mobilenet");
    await mkdir(join(modelDir, "1"), { recursive: true });
    await copyFile(MOBILENET_PATH, join(modelDir, "1", "model.onnx"));
    // The labels as that era's users had them (the seed's imagenet_classes.txt): no final newline,
    // which the script's split("\\n") relies on.
    await writeFile(join(project, "labels.txt"), (await readFile(LABELS_PATH, "utf8")).trimEnd());
    await writeFile(join(project, "classify.mjs"), CLASSIFY);
    const t = performance.now();
    const { stdout } = await run(
      process.execPath,
      ["classify.mjs", join(fixtureImagesDir, "chelsea.jpg"), modelDir, "labels.txt"],
      { cwd: project, env: userEnv(), timeout: 120_000 },
    );
    console.log(`(a) ${seconds(t)} s: ${stdout.trim()}`);
    const answer = JSON.parse(stdout.trim());
    expect(answer.top5_labels[0]).toBe("Egyptian cat");
    expect(answer.top5_probs[0]).toBeGreaterThan(0.5);
  });
});

/** (b): a repository outside any project: model.mjs imports @trellis/stage by name. */
const TRIPLER = `import { defineStage } from "@trellis/stage";
export function createStage({ config, version }) {
  return defineStage({ config, version, compute: (request) => [
    { name: "OUT", datatype: "FP32", shape: request.inputs[0].shape, data: Float32Array.from(request.inputs[0].data, (v) => v * 3) },
  ] });
}
`;
const TRIPLER_CONFIG = `name: "tripler"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
`;

/** Starts `bin` and resolves with its HTTP port once it logs "server started". */
function startBin(
  bin: string,
  args: string[],
  cwd: string,
): Promise<{ proc: ChildProcess; http: number; grpc: number }> {
  const proc = spawn(bin, args, { cwd, env: userEnv(), stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (d) => {
    stderr += String(d);
  });
  return new Promise((resolve, reject) => {
    let http = 0;
    let grpc = 0;
    const timer = setTimeout(() => reject(new Error(`no "server started" within 60 s:\n${stderr}`)), 60_000);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`trellis-server exited with ${code}:\n${stderr}`));
    });
    createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on("line", (line) => {
      let entry: Record<string, unknown>;
      try {
        entry = JSON.parse(line);
      } catch {
        return;
      }
      if (entry.msg === "listening" && entry.protocol === "http") http = entry.port as number;
      if (entry.msg === "listening" && entry.protocol === "grpc") grpc = entry.port as number;
      if (entry.msg === "server started") {
        clearTimeout(timer);
        resolve({ proc, http, grpc });
      }
    });
  });
}

describe("(b) the installed trellis-server", () => {
  it("serves a repository whose model.mjs imports @trellis/stage, no node_modules beside it", async () => {
    const repo = await mkdtemp(join(tmpdir(), "trellis-consumer-repo-"));
    try {
      for (let dir = repo; dir !== dirname(dir); dir = dirname(dir)) {
        expect(existsSync(join(dir, "node_modules")), dir).toBe(false);
      }
      await mkdir(join(repo, "tripler", "1"), { recursive: true });
      await writeFile(join(repo, "tripler", "config.pbtxt"), TRIPLER_CONFIG);
      await writeFile(join(repo, "tripler", "1", "model.mjs"), TRIPLER);
      const bin = join(project, "node_modules", ".bin", "trellis-server");
      const ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--no-fetch-models"];
      const t = performance.now();
      const { proc, http } = await startBin(bin, ["--model-repository", repo, ...ports], repo);
      try {
        console.log(`(b) trellis-server started in ${seconds(t)} s`);
        expect((await fetch(`http://127.0.0.1:${http}/v2/models/tripler/ready`)).status).toBe(200);
        const res = await fetch(`http://127.0.0.1:${http}/v2/models/tripler/infer`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ inputs: [{ name: "IN", datatype: "FP32", shape: [2], data: [1.5, -2] }] }),
        });
        expect(res.status).toBe(200);
        const answer = (await res.json()) as { outputs: { name: string; data: number[] }[] };
        console.log(`(b) tripler answered ${JSON.stringify(answer.outputs)}`);
        expect(answer.outputs[0]).toMatchObject({ name: "OUT", data: [4.5, -6] });
      } finally {
        const exited = new Promise((resolve) => proc.once("exit", resolve));
        proc.kill("SIGTERM");
        expect(await exited).toBe(0);
      }
    } finally {
      await rm(repo, { recursive: true, force: true });
    }
  });

  it("the installed trellis-client bin runs", async () => {
    const { stdout } = await run(join(project, "node_modules", ".bin", "trellis-client"), ["--help"], {
      env: userEnv(),
    });
    expect(stdout).toContain("Usage");
  });
});

/**
 * (c) The documentation's code, verbatim: the root README's "Use as a library" blocks and each
 * library package README's first `js` block, run as ES modules in the scratch project beside
 * chelsea.jpg, the shared MobileNetV2 (mobilenetv2-12-int8.onnx), its labels
 * (imagenet_classes.txt) and the seed repository (models/). The TensorRT bridge's example
 * reaches the installed trellis-server, standing in for a Triton, through TRITON_GRPC.
 */
function jsBlocks(markdown: string, section?: string): string[] {
  let text = markdown;
  if (section) {
    const start = text.indexOf(`## ${section}\n`);
    expect(start, `section "${section}"`).toBeGreaterThanOrEqual(0);
    const end = text.indexOf("\n## ", start + 3);
    text = text.slice(start, end < 0 ? undefined : end);
  }
  return [...text.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1] as string);
}

const readme = (dir: string) => readFile(join(repoRoot, dir, "README.md"), "utf8");

/** The first `js` block of each library package's README, and what its run must print. */
const PACKAGE_EXAMPLES: [string, RegExp][] = [
  ["packages/preprocess", /^FP32 \[ 1, 3, 224, 224 \]$/m],
  ["packages/inference-onnx", /^output \[ 1, 1000 \]$/m],
  ["packages/postprocess", /^\{"top3_labels": \["Egyptian cat", /m],
  ["packages/ensemble-runner", /^OUT Float32Array\(4\) \[ 6, 12, 18, 24 \]$/m],
  ["packages/model-repository", /'Egyptian cat'/],
  ["packages/inference-trt-bridge", /^\[ 1, 1000 \]$/m],
];

const TRT_STAND_IN = `name: "resnet50_trt"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 1000 ] } ]
`;

describe("(c) the READMEs' library examples, verbatim", () => {
  let examples: string;
  beforeAll(async () => {
    examples = join(project, "examples");
    await mkdir(examples);
    await copyFile(MOBILENET_PATH, join(examples, "mobilenetv2-12-int8.onnx"));
    await copyFile(LABELS_PATH, join(examples, "imagenet_classes.txt"));
    await copyFile(join(fixtureImagesDir, "chelsea.jpg"), join(examples, "chelsea.jpg"));
    const seed = await makeSeedRepository({ prefix: "trellis-consumer-seed-" });
    await cp(seed, join(examples, "models"), { recursive: true });
    await removeDir(seed);
  });

  const runExample = async (file: string, code: string, env: Record<string, string> = {}) => {
    await writeFile(join(examples, file), code);
    const t = performance.now();
    const { stdout } = await run(process.execPath, [file], { cwd: examples, env: userEnv(env), timeout: 120_000 });
    console.log(`(c) ${file} ran in ${seconds(t)} s:\n${stdout.trim()}`);
    return stdout;
  };

  it("runs the root README's library section: a pipeline and loadModel, both classifying chelsea.jpg", async () => {
    const blocks = jsBlocks(await readFile(join(repoRoot, "README.md"), "utf8"), "Use as a library");
    expect(blocks).toHaveLength(2);
    // At most 20 lines of code in the section.
    expect(
      blocks
        .join("")
        .split("\n")
        .filter((l) => l.trim() !== "").length,
    ).toBeLessThanOrEqual(20);
    expect(await runExample("readme-pipeline.mjs", blocks[0]!)).toMatch(/^Egyptian cat 0\.\d+$/m);
    expect(await runExample("readme-load-model.mjs", blocks[1]!)).toMatch(/^Egyptian cat$/m);
  });

  for (const [dir, expected] of PACKAGE_EXAMPLES) {
    it(`runs ${dir}'s README example`, async () => {
      const [code] = jsBlocks(await readme(dir));
      expect(code, `${dir}/README.md has a js block`).toBeDefined();
      const name = `${dir.split("/").at(-1)}.mjs`;
      if (!dir.endsWith("inference-trt-bridge")) {
        expect(await runExample(name, code!)).toMatch(expected);
        return;
      }
      // The bridge's remote: the installed trellis-server serving the model as a Triton would.
      const repo = await mkdtemp(join(tmpdir(), "trellis-consumer-trt-"));
      try {
        await mkdir(join(repo, "resnet50_trt", "1"), { recursive: true });
        await writeFile(join(repo, "resnet50_trt", "config.pbtxt"), TRT_STAND_IN);
        await copyFile(MOBILENET_PATH, join(repo, "resnet50_trt", "1", "model.onnx"));
        const bin = join(project, "node_modules", ".bin", "trellis-server");
        const ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--no-fetch-models"];
        const { proc, grpc } = await startBin(bin, ["--model-repository", repo, ...ports], repo);
        try {
          const out = await runExample(name, code!, { TRITON_GRPC: `http://127.0.0.1:${grpc}` });
          expect(out).toMatch(expected);
        } finally {
          const exited = new Promise((resolve) => proc.once("exit", resolve));
          proc.kill("SIGTERM");
          await exited;
        }
      } finally {
        await rm(repo, { recursive: true, force: true });
      }
    });
  }
});
