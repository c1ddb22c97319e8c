/**
 * The model runtime, black-box through the server: a plain model.mjs stage gets what Triton's
 * core gives every backend: the dynamic batcher (concurrent requests reach compute as merged
 * batches, answers split back per request), the request checks against config.pbtxt (refused
 * with Triton's words before compute runs), instance_group's count (N computes at once, no
 * more), and statistics counted once, executions as batches.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf, jsonOf, makeRepository, postJson } from "./helpers.js";

// The repository is a temporary folder without node_modules: @trellis/stage by its resolved URL.
const STAGE = import.meta.resolve("@trellis/stage");

/**
 * OUTPUT = INPUT; BATCH = the batch size of the compute call that answered (per row); CALL = that
 * call's number (1, 2, ...); PEAK = the most computes running at once during it. A request with
 * parameter `pair` waits (up to 1.5 s) for a second compute to be running before it answers.
 */
const COUNTER = `import { defineStage } from "${STAGE}";
export function createStage({ config, version }) {
  let calls = 0;
  let running = 0;
  return defineStage({ config, version, async compute(request) {
    const call = ++calls;
    running++;
    let peak = running;
    try {
      if (request.parameters?.pair) {
        for (let waited = 0; running < 2 && waited < 1500; waited += 10) await new Promise((r) => setTimeout(r, 10));
        peak = Math.max(peak, running);
      }
      await new Promise((r) => setTimeout(r, 20));
      const input = request.inputs[0];
      const n = input.shape[0];
      const rows = (v) => Int32Array.from({ length: n }, () => v);
      return [
        { name: "OUTPUT", datatype: "FP32", shape: input.shape, data: input.data },
        { name: "BATCH", datatype: "INT32", shape: [n, 1], data: rows(n) },
        { name: "CALL", datatype: "INT32", shape: [n, 1], data: rows(call) },
        { name: "PEAK", datatype: "INT32", shape: [n, 1], data: rows(peak) },
      ];
    } finally {
      running--;
    }
  } });
}
`;

const config = (name: string, extra: string) => `name: "${name}"
backend: "typescript"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CALL" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PEAK" data_type: TYPE_INT32 dims: [ 1 ] }
]
${extra}
`;

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    batched: {
      config: config(
        "batched",
        "dynamic_batching { max_queue_delay_microseconds: 300000 }\ninstance_group [ { count: 1 kind: KIND_CPU } ]",
      ),
      files: { "1/model.mjs": COUNTER },
    },
    pair: {
      config: config("pair", "instance_group [ { count: 2 kind: KIND_CPU } ]"),
      files: { "1/model.mjs": COUNTER },
    },
    single: {
      config: config("single", "instance_group [ { count: 1 kind: KIND_CPU } ]"),
      files: { "1/model.mjs": COUNTER },
    },
  });
  server = await startServerProcess(["--model-repository", repo]);
}, 60_000);
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

type Output = { name: string; data: number[] };
const infer = (model: string, rows: number[][], parameters?: Record<string, unknown>) =>
  postJson(`${server.http}/v2/models/${model}/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [rows.length, 4], data: rows.flat() }],
    ...(parameters ? { parameters } : {}),
  });
const out = (json: { outputs: Output[] }, name: string) => json.outputs.find((o) => o.name === name)?.data ?? [];
const stats = async (model: string) =>
  (await jsonOf(await fetch(`${server.http}/v2/models/${model}/stats`))).model_stats[0];
/** The number of the next compute call of `model` minus one: what CALL says for a fresh request, less 1. */
const callsSoFar = async (model: string) => (out((await infer(model, [[0, 0, 0, 0]])).json, "CALL")[0] ?? 0) - 1;

describe("the model runtime around a model.mjs stage", () => {
  it("merges concurrent requests into batches under dynamic_batching and splits the answers back", async () => {
    const before = await stats("batched");
    const requests = Array.from({ length: 8 }, (_, i) => [i, i + 0.5, -i - 1, 100 + i]);
    const answers = await Promise.all(requests.map((row) => infer("batched", [row])));
    expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
    // Each client got its own row back.
    expect(answers.map((a) => out(a.json, "OUTPUT"))).toEqual(requests);
    // Fewer compute calls than requests, whose batch sizes add up to the requests.
    const calls = new Map<number, number>();
    for (const a of answers) calls.set(out(a.json, "CALL")[0]!, out(a.json, "BATCH")[0]!);
    expect(calls.size).toBeLessThan(8);
    expect([...calls.values()].reduce((n, b) => n + b, 0)).toBe(8);

    // Statistics count each request once, each merged batch as one execution (as Triton's).
    const after = await stats("batched");
    expect(after.inference_count - before.inference_count).toBe(8);
    expect(after.execution_count - before.execution_count).toBe(calls.size);
    expect(after.inference_stats.success.count - before.inference_stats.success.count).toBe(8);
  }, 30_000);

  const bad = [
    {
      what: "INT32 for a TYPE_FP32 input",
      input: { name: "INPUT", datatype: "INT32", shape: [1, 4], data: [1, 2, 3, 4] },
      message: "inference input 'INPUT' data-type is 'INT32', but model 'single' expects 'FP32'",
    },
    {
      what: "dims [1,3] for [4]",
      input: { name: "INPUT", datatype: "FP32", shape: [1, 3], data: [1, 2, 3] },
      message: "unexpected shape for input 'INPUT' for model 'single'. Expected [-1,4], got [1,3].",
    },
    {
      what: "batch 9 with max_batch_size 8",
      input: { name: "INPUT", datatype: "FP32", shape: [9, 4], data: Array(36).fill(1) },
      message: "inference request batch-size must be <= 8 for 'single'",
    },
  ];

  it("refuses the three bad requests with Triton's words over HTTP and gRPC, before compute runs", async () => {
    const calls = await callsSoFar("single");
    const failedBefore = (await stats("single")).inference_stats.fail.count;
    const grpc = grpcClientOf(server);
    for (const b of bad) {
      const http = await postJson(`${server.http}/v2/models/single/infer`, { inputs: [b.input] });
      expect([b.what, http.status]).toEqual([b.what, 400]);
      expect(http.json.error).toContain(b.message);
      const raw =
        b.input.datatype === "INT32"
          ? new Uint8Array(Int32Array.from(b.input.data).buffer)
          : new Uint8Array(Float32Array.from(b.input.data).buffer);
      const err = await grpc
        .modelInfer(
          create(ModelInferRequestSchema, {
            modelName: "single",
            inputs: [{ name: "INPUT", datatype: b.input.datatype, shape: b.input.shape.map(BigInt) }],
            rawInputContents: [raw],
          }),
        )
        .then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
      expect([b.what, err?.code]).toEqual([b.what, Code.InvalidArgument]);
      expect(err?.rawMessage).toContain(b.message);
    }
    // compute never ran for them: the next request is the very next call.
    expect(await callsSoFar("single")).toBe(calls + 1);
    expect((await stats("single")).inference_stats.fail.count - failedBefore).toBe(6);
  }, 30_000);

  it("runs instance_group count: 2 as two computes at once, and count: 1 as one at a time", async () => {
    const pair = await Promise.all([
      infer("pair", [[1, 1, 1, 1]], { pair: true }),
      infer("pair", [[2, 2, 2, 2]], { pair: true }),
    ]);
    expect(pair.map((a) => a.status)).toEqual([200, 200]);
    expect(pair.map((a) => out(a.json, "PEAK")[0])).toEqual([2, 2]);
    const single = await Promise.all([
      infer("single", [[1, 1, 1, 1]], { pair: true }),
      infer("single", [[2, 2, 2, 2]], { pair: true }),
    ]);
    expect(single.map((a) => a.status)).toEqual([200, 200]);
    expect(single.map((a) => out(a.json, "PEAK")[0])).toEqual([1, 1]);
  }, 30_000);
});
