/**
 * Triton's request tracing, black-box: --trace-config on the server process,
 * the trace extension's settings over HTTP and gRPC, and the JSON trace files
 * it writes (read back as Triton's tools read them).
 */
import { existsSync } from "node:fs";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, type ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  grpcJsInferenceClient,
  makeSeedRepository,
  readFixtureImage,
  readReferenceTop5,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tracedTensor } from "../src/observability/tracing.js";
import { summarizeTraces } from "../tools/summarize.js";
import { CHAIN_CONFIG, echoConfig, grpcClientOf, jsonOf, makeRepository, postBinary, postJson } from "./helpers.js";

interface Header {
  id: number;
  model_name: string;
  model_version: number;
  request_id?: string;
  parent_id?: number;
}
interface Trace extends Header {
  at: Record<string, number>;
  order: string[];
}

/** The traces in a file, headers joined with their timestamps. */
async function readTraceFile(path: string): Promise<Trace[]> {
  const entries = JSON.parse(await readFile(path, "utf8")) as (Header & {
    timestamps?: { name: string; ns: number }[];
  })[];
  const traces = new Map<number, Trace>();
  for (const e of entries) {
    const t = traces.get(e.id) ?? ({ id: e.id, at: {}, order: [] } as unknown as Trace);
    if (e.model_name) Object.assign(t, e);
    for (const s of e.timestamps ?? []) {
      t.at[s.name] = s.ns;
      t.order.push(s.name);
    }
    traces.set(e.id, t);
  }
  return [...traces.values()];
}

const waitForFile = async (path: string) => {
  for (let i = 0; i < 100 && !existsSync(path); i++) await new Promise((r) => setTimeout(r, 50));
  return path;
};

describe("the seed ensemble, every request traced", () => {
  let repo: string;
  let dir: string;
  let server: ServerProcess;
  const photo = readFixtureImage(Object.keys(readReferenceTop5()).sort()[0] as string);

  beforeAll(async () => {
    repo = await makeSeedRepository();
    dir = await mkdtemp(join(tmpdir(), "trellis-trace-"));
    server = await startServerProcess([
      "--model-repository",
      repo,
      "--trace-config",
      `triton,file=${join(dir, "trace.json")}`,
      "--trace-config",
      "level=TIMESTAMPS",
      "--trace-config",
      "rate=1",
    ]);
  });
  afterAll(async () => {
    await server?.stop();
    await removeDir(repo);
    await removeDir(dir);
  });

  it("writes Triton's trace file at shutdown: each request's timestamps in order, its steps as child traces", async () => {
    const grpcJs = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    await grpcJs.modelInfer({
      model_name: "resnet50_ensemble",
      id: "over-grpc",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [Buffer.from(frameBytes([photo]))],
    });
    grpcJs.close();
    const http = await postBinary(
      `${server.http}/v2/models/resnet50_ensemble/infer`,
      { id: "over-http", inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([photo])],
    );
    expect(http.status).toBe(200);
    // A failed request is traced too (Triton traces what it handled, answered or not).
    const bad = await postBinary(
      `${server.http}/v2/models/resnet50_ensemble/infer`,
      { id: "truncated", inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([photo.subarray(0, 2000)])],
    );
    expect(bad.status).toBe(400);
    // Through Connect's handler (a stream): traced from the handler in; no frontend timestamps.
    const connect = grpcClientOf(server);
    async function* one() {
      yield create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        id: "streamed",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([photo])],
      });
    }
    for await (const answer of connect.modelStreamInfer(one())) expect(answer.errorMessage).toBe("");
    expect(await server.stop("SIGTERM")).toBe(0);

    const traces = await readTraceFile(join(dir, "trace.json"));
    const top = traces.filter((t) => t.parent_id === undefined);
    expect(top.map((t) => [t.model_name, t.model_version, t.request_id])).toEqual([
      ["resnet50_ensemble", 1, "over-grpc"],
      ["resnet50_ensemble", 1, "over-http"],
      ["resnet50_ensemble", 1, "truncated"],
      ["resnet50_ensemble", 1, "streamed"],
    ]);
    const handler = [
      "REQUEST_START",
      "QUEUE_START",
      "COMPUTE_START",
      "COMPUTE_INPUT_END",
      "COMPUTE_OUTPUT_START",
      "COMPUTE_END",
      "REQUEST_END",
    ];
    const [grpc, rest, failed, streamed] = top as [Trace, Trace, Trace, Trace];
    expect(streamed.order).toEqual(handler);
    expect(grpc.order).toEqual([
      "GRPC_WAITREAD_START",
      "GRPC_WAITREAD_END",
      ...handler,
      "GRPC_SEND_START",
      "GRPC_SEND_END",
    ]);
    expect(rest.order).toEqual(["HTTP_RECV_START", "HTTP_RECV_END", ...handler, "HTTP_SEND_START", "HTTP_SEND_END"]);
    // The failed one: received, handled, refused in its first step; no compute end, no response sent.
    expect(failed.order.slice(0, 3)).toEqual(["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START"]);
    expect(failed.order).toContain("REQUEST_END");
    expect(failed.order).not.toContain("COMPUTE_END");

    for (const parent of [grpc, rest, streamed]) {
      const steps = traces
        .filter((t) => t.parent_id === parent.id)
        .sort((a, b) => (a.at.REQUEST_START as number) - (b.at.REQUEST_START as number));
      expect(steps.map((s) => [s.model_name, s.model_version])).toEqual([
        ["resnet50_preprocess", 1],
        ["resnet50_inference", 1],
        ["resnet50_postprocess", 1],
      ]);
      for (const s of steps) {
        expect(s.order).toEqual(handler);
        expect(s.at.REQUEST_START).toBeGreaterThanOrEqual(parent.at.COMPUTE_START as number);
        expect(s.at.REQUEST_END).toBeLessThanOrEqual(parent.at.COMPUTE_END as number);
      }
      // One after another: each step starts once the one before it has answered.
      for (let i = 1; i < steps.length; i++) {
        expect(steps[i]?.at.REQUEST_START).toBeGreaterThanOrEqual(steps[i - 1]?.at.REQUEST_END as number);
      }
      // The ONNX step ran in the dynamic batcher: its compute splits into input, infer, output.
      const inference = steps[1] as Trace;
      expect(
        (inference.at.COMPUTE_OUTPUT_START as number) - (inference.at.COMPUTE_INPUT_END as number),
      ).toBeGreaterThan(0);
    }
    const failedSteps = traces.filter((t) => t.parent_id === failed.id).map((t) => t.model_name);
    expect(failedSteps).toEqual(["resnet50_preprocess"]);

    const summary = summarizeTraces(JSON.parse(await readFile(join(dir, "trace.json"), "utf8")));
    expect(summary).toContain("resnet50_ensemble, gRPC: 1 traces");
    expect(summary).toContain("resnet50_ensemble, HTTP: 2 traces");
    expect(summary).toContain("resnet50_ensemble, no frontend timestamps: 1 traces");
    expect(summary).toMatch(/step resnet50_inference +\d+ +\d+/);
  });
});

describe("trace settings, global and per model, over HTTP and gRPC", () => {
  let repo: string;
  let dir: string;
  let file: string;
  let server: ServerProcess;

  beforeAll(async () => {
    repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
      chain: { config: CHAIN_CONFIG },
    });
    dir = await mkdtemp(join(tmpdir(), "trellis-trace-"));
    file = join(dir, "trace.json");
    server = await startServerProcess([
      "--model-repository",
      repo,
      "--trace-config",
      `triton,file=${file}`,
      "--trace-config",
      "triton,log-frequency=2",
    ]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
    await removeDir(dir);
  });

  const infer = (model: string) =>
    postJson(`${server.http}/v2/models/${model}/infer`, {
      inputs: [{ name: model === "chain" ? "IN" : "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
  const settings = async (model?: string) =>
    jsonOf(await fetch(`${server.http}/v2/${model ? `models/${model}/` : ""}trace/setting`));
  const update = (body: unknown, model?: string) =>
    postJson(`${server.http}/v2/${model ? `models/${model}/` : ""}trace/setting`, body);

  it("samples as set, writes every log-frequency traces to <file>.<n>, and stops at the count", async () => {
    expect(await settings()).toEqual({
      trace_file: file,
      trace_level: ["OFF"],
      trace_rate: "1000",
      trace_count: "-1",
      log_frequency: "2",
      trace_mode: "triton",
    });
    for (let i = 0; i < 3; i++) expect((await infer("echo")).status).toBe(200); // level OFF: nothing traced

    expect((await update({ trace_level: ["TIMESTAMPS"], trace_rate: "2" })).json).toMatchObject({
      trace_level: ["TIMESTAMPS"],
      trace_rate: "2",
    });
    // A model's own setting; the rest follow the global ones.
    expect((await update({ trace_rate: "1" }, "echo")).json).toMatchObject({
      trace_level: ["TIMESTAMPS"],
      trace_rate: "1",
    });
    expect((await settings()).trace_rate).toBe("2");
    const client = grpcClientOf(server);
    const overGrpc = await client.traceSetting({ modelName: "echo" });
    expect(overGrpc.settings.trace_rate?.value).toEqual(["1"]);
    expect(overGrpc.settings.trace_level?.value).toEqual(["TIMESTAMPS"]);

    // echo: every request (4 traces); chain: every 2nd (2 traces, each with its two steps).
    for (let i = 0; i < 4; i++) await infer("echo");
    for (let i = 0; i < 4; i++) await infer("chain");
    const written = await Promise.all([0, 1, 2].map((n) => waitForFile(`${file}.${n}`).then(readTraceFile)));
    const tops = written.map((traces) => traces.filter((t) => t.parent_id === undefined).map((t) => t.model_name));
    expect(tops).toEqual([
      ["echo", "echo"],
      ["echo", "echo"],
      ["chain", "chain"],
    ]);
    const steps = written[2]?.filter((t) => t.parent_id !== undefined).map((t) => t.model_name);
    expect(steps).toEqual(["echo", "echo10", "echo", "echo10"]);

    // A model named with no settings: back to the global ones.
    expect((await update({}, "echo")).json).toMatchObject({ trace_rate: "2" });
    // A count: one more trace, then none; the count spent, what is collected is written at once.
    expect((await update({ trace_count: "1", trace_rate: "1" })).json).toMatchObject({ trace_count: "1" });
    for (let i = 0; i < 3; i++) await infer("echo");
    expect((await settings()).trace_count).toBe("0");
    const last = await readTraceFile(await waitForFile(`${file}.3`));
    expect(last.map((t) => t.model_name)).toEqual(["echo"]);
    // null clears a global setting back to its value at start.
    expect((await update({ trace_rate: null, trace_level: null })).json).toMatchObject({
      trace_rate: "1000",
      trace_level: ["OFF"],
    });
  });

  it("refuses bad settings whole, naming them, with Triton's codes", async () => {
    const before = await settings();
    const cases: [unknown, number, RegExp][] = [
      // Triton: UNSUPPORTED (501), whatever the value (server src/http_server.cc).
      [
        { trace_file: join(dir, "elsewhere.json") },
        501,
        /^trace file location can not be updated through network protocol/,
      ],
      // Triton's words (server src/http_server.cc HandleTrace).
      [{ trace_rate: "abc" }, 400, /^Unable to parse 'trace_rate', got: abc$/],
      [{ trace_rate: "-1" }, 400, /^Unable to parse 'trace_rate', value is out of range \[ 0, 4294967295 \], got: -1$/],
      [{ trace_rate: "10", trace_count: "-2" }, 400, /^Unable to parse 'trace_count'. Expecting value >= -1, got:-2$/],
      [{ log_frequency: "often" }, 400, /^Unable to parse 'log_frequency', got: often$/],
      [{ trace_level: ["TENSORS", "OFF"] }, 400, /^Expect only one trace level 'OFF' is specified$/],
      [{ trace_level: ["SPANS"] }, 400, /^trace_level: expected OFF, TIMESTAMPS or TENSORS, got "SPANS"$/],
      [{ trace_mode: "opentelemetry" }, 400, /^trace_mode can only be set when the server starts/],
      [{ trace_colour: "red" }, 400, /^unknown trace setting "trace_colour"/],
    ];
    for (const [body, status, error] of cases) {
      const res = await update(body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      expect(res.json.error).toMatch(error);
    }
    expect(await settings()).toEqual(before); // trace_rate 10 did not land with the bad count
    const unknownModel = await update({ trace_rate: "1" }, "no_such_model");
    expect(unknownModel.status).toBe(404);

    const client = grpcClientOf(server);
    const refused = await client
      .traceSetting({ settings: { trace_rate: { value: ["zero"] } } })
      .catch((e: ConnectError) => e);
    expect((refused as ConnectError).code).toBe(Code.InvalidArgument);
    expect((refused as ConnectError).rawMessage).toBe("Unable to parse 'trace_rate', got: zero");
  });
});

describe("trace level TENSORS", () => {
  it("writes each model's input and output tensors, an ensemble's steps under it, with or without timestamps", async () => {
    const repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
      chain: { config: CHAIN_CONFIG },
    });
    const dir = await mkdtemp(join(tmpdir(), "trellis-trace-"));
    const file = join(dir, "trace.json");
    try {
      const server = await startServerProcess([
        "--model-repository",
        repo,
        ...["--trace-config", `triton,file=${file}`, "--trace-config", "level=TENSORS", "--trace-config", "rate=1"],
        // Turning TENSORS on at run time needs the trace key on every port (SECURITY.md).
        ...["--http-restricted-api", "trace:trace-key=k", "--grpc-restricted-protocol", "trace:trace-key=k"],
      ]);
      const infer = (data: number[]) =>
        postJson(`${server.http}/v2/models/chain/infer`, {
          inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data }],
        });
      expect((await infer([1, 2, 3, 4])).status).toBe(200);
      const both = await jsonOf(
        await fetch(`${server.http}/v2/trace/setting`, {
          method: "POST",
          body: JSON.stringify({ trace_level: ["TIMESTAMPS", "TENSORS"] }),
          headers: { "content-type": "application/json", "trace-key": "k" },
        }),
      );
      expect(both.trace_level).toEqual(["TIMESTAMPS", "TENSORS"]);
      expect((await infer([0.5, -1, 2.25, 3])).status).toBe(200);
      expect(await server.stop()).toBe(0);

      const entries = JSON.parse(await readFile(file, "utf8")) as Record<string, unknown>[];
      const headers = entries.filter((e) => "model_name" in e) as unknown as Header[];
      expect(headers.map((h) => h.model_name)).toEqual(["chain", "echo", "echo10", "chain", "echo", "echo10"]);
      const tensorsOf = (h: Header | undefined) =>
        entries
          .filter((e) => e.id === h?.id && "activity" in e)
          .map((e) => [e.activity, ...Object.values(e.tensor as Record<string, string>)]);
      const [chain, echo, echo10, chain2, , echo10b] = headers;
      expect(tensorsOf(chain)).toEqual([
        ["TENSOR_QUEUE_INPUT", "IN", "1,2,3,4", "1,4", "FP32"],
        ["TENSOR_BACKEND_OUTPUT", "OUT", "10,20,30,40", "1,4", "FP32"],
      ]);
      expect(echo?.parent_id).toBe(chain?.id);
      expect(tensorsOf(echo)).toEqual([
        ["TENSOR_QUEUE_INPUT", "INPUT", "1,2,3,4", "1,4", "FP32"],
        ["TENSOR_BACKEND_OUTPUT", "OUTPUT", "1,2,3,4", "1,4", "FP32"],
      ]);
      expect(tensorsOf(echo10)).toEqual([
        ["TENSOR_QUEUE_INPUT", "INPUT", "1,2,3,4", "1,4", "FP32"],
        ["TENSOR_BACKEND_OUTPUT", "OUTPUT", "10,20,30,40", "1,4", "FP32"],
      ]);
      expect(tensorsOf(echo10b)).toEqual([
        ["TENSOR_QUEUE_INPUT", "INPUT", "0.5,-1,2.25,3", "1,4", "FP32"],
        ["TENSOR_BACKEND_OUTPUT", "OUTPUT", "5,-10,22.5,30", "1,4", "FP32"],
      ]);
      // Timestamps only once TIMESTAMPS joined the level.
      const stamped = new Set(entries.filter((e) => "timestamps" in e).map((e) => e.id));
      expect(stamped.has(chain?.id)).toBe(false);
      expect(stamped.has(chain2?.id)).toBe(true);
      expect(stamped.has(echo10b?.id)).toBe(true);
      // Triton's summary tool input stays readable: the tensors are skipped.
      expect(summarizeTraces(entries)).toContain("chain");
    } finally {
      await removeDir(repo);
      await removeDir(dir);
    }
  });

  it("writes each datatype's elements as Triton does: numbers, FP16 as its value, BOOL as 1/0, BYTES as text", () => {
    expect(tracedTensor({ name: "h", datatype: "FP16", shape: [2], data: new Uint16Array([0x3c00, 0xc000]) })).toEqual({
      name: "h",
      data: "1,-2",
      shape: "2",
      dtype: "FP16",
    });
    expect(tracedTensor({ name: "b", datatype: "BF16", shape: [1], data: new Uint16Array([0x3fc0]) }).data).toBe("1.5");
    expect(tracedTensor({ name: "q", datatype: "BOOL", shape: [1, 2], data: new Uint8Array([1, 0]) }).data).toBe("1,0");
    expect(tracedTensor({ name: "i", datatype: "INT64", shape: [2], data: new BigInt64Array([-3n, 4n]) }).data).toBe(
      "-3,4",
    );
    const text = (t: string) => new TextEncoder().encode(t);
    expect(tracedTensor({ name: "s", datatype: "BYTES", shape: [2, 1], data: [text("cat"), text("dog")] })).toEqual({
      name: "s",
      data: "cat,dog",
      shape: "2,1",
      dtype: "BYTES",
    });
  });
});

it("refuses to start with a --trace-config it cannot use, saying why in one line", async () => {
  const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  try {
    const noFile = await startupRefusal(["--model-repository", repo, "--trace-config", "level=TIMESTAMPS"]);
    expect(String(noFile)).toContain(
      "trellis-server: --trace-config level=TIMESTAMPS needs a trace file: --trace-config triton,file=<path>",
    );
    const otel = await startupRefusal([
      "--model-repository",
      repo,
      "--trace-config",
      "opentelemetry,url=localhost:4318",
    ]);
    expect(String(otel)).toContain(
      "trellis-server: --trace-config opentelemetry,<setting>=... needs --trace-config mode=opentelemetry",
    );
    const otelTensors = await startupRefusal([
      "--model-repository",
      repo,
      ...["--trace-config", "mode=opentelemetry", "--trace-config", "level=TENSORS"],
    ]);
    expect(String(otelTensors)).toContain(
      "trellis-server: --trace-config level=TENSORS writes tensors to trace files: it needs mode triton",
    );
    const nowhere = await startupRefusal([
      "--model-repository",
      repo,
      "--trace-config",
      "triton,file=/no/such/folder/trace.json",
    ]);
    expect(String(nowhere)).toContain(
      "trellis-server: --trace-config triton,file=/no/such/folder/trace.json: cannot write in /no/such/folder: ENOENT",
    );
  } finally {
    await removeDir(repo);
  }
});

it("takes tritonserver's deprecated --trace-* flags, as command lines written for older Tritons have them", async () => {
  const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  const dir = await mkdtemp(join(tmpdir(), "trellis-trace-"));
  const server = await startServerProcess([
    "--model-repository",
    repo,
    "--trace-file",
    join(dir, "old.json"),
    "--trace-level",
    "TIMESTAMPS",
    "--trace-rate",
    "3",
    "--trace-count",
    "5",
    "--trace-log-frequency",
    "2",
  ]);
  try {
    expect(await jsonOf(await fetch(`${server.http}/v2/trace/setting`))).toEqual({
      trace_file: join(dir, "old.json"),
      trace_level: ["TIMESTAMPS"],
      trace_rate: "3",
      trace_count: "5",
      log_frequency: "2",
      trace_mode: "triton",
    });
  } finally {
    expect(await server.stop()).toBe(0);
    await removeDir(repo);
    await removeDir(dir);
  }
});
