/**
 * The real server process over a repository of small test models: HTTP/REST
 * (JSON and binary), gRPC (Connect and @grpc/grpc-js), gRPC-Web/Connect on
 * the HTTP port, metrics, statistics, version policy, a model that fails to load.
 */

import { totalmem } from "node:os";
import { deflateRawSync, deflateSync, gunzipSync, gzipSync, inflateSync } from "node:zlib";
import { create } from "@bufbuild/protobuf";
import { Code, type ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import {
  GRPCInferenceService,
  Health,
  HealthCheckResponse_ServingStatus,
  InferParameterSchema,
  ModelInferRequestSchema,
} from "@trellis/protocol";
import { grpcJsInferenceClient, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  binaryRequest,
  binaryResponse,
  CHAIN_CONFIG,
  echoConfig,
  floats,
  grpcClientOf,
  jsonOf,
  makeRepository,
  metricValue,
  postBinary,
  postJson,
  rawPost,
  scrape,
} from "./helpers.js";

let repo: string;
let server: ServerProcess;

/** Polls `check` (the server's own log, read as it arrives) until it holds. */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(check()).toBe(true);
}

const f32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);

/** Elements of echo_wide's tensor: 4 bytes past 4 MiB of FP32. */
const WIDE = 1024 * 1024 + 1;

beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    counted: { config: echoConfig("counted") },
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    echo_int: { config: echoConfig("echo_int", { datatype: "TYPE_INT64", dims: [2] }) },
    echo_str: { config: echoConfig("echo_str", { datatype: "TYPE_STRING", dims: [1] }) },
    // One float past 4 MiB: an answer over the default --http-max-compressed-answer-size.
    echo_wide: { config: echoConfig("echo_wide", { dims: [WIDE], maxBatch: 1 }) },
    labelled: {
      config: echoConfig("labelled").replace(
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]',
      ),
      files: { "labels.txt": "zero\none\ntwo\nthree" },
    },
    multi: {
      config: echoConfig("multi", {
        params: { scale_by_version: "1" },
        extra: "version_policy: { latest: { num_versions: 2 } }",
      }),
      versions: ["1", "2", "3"],
    },
    chain: { config: CHAIN_CONFIG },
    broken: { config: echoConfig("broken", { params: { module: "./does-not-exist.js" } }) },
  });
  // "broken" fails to load: served anyway (--exit-on-error=false), and not ready, as tritonserver.
  server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
});

afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

describe("startup", () => {
  it("logs one line per model loaded and per listening port, and with --exit-on-error=false stays up, not ready, when a model fails", async () => {
    const loaded = server.logs.filter((l) => l.msg === "model loaded").map((l) => `${l.model}:${l.version}`);
    expect(loaded.sort()).toEqual(
      [
        "chain:1",
        "counted:1",
        "echo10:1",
        "echo:1",
        "echo_int:1",
        "echo_str:1",
        "echo_wide:1",
        "labelled:1",
        "multi:2",
        "multi:3",
      ].sort(),
    );
    expect(server.logs.filter((l) => l.msg === "listening").map((l) => l.protocol)).toEqual([
      "grpc",
      "http",
      "metrics",
    ]);
    const failed = server.logs.find((l) => l.msg === "model failed to load");
    expect(failed).toMatchObject({ model: "broken", state: "UNAVAILABLE" });
    expect(String(failed?.reason)).toContain("does-not-exist.js");

    expect((await fetch(`${server.http}/v2/health/live`)).status).toBe(200);
    // Strict readiness (Triton's default): a model that failed to load keeps the server not ready.
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(400);
    expect((await fetch(`${server.http}/v2/models/echo/ready`)).status).toBe(200);
    // No version loaded: 404, as Triton's HandleModelReady answers a model it cannot find.
    expect((await fetch(`${server.http}/v2/models/broken/ready`)).status).toBe(404);
  });

  it("reports every model's state and reason in the repository index", async () => {
    const { status, json } = await postJson(`${server.http}/v2/repository/index`, {});
    expect(status).toBe(200);
    const broken = json.find((m: { name: string }) => m.name === "broken");
    expect(broken).toMatchObject({ name: "broken", version: "1", state: "UNAVAILABLE" });
    expect(broken.reason).toContain("does-not-exist.js");
    expect(json.filter((m: { name: string }) => m.name === "multi")).toEqual([
      { name: "multi", version: "2", state: "READY" },
      { name: "multi", version: "3", state: "READY" },
    ]);
    const ready = await postJson(`${server.http}/v2/repository/index`, { ready: true });
    expect(ready.json.some((m: { name: string }) => m.name === "broken")).toBe(false);
    expect(ready.json).toHaveLength(json.length - 1);
  });
});

describe("HTTP/REST", () => {
  it("serves server and model metadata, config and statistics", async () => {
    const meta = await jsonOf(await fetch(`${server.http}/v2`));
    // Triton's name by default (--id), which Triton's own example clients check.
    expect(meta.name).toBe("triton");
    expect(meta.extensions).toContain("binary_tensor_data");
    const model = await jsonOf(await fetch(`${server.http}/v2/models/echo`));
    expect(model).toEqual({
      name: "echo",
      versions: ["1"],
      platform: "typescript",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [-1, 4] }],
      outputs: [{ name: "OUTPUT", datatype: "FP32", shape: [-1, 4] }],
    });
    const config = await jsonOf(await fetch(`${server.http}/v2/models/echo/config`));
    expect(config.max_batch_size).toBe(8);
    expect(config.input[0]).toMatchObject({ name: "INPUT", data_type: "TYPE_FP32", dims: [4] });
    const versioned = await fetch(`${server.http}/v2/models/multi/versions/2/config`);
    expect((await jsonOf(versioned)).name).toBe("multi");
    const stats = await jsonOf(await fetch(`${server.http}/v2/models/stats`));
    expect(stats.model_stats.map((s: { name: string }) => s.name)).toContain("chain");
  });

  it("infers with JSON data, flat or nested, batched [N,4]", async () => {
    for (const n of [1, 3, 8]) {
      const rows = Array.from({ length: n }, (_, i) => [i, i + 0.5, -i, 2 * i]);
      const nested = await postJson(`${server.http}/v2/models/echo10/infer`, {
        id: `nested-${n}`,
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [n, 4], data: rows }],
      });
      expect(nested.status).toBe(200);
      expect(nested.json).toEqual({
        id: `nested-${n}`,
        model_name: "echo10",
        model_version: "1",
        outputs: [{ name: "OUTPUT", datatype: "FP32", shape: [n, 4], data: rows.flat().map((v) => v * 10 + 0) }],
      });
      const flat = await postJson(`${server.http}/v2/models/echo10/infer`, {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [n, 4], data: rows.flat() }],
      });
      expect(flat.json.outputs).toEqual(nested.json.outputs);
    }
  });

  it("types JSON data by datatype: INT64 as numbers, BYTES as strings", async () => {
    const ints = await postJson(`${server.http}/v2/models/echo_int/infer`, {
      inputs: [
        {
          name: "INPUT",
          datatype: "INT64",
          shape: [2, 2],
          data: [
            [1, -2],
            [3, 2 ** 40],
          ],
        },
      ],
    });
    expect(ints.json.outputs[0]).toEqual({
      name: "OUTPUT",
      datatype: "INT64",
      shape: [2, 2],
      data: [1, -2, 3, 2 ** 40],
    });
    const strs = await postJson(`${server.http}/v2/models/echo_str/infer`, {
      inputs: [{ name: "INPUT", datatype: "BYTES", shape: [2, 1], data: ["tabby", "ünïcode ✓"] }],
    });
    expect(strs.json.outputs[0]).toEqual({
      name: "OUTPUT",
      datatype: "BYTES",
      shape: [2, 1],
      data: ["tabby", "ünïcode ✓"],
    });
  });

  it("writes INT64 outputs past 2^53 as exact JSON integers (binary in, JSON out)", async () => {
    const values = [2n ** 62n + 1n, -(2n ** 63n), 9007199254740993n, -1n];
    const res = await postBinary(
      `${server.http}/v2/models/echo_int/infer`,
      { inputs: [{ name: "INPUT", datatype: "INT64", shape: [2, 2] }] },
      [new Uint8Array(BigInt64Array.from(values).buffer)],
    );
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).toContain('"data":[4611686018427387905,-9223372036854775808,9007199254740993,-1]');
    // A BYTES output that looks like the internal marker is left alone.
    const strs = await postJson(`${server.http}/v2/models/echo_str/infer`, {
      inputs: [{ name: "INPUT", datatype: "BYTES", shape: [1, 1], data: ['\u00001234"5'] }],
    });
    expect(strs.json.outputs[0].data).toEqual(['\u00001234"5']);
  });

  it("speaks the binary tensor extension both ways, and mixes it with JSON", async () => {
    const values = [1.5, -2, 0.25, 3, 4, 5, 6, 7];
    const res = await postBinary(
      `${server.http}/v2/models/echo10/infer`,
      { inputs: [{ name: "INPUT", datatype: "FP32", shape: [2, 4] }], parameters: { binary_data_output: true } },
      [f32(values)],
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/octet-stream");
    const { json, outputs } = await binaryResponse(res);
    expect(json.outputs[0]).toEqual({
      name: "OUTPUT",
      datatype: "FP32",
      shape: [2, 4],
      parameters: { binary_data_size: 32 },
    });
    expect([...new Float32Array((outputs.get("OUTPUT") as Uint8Array).buffer)]).toEqual(values.map((v) => v * 10));

    // Binary in, JSON out (binary_data: false on the output).
    const res2 = await postBinary(
      `${server.http}/v2/models/echo10/infer`,
      {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [2, 4] }],
        outputs: [{ name: "OUTPUT", parameters: { binary_data: false } }],
      },
      [f32(values)],
    );
    expect(res2.headers.get("inference-header-content-length")).toBeNull();
    expect((await jsonOf(res2)).outputs[0].data).toEqual(values.map((v) => v * 10));
  });

  it("takes gzip and deflate bodies and compresses answers on Accept-Encoding, as tritonclient.http does", async () => {
    const values = [1.5, -2, 0.25, 3];
    const { body, headerLength } = binaryRequest(
      { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4] }], parameters: { binary_data_output: true } },
      [f32(values)],
    );
    const url = `${server.http}/v2/models/echo10/infer`;
    // tritonclient.http: Content-Encoding gzip (gzip.compress) or deflate (zlib.compress), the header
    // length that of the uncompressed JSON; Accept-Encoding asks for the answer compressed.
    for (const [coding, compress, decompress] of [
      ["gzip", gzipSync, gunzipSync],
      ["deflate", deflateSync, inflateSync],
    ] as const) {
      const res = await rawPost(url, compress(body), {
        "content-encoding": coding,
        "accept-encoding": coding,
        "inference-header-content-length": headerLength,
      });
      expect(res.status, coding).toBe(200);
      expect(res.headers["content-encoding"]).toBe(coding);
      expect(res.headers.vary).toBe("Accept-Encoding");
      const whole = decompress(res.body);
      const jsonLength = Number(res.headers["inference-header-content-length"]);
      expect(JSON.parse(whole.subarray(0, jsonLength).toString()).outputs[0].parameters).toEqual({
        binary_data_size: 16,
      });
      expect([
        ...new Float32Array(whole.buffer.slice(whole.byteOffset + jsonLength, whole.byteOffset + whole.byteLength)),
      ]).toEqual(values.map((v) => v * 10));
    }
    // Raw deflate (no zlib wrapper), as some clients send it; no Accept-Encoding, or q=0: plain.
    const json = new TextEncoder().encode(
      JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: values }] }),
    );
    for (const accept of [undefined, "gzip;q=0, identity"]) {
      const res = await rawPost(url, deflateRawSync(json), {
        "content-encoding": "deflate",
        ...(accept ? { "accept-encoding": accept } : {}),
      });
      expect(res.headers["content-encoding"]).toBeUndefined();
      expect(JSON.parse(res.body.toString()).outputs[0].data).toEqual(values.map((v) => v * 10));
    }
    const brotli = await rawPost(url, json, { "content-encoding": "br" });
    expect(brotli.status).toBe(415);
    expect(JSON.parse(brotli.body.toString())).toEqual({
      error: "unsupported Content-Encoding 'br' (supported: gzip, deflate, identity)",
    });
    const corrupt = await rawPost(url, json, { "content-encoding": "gzip" });
    expect(corrupt.status).toBe(400);
    expect(JSON.parse(corrupt.body.toString()).error).toMatch(/^request body is not valid gzip data: /);
  });

  it("sends an answer over --http-max-compressed-answer-size uncompressed, whatever Accept-Encoding says", async () => {
    const values = new Float32Array(WIDE).map((_, i) => i % 251);
    const { body, headerLength } = binaryRequest(
      { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, WIDE] }], parameters: { binary_data_output: true } },
      [new Uint8Array(values.buffer)],
    );
    const res = await rawPost(`${server.http}/v2/models/echo_wide/infer`, body, {
      "accept-encoding": "gzip, deflate",
      "inference-header-content-length": headerLength,
    });
    expect(res.status).toBe(200);
    expect(res.headers["content-encoding"]).toBeUndefined();
    const jsonLength = Number(res.headers["inference-header-content-length"]);
    expect(Number(res.headers["content-length"])).toBe(jsonLength + 4 * WIDE);
    const answer = res.body.subarray(jsonLength);
    expect(Buffer.from(answer).equals(Buffer.from(values.buffer))).toBe(true);
  });

  it("implements the classification extension with the output's labels", async () => {
    const { status, json } = await postJson(`${server.http}/v2/models/labelled/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [2, 4], data: [0.1, 0.7, 0.2, 0.05, 3, 2, 1, 4] }],
      outputs: [{ name: "OUTPUT", parameters: { classification: 2 } }],
    });
    expect(status).toBe(200);
    expect(json.outputs[0]).toEqual({
      name: "OUTPUT",
      datatype: "BYTES",
      shape: [2, 2],
      data: ["0.700000:1:one", "0.200000:2:two", "4.000000:3:three", "3.000000:0:zero"],
    });
  });

  it("classifies an ensemble's output once, as Triton's frontend does, not again in the step", async () => {
    const { status, json } = await postJson(`${server.http}/v2/models/chain/infer`, {
      inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [0.1, 0.7, 0.2, 0.05] }],
      outputs: [{ name: "OUT", parameters: { classification: 2 } }],
    });
    expect(status).toBe(200);
    expect(json.outputs[0]).toMatchObject({ name: "OUT", datatype: "BYTES", shape: [1, 2] });
    expect(json.outputs[0].data).toHaveLength(2);
    expect(json.outputs[0].data.map((s: string) => s.split(":")[1])).toEqual(["1", "2"]);
  });

  it("maps errors to Triton's statuses with {error} bodies", async () => {
    const unknown = await postJson(`${server.http}/v2/models/nope/infer`, { inputs: [] });
    expect(unknown).toEqual({ status: 404, json: { error: "Request for unknown model: 'nope' is not found" } });
    const meta = await fetch(`${server.http}/v2/models/nope`);
    expect(meta.status).toBe(404);
    expect((await jsonOf(meta)).error).toContain("'nope'");
    const oldVersion = await postJson(`${server.http}/v2/models/multi/versions/1/infer`, { inputs: [] });
    // A version not served is not found: 404, as Triton since server PR #6713.
    expect(oldVersion.status).toBe(404);
    expect(oldVersion.json.error).toContain("version 1");

    const badShape = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3] }],
    });
    expect(badShape.status).toBe(400);
    // Triton's words for too few elements (http_server.cc ReadDataFromJson), which name no internal field.
    expect(badShape.json.error).toBe("Failed to parse 'data' field: shape does not match true shape");
    const badType = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, "x", 3, 4] }],
    });
    expect(badType.status).toBe(400);
    expect(badType.json.error).toContain("element 1");
    const fp16 = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP16", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
    expect(fp16.status).toBe(400);
    expect(fp16.json.error).toContain("binary data format");
    const notJson = await fetch(`${server.http}/v2/models/echo/infer`, { method: "POST", body: "{nope" });
    expect(notJson.status).toBe(400);
    expect((await jsonOf(notJson)).error).toContain("JSON");
    const short = binaryRequest({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4] }] }, [f32([1, 2, 3, 4])]);
    const truncated = await fetch(`${server.http}/v2/models/echo/infer`, {
      method: "POST",
      body: short.body.subarray(0, short.body.byteLength - 4),
      headers: { "inference-header-content-length": String(short.headerLength) },
    });
    expect(truncated.status).toBe(400);
    expect((await jsonOf(truncated)).error).toContain("binary_data_size 16");

    const stageFailure = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      parameters: { fail: true },
    });
    expect(stageFailure).toEqual({ status: 400, json: { error: "echo: asked to fail" } });

    const load = await postJson(`${server.http}/v2/repository/models/echo/load`, {});
    expect(load.status).toBe(503);
    expect(load.json.error).toContain("explicit model load / unload is not allowed");
    expect((await fetch(`${server.http}/v2/nowhere`)).status).toBe(404);
    expect((await fetch(`${server.http}/v2/models/echo/infer`)).status).toBe(405);
  });

  it("rejects JSON it cannot take exactly, and malformed requests, with 400 naming the problem", async () => {
    // A typed array would wrap 300 to 44 without a word.
    const wraps = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "UINT8", shape: [1, 4], data: [1, 2, 300, 4] }],
    });
    expect(wraps.status).toBe(400);
    expect(wraps.json.error).toBe("input 'INPUT': element 2 of 'data' is 300, outside UINT8's range 0..255");
    const negative = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "UINT32", shape: [1, 4], data: [1, -1, 3, 4] }],
    });
    expect(negative.status).toBe(400);
    expect(negative.json.error).toContain("element 1 of 'data' is -1, outside UINT32's range");
    // Past 2^53 an INT64 is read exactly (issue 48); a value past INT64's range is refused.
    const past = await fetch(`${server.http}/v2/models/echo_int/infer`, {
      method: "POST",
      body: '{"inputs":[{"name":"INPUT","datatype":"INT64","shape":[1,2],"data":[9223372036854775808,1]}]}',
    });
    expect(past.status).toBe(400);
    expect((await jsonOf(past)).error).toContain("outside INT64's range");
    const exact = await postJson(`${server.http}/v2/models/echo_int/infer`, {
      inputs: [{ name: "INPUT", datatype: "INT64", shape: [1, 2], data: [Number.MAX_SAFE_INTEGER, -1] }],
    });
    expect(exact.json.outputs[0].data).toEqual([Number.MAX_SAFE_INTEGER, -1]);

    const outputs = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      outputs: { name: "OUTPUT" },
    });
    expect(outputs).toEqual({ status: 400, json: { error: "'outputs' must be an array" } });
    const badPath = await fetch(`${server.http}/v2/models/%E0%A4%A/ready`);
    expect(badPath.status).toBe(400);
    expect((await jsonOf(badPath)).error).toContain("malformed percent-encoding");
  });

  it("applies the version policy: latest 2 of versions 1,2,3", async () => {
    const infer = (path: string) =>
      postJson(`${server.http}${path}/infer`, {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      });
    expect((await infer("/v2/models/multi")).json).toMatchObject({
      model_version: "3",
      outputs: [{ data: [3, 6, 9, 12] }],
    });
    expect((await infer("/v2/models/multi/versions/2")).json).toMatchObject({
      model_version: "2",
      outputs: [{ data: [2, 4, 6, 8] }],
    });
  });
});

describe("gRPC", () => {
  const request = (model: string, name: string, rows: number[][]) =>
    create(ModelInferRequestSchema, {
      modelName: model,
      inputs: [{ name, datatype: "FP32", shape: [BigInt(rows.length), 4n] }],
      rawInputContents: [f32(rows.flat())],
    });

  it("serves the whole service to a Connect gRPC client, ensembles included", async () => {
    const client = grpcClientOf(server);
    // "broken" failed to load: not ready, as tritonserver's strict readiness.
    expect((await client.serverReady({})).ready).toBe(false);
    expect((await client.modelReady({ name: "chain" })).ready).toBe(true);
    expect((await client.modelReady({ name: "broken" })).ready).toBe(false);
    const rows = [
      [1, 2, 3, 4],
      [5, 6, 7, 8],
      [9, 10, 11, 12],
    ];
    const res = await client.modelInfer(request("chain", "IN", rows));
    expect(res.modelName).toBe("chain");
    expect(res.outputs.map((o) => [o.name, o.datatype, o.shape])).toEqual([["OUT", "FP32", [3n, 4n]]]);
    const raw = res.rawOutputContents[0] as Uint8Array;
    expect([...floats(raw)]).toEqual(rows.flat().map((v) => v * 10));

    const index = await client.repositoryIndex({});
    expect(index.models.find((m) => m.name === "broken")?.state).toBe("UNAVAILABLE");
    const err = await client.modelInfer(request("nope", "IN", rows)).catch((e: Error) => e);
    expect(String(err)).toContain("Request for unknown model: 'nope' is not found");

    const health = createClient(Health, createGrpcTransport({ baseUrl: server.grpc }));
    // grpc.health.v1 follows readiness (Kubernetes gRPC probes): not serving while "broken" failed.
    expect((await health.check({ service: "" })).status).toBe(HealthCheckResponse_ServingStatus.NOT_SERVING);
  });

  it("reads and changes the log settings over HTTP and gRPC (logging extension); verbose turns debug lines on", async () => {
    const defaults = {
      log_file: "",
      log_info: true,
      log_warning: true,
      log_error: true,
      log_verbose_level: 0,
      log_format: "default",
    };
    expect(await jsonOf(await fetch(`${server.http}/v2/logging`))).toEqual(defaults);
    expect((await jsonOf(await fetch(`${server.http}/v2`))).extensions).toEqual(
      expect.arrayContaining(["logging", "trace"]),
    );
    const debugLines = () => server.logs.filter((l) => l.msg === "request failed" && l.url === "/v2/nowhere").length;
    await fetch(`${server.http}/v2/nowhere`);
    expect(debugLines()).toBe(0);

    const verbose = await postJson(`${server.http}/v2/logging`, { log_verbose_level: 1 });
    expect(verbose).toEqual({ status: 200, json: { ...defaults, log_verbose_level: 1 } });
    await fetch(`${server.http}/v2/nowhere`);
    await until(() => debugLines() === 1);

    const client = grpcClientOf(server);
    const read = await client.logSettings({});
    expect(read.settings.log_verbose_level?.parameterChoice).toEqual({ case: "uint32Param", value: 1 });
    expect(read.settings.log_info?.parameterChoice).toEqual({ case: "boolParam", value: true });
    const quiet = await client.logSettings({
      settings: { log_verbose_level: { parameterChoice: { case: "uint32Param", value: 0 } } },
    });
    expect(quiet.settings.log_verbose_level?.parameterChoice.value).toBe(0);
    await fetch(`${server.http}/v2/nowhere`);
    expect(debugLines()).toBe(1);

    // Refused whole, naming the setting; nothing changes.
    expect(await postJson(`${server.http}/v2/logging`, { log_verbose_level: 2, log_info: "yes" })).toEqual({
      status: 400,
      json: { error: `log setting 'log_info' must be a boolean, got "yes"` },
    });
    expect((await postJson(`${server.http}/v2/logging`, { log_level: 1 })).json.error).toMatch(
      /^unknown log setting 'log_level' \(settings: log_file, log_info/,
    );
    // As Triton (server src/http_server.cc HandleLogging): log_file refused whatever its value, null ignored.
    expect((await postJson(`${server.http}/v2/logging`, { log_file: "" })).status).toBe(501);
    expect(await postJson(`${server.http}/v2/logging`, { log_file: null, log_info: null })).toEqual({
      status: 200,
      json: defaults,
    });
    expect(await postJson(`${server.http}/v2/logging`, { log_file: "/tmp/trellis.log" })).toEqual({
      status: 501,
      json: {
        error:
          "log file location can not be updated through network protocol: it is set when the server starts (--log-file <path>)",
      },
    });
    const grpcBad = await client
      .logSettings({ settings: { log_format: { parameterChoice: { case: "stringParam", value: "json" } } } })
      .catch((e: ConnectError) => e);
    expect((grpcBad as ConnectError).code).toBe(Code.InvalidArgument);
    expect(await jsonOf(await fetch(`${server.http}/v2/logging`))).toEqual(defaults);
  });

  it("answers shared memory, which it lacks, as a Triton without client shm would (nothing there, registering and unregistering refused), and keeps tracing off without a trace file", async () => {
    // HTTP, as tritonclient.http's shm examples start: status, unregister all, then register.
    // Triton with client shm off refuses unregister too (501; see parity-codes.test.ts).
    const disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";
    for (const kind of ["system", "cuda"]) {
      const base = `${server.http}/v2/${kind}sharedmemory`;
      expect(await jsonOf(await fetch(`${base}/status`))).toEqual([]);
      expect(await postJson(`${base}/unregister`, {})).toEqual({ status: 501, json: { error: disabled } });
      expect((await postJson(`${base}/region/input0/unregister`, {})).status).toBe(501);
      const region = await fetch(`${base}/region/input0/status`);
      expect(region.status).toBe(404);
      expect((await jsonOf(region)).error).toMatch(/^Unable to find (system|CUDA) shared memory region: 'input0'$/);
      const register = await postJson(`${base}/region/input0/register`, { key: "/input0", offset: 0, byte_size: 64 });
      expect(register).toEqual({ status: 501, json: { error: disabled } });
    }
    // Tracing: Triton's defaults, and no trace file (none was given at start), so it cannot be turned on.
    const traceDefaults = {
      trace_file: "",
      trace_level: ["OFF"],
      trace_rate: "1000",
      trace_count: "-1",
      log_frequency: "0",
      trace_mode: "triton",
    };
    expect(await jsonOf(await fetch(`${server.http}/v2/trace/setting`))).toEqual(traceDefaults);
    expect(await postJson(`${server.http}/v2/models/echo/trace/setting`, { trace_level: "OFF" })).toEqual({
      status: 200,
      json: traceDefaults,
    });
    expect(await postJson(`${server.http}/v2/trace/setting`, { trace_level: ["TIMESTAMPS"], trace_rate: "1" })).toEqual(
      {
        status: 400,
        json: {
          error:
            "Attempting to set invalid trace setting :trace file name is not given: tracing needs a trace file, set when the server starts (--trace-config triton,file=<path>)",
        },
      },
    );

    // gRPC: the same answers.
    const client = grpcClientOf(server);
    expect((await client.systemSharedMemoryStatus({})).regions).toEqual({});
    const unregister = await client.cudaSharedMemoryUnregister({ name: "input0" }).catch((e: ConnectError) => e);
    expect([(unregister as ConnectError).code, (unregister as ConnectError).rawMessage]).toEqual([
      Code.Unimplemented,
      disabled,
    ]);
    const notFound = await client.systemSharedMemoryStatus({ name: "input0" }).catch((e: ConnectError) => e);
    expect((notFound as ConnectError).code).toBe(Code.NotFound);
    const refused = await client
      .systemSharedMemoryRegister({ name: "input0", key: "/input0", byteSize: 64n })
      .catch((e: ConnectError) => e);
    expect((refused as ConnectError).code).toBe(Code.Unimplemented);
    expect((await client.traceSetting({})).settings.trace_level?.value).toEqual(["OFF"]);
    const tracing = await client
      .traceSetting({ settings: { trace_level: { value: ["TIMESTAMPS"] } } })
      .catch((e: ConnectError) => e);
    expect((tracing as ConnectError).code).toBe(Code.InvalidArgument);
    expect(await jsonOf(await fetch(`${server.http}/v2/trace/setting`))).toEqual(traceDefaults);
  });

  it("runs the requests of one ModelStreamInfer stream at once, answering each as it completes, as Triton does", async () => {
    const client = grpcClientOf(server);
    const held = (model: string, id: string, delayMs: number) => {
      const r = request(model, "INPUT", [[1, 2, 3, 4]]);
      r.id = id;
      r.parameters.delay_ms = create(InferParameterSchema, {
        parameterChoice: { case: "int64Param", value: BigInt(delayMs) },
      });
      return r;
    };
    async function* requests() {
      yield held("echo", "slow", 600);
      yield held("echo", "fast", 0);
      yield held("nope", "bad", 0);
    }
    const answers: string[] = [];
    for await (const r of client.modelStreamInfer(requests())) {
      answers.push(r.errorMessage ? `${r.inferResponse?.id}: ${r.errorMessage}` : `${r.inferResponse?.id}`);
    }
    // One at a time, "slow" would hold the others back 600 ms and come first.
    expect(answers.at(-1)).toBe("slow");
    expect(answers.slice(0, 2).sort()).toEqual(["bad: Request for unknown model: 'nope' is not found", "fast"]);
  });

  it("serves @grpc/grpc-js with the proto loaded at runtime", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    const res = await client.modelInfer({
      model_name: "echo10",
      id: "grpc-js",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [2, 4] }],
      raw_input_contents: [Buffer.from(f32([1, 2, 3, 4, 5, 6, 7, 8]))],
    });
    expect(res.id).toBe("grpc-js");
    expect(res.model_version).toBe("1");
    const out = (res.raw_output_contents as Buffer[])[0] as Buffer;
    expect([...floats(out)]).toEqual([10, 20, 30, 40, 50, 60, 70, 80]);
    const meta = await client.modelMetadata({ name: "multi" });
    expect(meta.versions).toEqual(["2", "3"]);
    const failure = await client.modelInfer({ model_name: "nope", inputs: [] }).catch((e: grpc.ServiceError) => e);
    expect((failure as grpc.ServiceError).code).toBe(grpc.status.NOT_FOUND);
    client.close();
  });

  it("serves gRPC-Web and Connect clients on the HTTP port (HTTP/1.1)", async () => {
    for (const transport of [
      createGrpcWebTransport({ baseUrl: server.http, httpVersion: "1.1" }),
      createConnectTransport({ baseUrl: server.http, httpVersion: "1.1" }),
    ]) {
      const client = createClient(GRPCInferenceService, transport);
      const res = await client.modelInfer(request("echo10", "INPUT", [[1, 1, 2, 2]]));
      expect([...floats(res.rawOutputContents[0] as Uint8Array)]).toEqual([10, 10, 20, 20]);
    }
  });
});

describe("host metrics", () => {
  it("reports Triton's nv_cpu_utilization and nv_cpu_memory_* for the machine", async () => {
    await scrape(server); // utilization is over the time since the previous scrape
    await new Promise((r) => setTimeout(r, 50));
    const text = await scrape(server);
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
    expect(value("nv_cpu_utilization")).toBeGreaterThanOrEqual(0);
    expect(value("nv_cpu_utilization")).toBeLessThanOrEqual(1);
    expect(value("nv_cpu_memory_total_bytes")).toBe(totalmem());
    expect(value("nv_cpu_memory_used_bytes")).toBeGreaterThan(0);
    expect(value("nv_cpu_memory_used_bytes")).toBeLessThan(totalmem());
  });
});

describe("metrics and statistics under concurrent clients", () => {
  it("move by exactly the requests sent, over HTTP JSON, HTTP binary and gRPC at once", async () => {
    const before = await scrape(server);
    const client = grpcClientOf(server);
    const batches = Array.from({ length: 36 }, (_, i) => 1 + (i % 8));
    const rowsOf = (n: number, i: number) => Array.from({ length: n }, (_, r) => [i, r, i + r, 1]);
    const answers = await Promise.all(
      batches.map(async (n, i) => {
        const rows = rowsOf(n, i);
        if (i % 3 === 0) {
          const { json } = await postJson(`${server.http}/v2/models/counted/infer`, {
            inputs: [{ name: "INPUT", datatype: "FP32", shape: [n, 4], data: rows }],
          });
          return json.outputs[0].data as number[];
        }
        if (i % 3 === 1) {
          const res = await postBinary(
            `${server.http}/v2/models/counted/infer`,
            { inputs: [{ name: "INPUT", datatype: "FP32", shape: [n, 4] }], parameters: { binary_data_output: true } },
            [f32(rows.flat())],
          );
          const { outputs } = await binaryResponse(res);
          return [...new Float32Array((outputs.get("OUTPUT") as Uint8Array).buffer)];
        }
        const res = await client.modelInfer(
          create(ModelInferRequestSchema, {
            modelName: "counted",
            inputs: [{ name: "INPUT", datatype: "FP32", shape: [BigInt(n), 4n] }],
            rawInputContents: [f32(rows.flat())],
          }),
        );
        return [...floats(res.rawOutputContents[0] as Uint8Array)];
      }),
    );
    answers.forEach((a, i) => {
      expect(a).toEqual(rowsOf(batches[i] as number, i).flat());
    });

    const after = await scrape(server);
    const delta = (name: string) => metricValue(after, name, "counted") - metricValue(before, name, "counted");
    expect(delta("nv_inference_request_success")).toBe(36);
    expect(delta("nv_inference_request_failure")).toBe(0);
    expect(delta("nv_inference_count")).toBe(batches.reduce((a, b) => a + b, 0));
    expect(delta("nv_inference_exec_count")).toBe(36);
    expect(metricValue(after, "nv_inference_pending_request_count", "counted")).toBe(0);
    expect(after).toContain("process_cpu_seconds_total");
    expect(after).toContain("process_resident_memory_bytes");

    // ModelStatistics, over gRPC and HTTP, says the same as the metrics.
    const stats = (await client.modelStatistics({ name: "counted" })).modelStats[0];
    expect(Number(stats?.inferenceStats?.success?.count)).toBe(
      metricValue(after, "nv_inference_request_success", "counted"),
    );
    expect(Number(stats?.inferenceCount)).toBe(metricValue(after, "nv_inference_count", "counted"));
    expect(Number(stats?.executionCount)).toBe(metricValue(after, "nv_inference_exec_count", "counted"));
    expect(Math.floor(Number(stats?.inferenceStats?.computeInfer?.ns) / 1000)).toBe(
      metricValue(after, "nv_inference_compute_infer_duration_us", "counted"),
    );
    const http = await jsonOf(await fetch(`${server.http}/v2/models/counted/stats`));
    expect(http.model_stats[0].inference_count).toBe(Number(stats?.inferenceCount));

    // A failing request moves the failure counter by one.
    await postJson(`${server.http}/v2/models/counted/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      parameters: { fail: true },
    });
    const failed = await scrape(server);
    expect(metricValue(failed, "nv_inference_request_failure", "counted")).toBe(
      metricValue(after, "nv_inference_request_failure", "counted") + 1,
    );
  });
});
