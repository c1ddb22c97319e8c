/**
 * The CLIs as pnpm 12 runs them: `pnpm models:synth -- --seed 7` passes the `--` through to
 * the script, which must read the options after it as options, not as positional arguments.
 */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { scriptArgv } from "../src/argv.js";

const run = promisify(execFile);
const dist = join(import.meta.dirname, "..", "dist");

async function cli(script: string, args: string[]): Promise<{ code: number; stderr: string }> {
  try {
    const { stderr } = await run(process.execPath, [join(dist, script), ...args], { timeout: 60_000 });
    return { code: 0, stderr };
  } catch (err) {
    const e = err as { code: number; stderr: string };
    return { code: e.code, stderr: e.stderr };
  }
}

describe("tooling CLIs under pnpm 12", () => {
  it("read options after a leading --, as pnpm 12 passes them", async () => {
    // A seed that is not a number is refused by the option's own check, so nothing is written.
    for (const args of [
      ["--", "--seed", "x"],
      ["--seed", "x"],
    ]) {
      const out = await cli("synth-resnet50.js", args);
      expect(out.code).toBe(1);
      expect(out.stderr).toContain("--seed must be an integer, got x");
      expect(out.stderr).not.toContain("too many arguments");
    }
    const fetch = await cli("fetch-models.js", ["--", "--no-such-flag"]);
    expect(fetch.code).toBe(1);
    expect(fetch.stderr).toContain("unknown option '--no-such-flag'");
    const quantize = await cli("quantize-cli.js", [
      "--",
      "--model",
      "m.onnx",
      "--calibration",
      "c",
      "--percentile",
      "20",
    ]);
    expect(quantize.code).toBe(1);
    expect(quantize.stderr).toContain("--percentile must be in (50, 100], got 20");
    const dequantize = await cli("dequantize-cli.js", ["--", "--model", "m.onnx"]);
    expect(dequantize.code).toBe(1);
    expect(dequantize.stderr).toContain("required option '--out <file>' not specified");
  });

  it("keeps a -- that is not the first argument", () => {
    expect(scriptArgv(["node", "s.js", "--", "--seed", "7"])).toEqual(["node", "s.js", "--seed", "7"]);
    expect(scriptArgv(["node", "s.js", "--seed", "7", "--", "x"])).toEqual(["node", "s.js", "--seed", "7", "--", "x"]);
  });
});
