/**
 * The recent traces (GET /v2/traces…): a request traced on demand (the trellis-trace header)
 * by a real server with tracing OFF, its seed-ensemble steps' timestamps and batch sizes, the
 * failing step of a truncated JPEG, the Chrome trace-event export checked against the format,
 * the access rules, and the store's bounds under 10,000 traced requests.
 */
import { frameBytes } from "@trellis/kserve/wire";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  chromeTraceOf,
  type KeptSpan,
  type KeptTrace,
  placeRemoteSpan,
  RecentTraces,
  sanitizeRemoteSpan,
} from "../src/observability/recent-traces.js";
import { DEFAULT_TRACE_VALUES, TRACE_ASK_HEADER, Tracer } from "../src/observability/tracing.js";
import { binaryRequest, jsonOf } from "./helpers.js";

let repo: string;
let server: ServerProcess;
let restricted: ServerProcess;

beforeAll(async () => {
  repo = await makeSeedRepository();
  [server, restricted] = await Promise.all([
    startServerProcess(["--model-repository", repo]),
    startServerProcess([
      "--model-repository",
      repo,
      "--http-restricted-api",
      "trace:trace-key=open-sesame",
      "--trace-config",
      "recent,count=2",
    ]),
  ]);
});
afterAll(async () => {
  const codes = [await server?.stop(), await restricted?.stop()];
  await removeDir(repo);
  expect(codes).toEqual([0, 0]);
});

/** Classifies `image` over HTTP with request id `id`, asking for its trace when `headers` say so. */
async function classify(base: string, image: Uint8Array, id: string, headers: Record<string, string> = {}) {
  const { body, headerLength } = binaryRequest(
    {
      id,
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: true } }],
    },
    [frameBytes([image])],
  );
  const res = await fetch(`${base}/v2/models/resnet50_ensemble/infer`, {
    method: "POST",
    body,
    headers: { "inference-header-content-length": String(headerLength), ...headers },
  });
  await res.arrayBuffer();
  return res.status;
}

async function traceOf(base: string, requestId: string, headers: Record<string, string> = {}): Promise<KeptTrace> {
  const list = await jsonOf(await fetch(`${base}/v2/traces?request_id=${requestId}`, { headers }));
  expect(list.traces).toHaveLength(1);
  const res = await fetch(`${base}/v2/traces/${list.traces[0].id}`, { headers });
  expect(res.status).toBe(200);
  return jsonOf(res);
}

const segment = (s: KeptSpan, from: "QUEUE_START" | "COMPUTE_START", to: "COMPUTE_START" | "COMPUTE_END") =>
  (s.times[to] ?? Number.NaN) - (s.times[from] ?? Number.NaN);

/** The trace-event format's required fields, checked on every event. */
function checkTraceEventFormat(doc: unknown): void {
  expect(doc).toMatchObject({ traceEvents: expect.any(Array) });
  const events = (doc as { traceEvents: Record<string, unknown>[] }).traceEvents;
  expect(events.length).toBeGreaterThan(0);
  for (const e of events) {
    expect(typeof e.name).toBe("string");
    expect(["X", "M"]).toContain(e.ph);
    for (const field of ["ts", "dur", "pid", "tid"]) {
      expect(Number.isFinite(e[field]), `${field} of ${JSON.stringify(e)}`).toBe(true);
    }
    expect(e.dur as number).toBeGreaterThanOrEqual(0);
  }
}

describe("recent traces on a server with tracing OFF", () => {
  it("keeps an on-demand request's steps, with queue and compute inside the total, and a truncated JPEG's failing step", async () => {
    const photo = await readFixtureImage("chelsea.jpg");
    const truncated = await readFixtureImage(TRUNCATED_PHOTO);
    const ask = { [TRACE_ASK_HEADER]: "1" };
    // Untraced good requests in flight the whole time: the asks trace only their own requests.
    const untraced = Array.from({ length: 6 }, (_, i) => classify(server.http, photo, `plain-${i}`));
    const [good, bad] = await Promise.all([
      classify(server.http, photo, "good-1", ask),
      classify(server.http, truncated, "bad-1", ask),
    ]);
    expect(await Promise.all(untraced)).toEqual([200, 200, 200, 200, 200, 200]);
    expect([good, bad]).toEqual([200, 400]);
    const all = await jsonOf(await fetch(`${server.http}/v2/traces`));
    expect(all.traces.map((t: { requestId: string }) => t.requestId).sort()).toEqual(["bad-1", "good-1"]);

    const trace = await traceOf(server.http, "good-1");
    expect(trace.onDemand).toBe(true);
    const { root } = trace;
    expect(root.model).toBe("resnet50_ensemble");
    expect(root.children.map((c) => c.model)).toEqual([
      "resnet50_preprocess",
      "resnet50_inference",
      "resnet50_postprocess",
    ]);
    const total = (root.times.REQUEST_END ?? 0) - (root.times.REQUEST_START ?? 0);
    expect(total).toBeGreaterThan(0);
    let sum = 0;
    for (const step of root.children) {
      expect(step.failed).toBe(false);
      expect(step.batchSize).toBeGreaterThanOrEqual(1);
      const queue = segment(step, "QUEUE_START", "COMPUTE_START");
      const compute = segment(step, "COMPUTE_START", "COMPUTE_END");
      expect(queue).toBeGreaterThanOrEqual(0);
      expect(compute).toBeGreaterThan(0);
      sum += queue + compute;
    }
    expect(sum).toBeLessThanOrEqual(total);

    const failed = await traceOf(server.http, "bad-1");
    expect(failed.root.children.map((c) => [c.model, c.failed])).toEqual([["resnet50_preprocess", true]]);
  });

  it("exports a trace as Chrome trace-event JSON, as a download", async () => {
    const photo = await readFixtureImage("chelsea.jpg");
    expect(await classify(server.http, photo, "export-1", { [TRACE_ASK_HEADER]: "1" })).toBe(200);
    const list = await jsonOf(await fetch(`${server.http}/v2/traces?request_id=export-1`));
    const res = await fetch(`${server.http}/v2/traces/${list.traces[0].id}/chrome`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-disposition")).toMatch(/^attachment; filename="trellis-trace-\d+\.json"$/);
    const doc = await jsonOf(res);
    checkTraceEventFormat(doc);
    const spans = doc.traceEvents.filter((e: { ph: string }) => e.ph === "X");
    expect(spans.filter((e: { cat: string }) => e.cat === "compute")).toHaveLength(4);
    expect((await fetch(`${server.http}/v2/traces/999999/chrome`)).status).toBe(404);
    expect((await fetch(`${server.http}/v2/traces/1`, { method: "DELETE" })).status).toBe(405);
  });

  it("follows the trace endpoints' access rules: without the key the ask is ignored and the routes refused", async () => {
    const photo = await readFixtureImage("chelsea.jpg");
    const key = { "trace-key": "open-sesame" };
    expect(await classify(restricted.http, photo, "no-key", { [TRACE_ASK_HEADER]: "1" })).toBe(200);
    expect(await classify(restricted.http, photo, "with-key", { [TRACE_ASK_HEADER]: "1", ...key })).toBe(200);
    const refused = await fetch(`${restricted.http}/v2/traces`);
    expect(refused.status).toBe(403);
    expect((await jsonOf(refused)).error).toContain("trace-key");
    const list = await jsonOf(await fetch(`${restricted.http}/v2/traces`, { headers: key }));
    expect(list.traces.map((t: { requestId: string }) => t.requestId)).toEqual(["with-key"]);
  });

  it("keeps no more than --trace-config recent,count= says, and refuses a bad bound at start", async () => {
    const photo = await readFixtureImage("chelsea.jpg");
    const key = { "trace-key": "open-sesame", [TRACE_ASK_HEADER]: "1" };
    for (const id of ["k-1", "k-2", "k-3"]) expect(await classify(restricted.http, photo, id, key)).toBe(200);
    const list = await jsonOf(await fetch(`${restricted.http}/v2/traces`, { headers: key }));
    expect(list.traces.map((t: { requestId: string }) => t.requestId)).toEqual(["k-3", "k-2"]);
    expect(list.kept).toMatchObject({ count: 2, maxCount: 2, maxBytes: 4 * 1024 * 1024 });
    const refusal = await startupRefusal(["--model-repository", repo, "--trace-config", "recent,count=lots"]);
    expect(refusal).toContain(
      "--trace-config recent,count=lots: expected recent,count=<traces> or recent,bytes=<bytes>",
    );
  });
});

describe("the store's bounds", () => {
  /** `n` requests traced on demand through a Tracer (tracing OFF), each an ensemble of three steps. */
  function traceMany(tracer: Tracer, n: number): void {
    const ask = (name: string) => (name === TRACE_ASK_HEADER ? "1" : undefined);
    for (let i = 0; i < n; i++) {
      const trace = tracer.begin("ensemble", "1", `r-${i}`, ask);
      if (!trace) throw new Error("an on-demand ask was not traced");
      trace.stamp("REQUEST_START");
      for (const step of ["pre", "infer", "post"]) {
        const child = trace.child(step, "1");
        child.stamp("REQUEST_START");
        child.stamp("QUEUE_START");
        child.stamp("COMPUTE_START");
        child.batchSize?.(1 + (i % 4));
        child.stamp("COMPUTE_END");
        child.stamp("REQUEST_END");
      }
      trace.stamp("COMPUTE_END");
      trace.stamp("REQUEST_END");
      trace.end();
    }
  }

  it("10,000 traced requests leave the count at its bound", () => {
    const recent = new RecentTraces({ maxCount: 50, maxBytes: 10 * 1024 * 1024 });
    const began = performance.now();
    traceMany(new Tracer({ ...DEFAULT_TRACE_VALUES }, undefined, undefined, { recent }), 10_000);
    // Reported, not asserted: what one on-demand trace of a 3-step ensemble costs in process.
    console.log(`one traced request (3 steps, kept): ${(((performance.now() - began) / 10_000) * 1000).toFixed(1)} µs`);
    expect(recent.count).toBe(50);
    const kept = recent.list();
    expect(kept[0]!.requestId).toBe("r-9999");
    expect(kept.at(-1)!.requestId).toBe("r-9950");
    const bytes = kept.reduce((n, t) => n + Buffer.byteLength(recent.json(t.id)!), 0);
    expect(recent.bytes).toBe(bytes);
  });

  it("10,000 traced requests leave the bytes at their bound", () => {
    const maxBytes = 64 * 1024;
    const recent = new RecentTraces({ maxCount: 100_000, maxBytes });
    traceMany(new Tracer({ ...DEFAULT_TRACE_VALUES }, undefined, undefined, { recent }), 10_000);
    const kept = recent.list();
    const bytes = kept.reduce((n, t) => n + Buffer.byteLength(recent.json(t.id)!), 0);
    expect(recent.bytes).toBe(bytes);
    expect(recent.bytes).toBeLessThanOrEqual(maxBytes);
    // Full: one more trace of this size would not fit.
    const one = Buffer.byteLength(recent.json(kept[0]!.id)!);
    expect(recent.bytes + one).toBeGreaterThan(maxBytes);
    expect(recent.count).toBe(kept.length);
    expect(kept[0]!.requestId).toBe("r-9999");
  });

  it("keeps tensors only at trace level TENSORS, and only where reading traces needs the key", () => {
    const ask = (name: string) => (name === TRACE_ASK_HEADER ? "1" : undefined);
    const input = { name: "x", datatype: "FP32" as const, shape: [1, 2], data: new Float32Array([1.5, 2]) };
    const kept = (tracer: Tracer, recent: RecentTraces) => {
      const trace = tracer.begin("m", "1", "t", ask)!;
      trace.stamp("REQUEST_START");
      trace.tensor("TENSOR_QUEUE_INPUT", input);
      trace.stamp("REQUEST_END");
      trace.end();
      return recent.find({ requestId: "t" })!.root;
    };
    const off = new RecentTraces();
    expect(kept(new Tracer({ ...DEFAULT_TRACE_VALUES }, undefined, undefined, { recent: off }), off).tensors).toBe(
      undefined,
    );
    const on = new RecentTraces();
    // Level TENSORS in mode triton needs a trace file; nothing is sampled here (rate 0), nothing written.
    const values = { ...DEFAULT_TRACE_VALUES, level: ["TENSORS" as const], rate: 0, file: "/tmp/unused-trace.json" };
    expect(kept(new Tracer(values, undefined, undefined, { recent: on, readersKeyed: true }), on).tensors).toEqual([
      { activity: "TENSOR_QUEUE_INPUT", tensor: { name: "x", data: "1.5,2", shape: "1,2", dtype: "FP32" } },
    ]);
    const openPort = new RecentTraces();
    expect(kept(new Tracer(values, undefined, undefined, { recent: openPort }), openPort).tensors).toBe(undefined);
  });

  it("an ask is ignored without the key when the trace endpoints are restricted", () => {
    const recent = new RecentTraces();
    const tracer = new Tracer({ ...DEFAULT_TRACE_VALUES }, undefined, undefined, {
      recent,
      restrictions: [{ header: "k", value: "v" }],
    });
    const headers = (h: Record<string, string>) => (name: string) => h[name];
    expect(tracer.begin("m", "1", "a", headers({ [TRACE_ASK_HEADER]: "1" }))).toBeUndefined();
    expect(tracer.begin("m", "1", "b", headers({ [TRACE_ASK_HEADER]: "1", k: "v" }))).toBeDefined();
    expect(tracer.begin("m", "1", "c", headers({ [TRACE_ASK_HEADER]: "yes please", k: "v" }))).toBeUndefined();
  });

  it("the export of a kept trace passes the trace-event format check", () => {
    const recent = new RecentTraces();
    traceMany(new Tracer({ ...DEFAULT_TRACE_VALUES }, undefined, undefined, { recent }), 1);
    const trace = recent.find({ requestId: "r-0" })!;
    const doc = chromeTraceOf(trace);
    checkTraceEventFormat(doc);
    expect(doc.traceEvents.filter((e) => e.ph === "M").map((e) => (e.args as { name: string }).name)).toEqual([
      "ensemble",
      "  pre",
      "  infer",
      "  post",
    ]);
  });

  it("a remote step's reply is read within bounds, and centred in the caller's call", () => {
    const span = (depth: number): object => ({
      model: "m",
      times: { REQUEST_START: 0, COMPUTE_START: 10, COMPUTE_END: 30, REQUEST_END: 40, NOT_A_STAMP: 5 },
      children: depth > 0 ? [span(depth - 1)] : [],
    });
    const read = sanitizeRemoteSpan(JSON.stringify(span(1)))!;
    expect(read).toMatchObject({ model: "m", remote: true, failed: false, children: [{ model: "m", remote: true }] });
    expect(Object.keys(read.times)).toEqual(["REQUEST_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]);
    // Not JSON, not a span, nested too deep, too large: left out.
    expect(sanitizeRemoteSpan("{")).toBeUndefined();
    expect(sanitizeRemoteSpan(JSON.stringify({ times: {} }))).toBeUndefined();
    expect(sanitizeRemoteSpan(JSON.stringify(span(20)))).toBeUndefined();
    expect(sanitizeRemoteSpan(`"${"x".repeat(70_000)}"`)).toBeUndefined();
    // The caller's call took 100 µs from 1000; the remote's 40 µs sit in its middle.
    const placed = placeRemoteSpan(read, { REQUEST_START: 1000, REQUEST_END: 1100 });
    expect([placed.times.REQUEST_START, placed.times.REQUEST_END]).toEqual([1030, 1070]);
    expect(placed.children[0]!.times.COMPUTE_START).toBe(1040);
  });
});
