/**
 * scripts/gpu-acceptance.sh, where the GPU end-to-end run cannot happen: it lists every missing
 * piece and exits 2 without building or starting anything. PATH is set so the result does not
 * depend on the machine the test runs on.
 */
import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const script = join(import.meta.dirname, "..", "..", "scripts", "gpu-acceptance.sh");
const empty = await mkdtemp(join(tmpdir(), "gpu-acceptance-path-"));
afterAll(() => rm(empty, { recursive: true, force: true }));

async function runScript(path: string, args: string[] = []) {
  try {
    const { stdout, stderr } = await promisify(execFile)("/bin/bash", [script, ...args], {
      env: { PATH: path, HOME: empty },
      timeout: 30_000,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe("scripts/gpu-acceptance.sh without a GPU", () => {
  it("says plainly what is missing, every piece, and exits 2 having run nothing", async () => {
    const out = await runScript(empty);
    expect(out.code).toBe(2);
    expect(out.stdout).toBe("");
    expect(out.stderr).toContain("gpu-acceptance: cannot run the GPU end-to-end check here; missing:");
    expect(out.stderr).toContain("- no NVIDIA GPU: nvidia-smi is not on PATH (the NVIDIA driver is not installed)");
    expect(out.stderr).toContain("- no Docker: docker is not on PATH");
    expect(out.stderr).toContain("- node (Node 20) is not on PATH");
    expect(out.stderr).toContain("- pnpm is not on PATH");
    expect(out.stderr).toContain("Nothing was built or started.");
  });

  it("finds what is there: with node on PATH only the rest is listed", async () => {
    const out = await runScript(dirname(process.execPath));
    expect(out.code).toBe(2);
    expect(out.stderr).not.toContain("node (Node 20) is not on PATH");
    expect(out.stderr).toContain("- no NVIDIA GPU: nvidia-smi is not on PATH");
  });

  it("refuses an unknown workflow or argument before checking anything", async () => {
    const bad = await runScript(empty, ["--workflows", "trtexec,onnx-magic"]);
    expect(bad.code).toBe(64);
    expect(bad.stderr).toContain("gpu-acceptance: unknown workflow onnx-magic (trtexec, torch-trt, tf-trt)");
    const arg = await runScript(empty, ["--fast"]);
    expect(arg.code).toBe(64);
    expect(arg.stderr).toContain("gpu-acceptance: unknown argument --fast");
  });
});
