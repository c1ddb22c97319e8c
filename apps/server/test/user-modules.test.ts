/**
 * A user's model.mjs imports `@trellis/stage` by its bare name from a repository with no
 * node_modules anywhere above it (a temp folder), as Triton supplies triton_python_backend_utils
 * to every Python model: the server resolves `@trellis/*` to its own copies, on the main thread
 * and in worker-thread instances. Other bare names stay the user's business: a package the
 * server happens to depend on (commander) is not lent to user models.
 */
import { tmpdir } from "node:os";
import { join } from "node:path";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRepository, postJson } from "./helpers.js";

/** OUT = IN * 3; the module imports the contract and its backend entry by their bare names. */
const TRIPLER = `import { defineStage, StageError, Code } from "@trellis/stage";
import { float32ToFloat16Bits } from "@trellis/stage/backend";
export function createStage({ config, version }) {
  if (float32ToFloat16Bits(1) !== 0x3c00) throw new Error("no @trellis/stage/backend");
  return defineStage({ config, version, compute(request) {
    const input = request.inputs[0];
    if (input.data[0] < 0) throw new StageError(Code.InvalidArgument, config.name, "IN must not be negative");
    return [{ name: "OUT", datatype: "FP32", shape: input.shape, data: Float32Array.from(input.data, (v) => v * 3) }];
  } });
}
`;

const config = (name: string, extra = "") => `name: "${name}"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
${extra}`;

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    tripler: { config: config("tripler"), files: { "1/model.mjs": TRIPLER } },
    tripler_threads: {
      config: config(
        "tripler_threads",
        `instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "worker_threads" value: { string_value: "true" } }`,
      ),
      files: { "1/model.mjs": TRIPLER },
    },
    borrower: {
      config: config("borrower"),
      files: { "1/model.mjs": `import { Command } from "commander";\nexport default () => new Command();\n` },
    },
  });
  const explicit = ["--model-control-mode", "explicit", "--load-model", "tripler", "--load-model", "tripler_threads"];
  server = await startServerProcess(["--model-repository", repo, ...explicit], { cwd: tmpdir() });
}, 120_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const infer = (model: string, data: number[]) =>
  postJson(`${server.http}/v2/models/${model}/infer`, { inputs: [{ name: "IN", datatype: "FP32", shape: [2], data }] });

describe("user models import @trellis/* by bare name", () => {
  it("the repository has no node_modules above it", async () => {
    const { existsSync } = await import("node:fs");
    let dir = repo;
    for (;;) {
      expect(existsSync(join(dir, "node_modules"))).toBe(false);
      const up = join(dir, "..");
      if (up === dir) break;
      dir = up;
    }
  });

  it("serves a model.mjs that imports @trellis/stage and @trellis/stage/backend", async () => {
    const res = await infer("tripler", [1.5, -0.5]);
    expect(res.status).toBe(200);
    expect(res.json.outputs[0].data).toEqual([4.5, -1.5]);
  });

  it("serves it in worker-thread instances too", async () => {
    const res = await infer("tripler_threads", [2, 4]);
    expect(res.status).toBe(200);
    expect(res.json.outputs[0].data).toEqual([6, 12]);
  });

  it("a StageError from the user's module is the server's own StageError (one copy of the contract)", async () => {
    const res = await infer("tripler", [-1, 0]);
    expect(res.status).toBe(400);
    expect(res.json.error).toContain("IN must not be negative");
  });

  it("lends only @trellis/* packages: another bare name fails the load, naming the package", async () => {
    const failed = await postJson(`${server.http}/v2/repository/models/borrower/load`, {});
    expect(failed.status).toBe(400);
    expect(failed.json.error).toContain("borrower");
    expect(failed.json.error).toContain("Cannot find package 'commander'");
    expect((await fetch(`${server.http}/v2/models/borrower/ready`)).status).not.toBe(200);
    expect((await fetch(`${server.http}/v2/models/tripler/ready`)).status).toBe(200);
  });
});
