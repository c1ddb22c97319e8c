/**
 * Overload (issue 18 item 7), black-box: every model has a queue bound (its config's
 * max_queue_size, else the server's --default-max-queue-size), a full one is refused as
 * Triton refuses it (UNAVAILABLE over gRPC, 503 over HTTP, "Exceeds maximum queue size"),
 * and an ensemble refuses at its entry, before its first step decodes anything.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { frameBytes } from "@trellis/kserve/wire";
import {
  grpcJsInferenceClient,
  makeSeedRepository,
  modelsDir,
  type ReferenceTop5,
  readFixtureImage,
  readReferenceTensor,
  referenceTop5OnThisCpu,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { binaryResponse, echoConfig, floats, jsonOf, makeRepository, postBinary, postJson } from "./helpers.js";

const PHOTO = "chelsea.jpg";
const image = readFixtureImage(PHOTO);
const GRPC_UNAVAILABLE = 14;

/** How one request of a burst ended: answered (and checked) or refused, in the order they settled. */
interface Outcome {
  ok: boolean;
  /** HTTP status or gRPC code. */
  code: number;
  message: string;
  /** Client-side milliseconds from send to answer. */
  ms: number;
  /** Position among the burst's settled requests. */
  order: number;
}

/** Successful requests of a model so far, and failed ones (its statistics). */
async function counts(server: ServerProcess, model: string): Promise<{ success: number; fail: number }> {
  const { status, json } = await getJson(`${server.http}/v2/models/${model}/stats`);
  expect(status).toBe(200);
  const s = json.model_stats[0].inference_stats;
  return { success: Number(s.success.count), fail: Number(s.fail.count) };
}

// biome-ignore lint/suspicious/noExplicitAny: responses are inspected field by field
async function getJson(url: string): Promise<{ status: number; json: any }> {
  const res = await fetch(url);
  return { status: res.status, json: await res.json() };
}

/** Runs `calls` at once; each resolves its Outcome (never rejects). */
async function burst(calls: (() => Promise<Omit<Outcome, "ms" | "order">>)[]): Promise<Outcome[]> {
  let settled = 0;
  return Promise.all(
    calls.map(async (call) => {
      const t0 = performance.now();
      const r = await call();
      return { ...r, ms: performance.now() - t0, order: settled++ };
    }),
  );
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;

describe("an ensemble whose second step has max_queue_size 4 (preprocess, then a slow step)", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({
      resnet50_preprocess: { config: readFileSync(join(modelsDir, "resnet50_preprocess", "config.pbtxt"), "utf8") },
      // OUTPUT = 2 * INPUT, held delay_ms (a request parameter the ensemble hands every step).
      hold: {
        config: echoConfig("hold", {
          dims: [3, 224, 224],
          maxBatch: 256,
          params: { scale: "2" },
          extra: "dynamic_batching { default_queue_policy { max_queue_size: 4 } }",
        }),
      },
      guarded: {
        config: `name: "guarded"
platform: "ensemble"
max_batch_size: 256
input [ { name: "RAW_IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
ensemble_scheduling { step [
  { model_name: "resnet50_preprocess" model_version: -1 input_map { key: "RAW_IMAGE" value: "RAW_IMAGE" } output_map { key: "PREPROCESSED_IMAGE" value: "pixels" } },
  { model_name: "hold" model_version: -1 input_map { key: "INPUT" value: "pixels" } output_map { key: "OUTPUT" value: "OUT" } }
] }
`,
      },
    });
    server = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  /** OUT must be twice the reference preprocessing of the photo. */
  const checkOut = (out: Float32Array) => {
    const want = readReferenceTensor(PHOTO);
    expect(out.length).toBe(want.length);
    let maxDiff = 0;
    for (let i = 0; i < want.length; i++) maxDiff = Math.max(maxDiff, Math.abs(out[i]! - 2 * want[i]!));
    expect(maxDiff).toBeLessThan(0.1);
  };

  const viaHttp = (delayMs: number) => async () => {
    const res = await postBinary(
      `${server.http}/v2/models/guarded/infer`,
      {
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
        outputs: [{ name: "OUT", parameters: { binary_data: true } }],
        parameters: { delay_ms: delayMs },
      },
      [frameBytes([image])],
    );
    if (res.status !== 200) return { ok: false, code: res.status, message: String((await jsonOf(res)).error) };
    const { json, outputs } = await binaryResponse(res);
    expect(json.outputs[0]).toMatchObject({ name: "OUT", datatype: "FP32", shape: [1, 3, 224, 224] });
    checkOut(floats(outputs.get("OUT") as Uint8Array));
    return { ok: true, code: 200, message: "" };
  };

  it("admits at most 4 of 60 concurrent requests; the others are refused at the entry, undecoded, as Triton refuses a full queue", async () => {
    const grpc = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    const viaGrpc = (delayMs: number) => async () => {
      try {
        const res = await grpc.modelInfer({
          model_name: "guarded",
          inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
          parameters: { delay_ms: { int64_param: delayMs } },
          raw_input_contents: [Buffer.from(frameBytes([image]))],
        });
        expect(res.outputs[0]).toMatchObject({ name: "OUT", datatype: "FP32", shape: [1, 3, 224, 224] });
        checkOut(floats(new Uint8Array(res.raw_output_contents[0] as Buffer)));
        return { ok: true, code: 0, message: "" };
      } catch (err) {
        const e = err as { code: number; details: string };
        return { ok: false, code: e.code, message: e.details };
      }
    };
    try {
      // Admitted requests hold their place 10 s: the rest of the burst arrives long before.
      const calls = Array.from({ length: 60 }, (_, i) => (i % 2 === 0 ? viaHttp(10_000) : viaGrpc(10_000)));
      const outcomes = await burst(calls);
      const admitted = outcomes.filter((o) => o.ok);
      const refused = outcomes.filter((o) => !o.ok);
      expect(admitted.length).toBe(4);
      expect(refused.length).toBe(56);
      for (const r of refused) {
        // Triton's answer to a full queue: UNAVAILABLE over gRPC, 503 over HTTP.
        expect([503, GRPC_UNAVAILABLE]).toContain(r.code);
        expect(r.message).toMatch(/Exceeds maximum queue size/);
        expect(r.message).toMatch(/\bguarded\b/);
        expect(r.message).toMatch(/\bhold\b/);
        expect(r.message).toMatch(/\b4\b/);
        expect(r.message).not.toMatch(/\/tmp|127\.0\.0\.1|node_modules|dist\//);
      }
      // Whichever 4 came first were admitted: each protocol's 30 saw at least 26 refused.
      expect(refused.filter((r) => r.code === 503).length).toBeGreaterThanOrEqual(26);
      expect(refused.filter((r) => r.code === GRPC_UNAVAILABLE).length).toBeGreaterThanOrEqual(26);
      // Every refusal came back while the admitted requests were still held.
      expect(Math.max(...refused.map((r) => r.order))).toBeLessThan(Math.min(...admitted.map((a) => a.order)));
      // The refused were never decoded: preprocess saw exactly the admitted requests.
      expect(await counts(server, "resnet50_preprocess")).toEqual({ success: 4, fail: 0 });
      expect(await counts(server, "hold")).toEqual({ success: 4, fail: 0 });
      expect(await counts(server, "guarded")).toEqual({ success: 4, fail: 56 });
      const ms = refused.map((r) => r.ms);
      console.log(
        `overload: ${refused.length} refused of ${outcomes.length}; refused answered in p50 ${median(ms).toFixed(1)} ms, max ${Math.max(...ms).toFixed(1)} ms (client side)`,
      );
      // A good request afterwards answers, and correctly.
      expect(await viaHttp(0)()).toEqual({ ok: true, code: 200, message: "" });
      expect(await viaGrpc(0)()).toEqual({ ok: true, code: 0, message: "" });
      expect(await counts(server, "resnet50_preprocess")).toEqual({ success: 6, fail: 0 });
    } finally {
      grpc.close();
    }
  }, 90_000);
});

describe("a model whose config sets no max_queue_size", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({
      plain: { config: echoConfig("plain") },
      // One request at a time, the others queued (pendingRequests): the bound counts the queued ones only.
      serial: { config: echoConfig("serial", { params: { serial: "1" } }) },
      own: {
        config: echoConfig("own", { extra: "dynamic_batching { default_queue_policy { max_queue_size: 5 } }" }),
      },
    });
    server = await startServerProcess(["--model-repository", repo, "--default-max-queue-size", "3"]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  const call = (model: string, delayMs: number) => async () => {
    const { status, json } = await postJson(`${server.http}/v2/models/${model}/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      parameters: { delay_ms: delayMs },
    });
    if (status !== 200) return { ok: false, code: status, message: String(json.error) };
    expect(json.outputs[0].data).toEqual([1, 2, 3, 4]);
    return { ok: true, code: 200, message: "" };
  };

  it("gets the server's default bound (--default-max-queue-size); one that sets its own keeps it", async () => {
    const outcomes = await burst([
      ...Array.from({ length: 10 }, () => call("plain", 5_000)),
      ...Array.from({ length: 10 }, () => call("serial", 2_000)),
      ...Array.from({ length: 10 }, () => call("own", 5_000)),
    ]);
    const of = (i: number) => outcomes.slice(i * 10, i * 10 + 10);
    const [plain, serial, own] = [of(0), of(1), of(2)];
    // plain runs every request at once: all it holds are pending, 3 at most.
    expect(plain.filter((o) => o.ok).length).toBe(3);
    // serial runs one and queues the rest: 1 executing + 3 queued.
    expect(serial.filter((o) => o.ok).length).toBe(4);
    // own batches (dynamic_batching) on one instance, Triton's default: 1 executing + 5 queued.
    expect(own.filter((o) => o.ok).length).toBe(6);
    for (const [model, group, limit] of [
      ["plain", plain, 3],
      ["serial", serial, 3],
      ["own", own, 5],
    ] as const) {
      for (const r of group.filter((o) => !o.ok)) {
        expect(r.code).toBe(503);
        expect(r.message).toMatch(/Exceeds maximum queue size/);
        expect(r.message).toContain(model);
        expect(r.message).toMatch(new RegExp(`\\b${limit}\\b`));
      }
    }
    expect(await counts(server, "plain")).toEqual({ success: 3, fail: 7 });
    // Afterwards the model answers again.
    expect(await call("plain", 0)()).toEqual({ ok: true, code: 200, message: "" });
  }, 60_000);
});

describe("the seed ensemble with max_queue_size 2 on its inference step", () => {
  let repo: string;
  let server: ServerProcess;
  /** ONNX Runtime run directly on this CPU: the int8 model's kernels differ between CPUs. */
  let references: Record<string, ReferenceTop5>;
  beforeAll(async () => {
    references = await referenceTop5OnThisCpu();
    repo = await makeSeedRepository({
      editConfig: (model, config) =>
        model === "resnet50_inference"
          ? config.replace(
              "max_queue_delay_microseconds: 100000",
              "max_queue_delay_microseconds: 100000\n  default_queue_policy { max_queue_size: 2 }",
            )
          : config,
    });
    server = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  it("never decodes a request it then refuses: preprocess counts exactly the answered ones, each right", async () => {
    const binaryCalls = Array.from({ length: 40 }, () => async () => {
      const res = await postBinary(
        `${server.http}/v2/models/resnet50_ensemble/infer`,
        { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
        [frameBytes([image])],
      );
      const json = await jsonOf(res);
      return {
        ok: res.status === 200,
        code: res.status,
        message: res.status === 200 ? json.outputs[0].data[0] : json.error,
      };
    });
    const outcomes = await burst(binaryCalls);
    const admitted = outcomes.filter((o) => o.ok);
    const refused = outcomes.filter((o) => !o.ok);
    expect(admitted.length).toBeGreaterThan(0);
    expect(admitted.length + refused.length).toBe(40);
    for (const a of admitted) {
      expect(JSON.parse(a.message).top5_labels[0]).toBe(references[PHOTO]?.top5_labels[0]);
    }
    for (const r of refused) {
      expect(r.code).toBe(503);
      expect(r.message).toMatch(/resnet50_ensemble: Exceeds maximum queue size/);
    }
    const pre = await counts(server, "resnet50_preprocess");
    // Every image decoded was answered: none was refused by a later step after its decode.
    expect(pre).toEqual({ success: admitted.length, fail: 0 });
    expect(await counts(server, "resnet50_inference")).toEqual({ success: admitted.length, fail: 0 });
  }, 90_000);
});
