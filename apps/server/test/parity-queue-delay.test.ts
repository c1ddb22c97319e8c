/**
 * Triton's dynamic batcher (core src/dynamic_batch_scheduler.cc): a batch short of a preferred
 * size waits up to max_queue_delay_microseconds for more requests, even with its instance idle,
 * and the requests waiting count toward the queue policy's max_queue_size. So with a delay of
 * 1 s, preferred_batch_size [8] and max_queue_size 1, a lone request is held in the queue, and
 * another arriving meanwhile is refused UNAVAILABLE / 503 "Exceeds maximum queue size" (core
 * src/scheduler_utils.cc). With the parameter dynamic_batching_strategy "eager" (Trellis's
 * own), an idle instance takes the request at once. The models are ONNX identities built here.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf, makeRepository, metricValue, postJson, scrape } from "./helpers.js";

const config = (name: string, extra = "") => `name: "${name}"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "X_out" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 1000000
  preferred_batch_size: [ 8 ]
  default_queue_policy { max_queue_size: 1 }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
${extra}`;

const onnx = { "1/model.onnx": identityModel([{ name: "X", type: "float32", shape: ["N", 1] }]) };
let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    held: { config: config("held"), files: onnx },
    eager: {
      config: config("eager", `parameters { key: "dynamic_batching_strategy" value: { string_value: "eager" } }`),
      files: onnx,
    },
  });
  server = await startServerProcess(["--model-repository", repo]);
});

afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

const body = (v: number) => ({ inputs: [{ name: "X", datatype: "FP32", shape: [1, 1], data: [v] }] });
const infer = (model: string, v: number) => postJson(`${server.http}/v2/models/${model}/infer`, body(v));

/** Waits until `model` holds `n` requests pending (a state, read from the metrics; the cap is a hang guard). */
async function pending(model: string, n: number): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (metricValue(await scrape(server), "nv_inference_pending_request_count", model) === n) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`${model} never held ${n} pending`);
}

async function statistics(model: string) {
  const res = await fetch(`${server.http}/v2/models/${model}/stats`);
  type Count = { count: number };
  type Stats = { execution_count: number; inference_stats: { success: Count; fail: Count } };
  const stats = ((await res.json()) as { model_stats: Stats[] }).model_stats[0]!;
  return {
    success: stats.inference_stats.success.count,
    fail: stats.inference_stats.fail.count,
    executions: stats.execution_count,
  };
}

describe("dynamic batching with a queue delay and preferred sizes, as Triton's", () => {
  it("holds a lone request in the queue up to the delay, and refuses another meanwhile over HTTP and gRPC", async () => {
    const first = infer("held", 1);
    // Held, not running: its instance is idle, but a batch of 1 is short of the preferred 8.
    await pending("held", 1);
    const http = await infer("held", 2);
    expect(http.status).toBe(503);
    // Triton: "[request id: <id_unknown>] Exceeds maximum queue size"; ours names the model and the bound (docs/triton-parity.md).
    expect(http.json.error).toMatch(/^held: Exceeds maximum queue size: 1 requests already queued/);
    const grpc = await grpcClientOf(server)
      .modelInfer({
        modelName: "held",
        inputs: [{ name: "X", datatype: "FP32", shape: [1n, 1n] }],
        rawInputContents: [new Uint8Array(Float32Array.of(3).buffer)],
      })
      .then(
        () => undefined,
        (err: unknown) => ConnectError.from(err),
      );
    expect(grpc?.code).toBe(Code.Unavailable);
    expect(grpc?.rawMessage).toMatch(/^held: Exceeds maximum queue size/);
    // The held one runs once its delay is over, alone.
    const answer = await first;
    expect(answer.status).toBe(200);
    expect(answer.json.outputs[0].data).toEqual([1]);
    expect(await statistics("held")).toEqual({ success: 1, fail: 2, executions: 1 });
  });

  it('runs a lone request at once with dynamic_batching_strategy "eager", while the held model still holds its own', async () => {
    const held = infer("held", 1);
    await pending("held", 1);
    const eager = await infer("eager", 5);
    expect(eager.status).toBe(200);
    expect(eager.json.outputs[0].data).toEqual([5]);
    // Answered while "held"'s lone request still waits out its delay: "eager" did not wait.
    expect(metricValue(await scrape(server), "nv_inference_pending_request_count", "held")).toBe(1);
    expect((await held).status).toBe(200);
    expect(await statistics("eager")).toEqual({ success: 1, fail: 0, executions: 1 });
  });
});
