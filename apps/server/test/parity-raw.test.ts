/**
 * Parity, round 2 (issues 43, 47, 48 item 3, 46 item 4), black-box over HTTP and gRPC against
 * ONNX identity models built here: Triton's raw binary requests (Inference-Header-Content-Length:
 * 0, the one input's shape deduced from the config), duplicate requested outputs, nested `data`,
 * Triton's texts for shape and size refusals, binary_data_output's precedence, exact 64-bit
 * integers in JSON, and percent-encoded model names.
 *
 * Triton's rules and texts: server src/http_server.cc (EVBufferToRawInput, ReadDataFromJson,
 * HTTP_MAX_JSON_NESTING_DEPTH, ParseJsonTritonIO, HandleRepositoryIndex), core src/infer_request.cc
 * (Normalize's raw input, AddOriginalRequestedOutput), src/grpc/infer_handler.cc.
 */
import http from "node:http";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  grpcJsInferenceClient,
  identityModel,
  rejectionOf,
  removeDir,
  type ServerProcess,
  startServerProcess,
  streamAll,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { binaryResponse, echoConfig, grpcClientOf, type ModelSpec, makeRepository, postJson } from "./helpers.js";

const NONE = "[request id: <id_unknown>] ";

/** An ONNX identity model's config: each input X as X_out, all of one datatype and dims. */
function identityConfig(name: string, inputs: string[], type: string, dims: number[], maxBatch = 0): string {
  const dimsText = dims.join(", ");
  return `name: "${name}"
platform: "onnxruntime_onnx"
max_batch_size: ${maxBatch}
input [ ${inputs.map((i) => `{ name: "${i}" data_type: ${type} dims: [ ${dimsText} ] }`).join(", ")} ]
output [ ${inputs.map((i) => `{ name: "${i}_out" data_type: ${type} dims: [ ${dimsText} ] }`).join(", ")} ]
`;
}

type Elem = "float32" | "string" | "int64" | "uint64";
const CONFIG_TYPE: Record<Elem, string> = {
  float32: "TYPE_FP32",
  string: "TYPE_STRING",
  int64: "TYPE_INT64",
  uint64: "TYPE_UINT64",
};

/** A one-or-more-input identity model over `dims` (-1 dynamic). */
function identity(name: string, inputs: string[], type: Elem, dims: number[]): ModelSpec {
  return {
    config: identityConfig(name, inputs, CONFIG_TYPE[type], dims),
    files: {
      "1/model.onnx": identityModel(
        inputs.map((i) => ({ name: i, type, shape: dims.map((d, k) => (d === -1 ? `D${k}` : d)) })),
      ),
    },
  };
}

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    fp32: identity("fp32", ["INPUT0"], "float32", [-1]),
    bytes: identity("bytes", ["INPUT0"], "string", [1]),
    bytes_any: identity("bytes_any", ["INPUT0"], "string", [-1]),
    three: identity("three", ["A", "B", "C"], "float32", [-1]),
    int64: identity("int64", ["INPUT0"], "int64", [-1]),
    uint64: identity("uint64", ["INPUT0"], "uint64", [-1]),
    "post:v1": identity("post:v1", ["INPUT0"], "float32", [-1]),
    "a=b+c@d,e": identity("a=b+c@d,e", ["INPUT0"], "float32", [-1]),
    // Only the config matters for the raw refusal: two variable-sized dimensions.
    fp16: { config: echoConfig("fp16", { datatype: "TYPE_FP16", dims: [-1, -1], maxBatch: 0 }) },
    // One request executing, one queued: a third is refused as Triton refuses a full queue. A
    // TypeScript echo model, since its requests can be held (delay_ms) for the queue to fill.
    queued: {
      config: echoConfig("queued", {
        dims: [-1],
        extra: "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
      }),
    },
  });
  server = await startServerProcess(["--model-repository", repo, "--http-max-input-size", "65536"]);
}, 120_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const floats = (n: number) => Float32Array.from({ length: n }, (_, i) => i * 0.5 - 3.25);
const bytesOf = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** POSTs a raw binary request (header length 0), whole or in chunks (Transfer-Encoding: chunked). */
function postRaw(
  model: string,
  body: Uint8Array,
  chunked = false,
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  const url = new URL(`${server.http}/v2/models/${encodeURIComponent(model)}/infer`);
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      {
        method: "POST",
        headers: {
          "inference-header-content-length": "0",
          "content-type": "application/octet-stream",
          ...(chunked ? { "transfer-encoding": "chunked" } : { "content-length": body.byteLength }),
        },
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on("data", (c: Buffer) => parts.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }));
      },
    );
    req.on("error", reject);
    if (chunked) {
      for (let i = 0; i < body.byteLength; i += 100) req.write(body.subarray(i, i + 100));
      req.end();
    } else {
      req.end(body);
    }
  });
}

/** A binary answer's JSON header and the bytes after it. */
function splitAnswer(answer: { headers: http.IncomingHttpHeaders; body: Buffer }) {
  const n = Number(answer.headers["inference-header-content-length"]);
  return { json: JSON.parse(answer.body.subarray(0, n).toString("utf8")), binary: answer.body.subarray(n) };
}

describe("raw binary requests (Inference-Header-Content-Length: 0)", () => {
  it.each([false, true])(
    "FP32 [-1]: the bytes come back byte for byte, the shape deduced (chunked: %s)",
    async (chunked) => {
      const sent = bytesOf(floats(1000));
      const answer = await postRaw("fp32", sent, chunked);
      expect(answer.status).toBe(200);
      expect(answer.headers["content-type"]).toBe("application/octet-stream");
      const { json, binary } = splitAnswer(answer);
      expect(json.outputs).toEqual([
        { name: "INPUT0_out", datatype: "FP32", shape: [1000], parameters: { binary_data_size: 4000 } },
      ]);
      expect(Buffer.compare(binary, Buffer.from(sent))).toBe(0);
    },
  );

  it("BYTES [1]: the body is the one element, without a length prefix", async () => {
    const answer = await postRaw("bytes", new TextEncoder().encode("hello, raw"));
    expect(answer.status).toBe(200);
    const { json, binary } = splitAnswer(answer);
    expect(json.outputs[0]).toMatchObject({ name: "INPUT0_out", datatype: "BYTES", shape: [1] });
    // The binary output is Triton's BYTES encoding: a 4-byte length, then the element.
    expect(binary.readUInt32LE(0)).toBe(10);
    expect(binary.subarray(4).toString("utf8")).toBe("hello, raw");
  });

  it.each([
    [
      "three",
      `${NONE}Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'three' model configuration`,
    ],
    [
      "fp16",
      `${NONE}The shape of the raw input 'INPUT' can not be deduced because there are more than one variable-sized dimension`,
    ],
    ["bytes_any", `${NONE}For BYTE datatype raw input 'INPUT0', the model must have input shape [1]`],
  ])("refuses a raw request to %s with Triton's text, good requests answered meanwhile", async (model, text) => {
    const good = Array.from({ length: 4 }, () => postRaw("fp32", bytesOf(floats(64))));
    const bad = await postRaw(model, bytesOf(floats(8)));
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.body.toString()).error).toBe(text);
    for (const g of await Promise.all(good)) expect(g.status).toBe(200);
  });

  it("is refused 503 when the model's queue is full, as Triton", async () => {
    const held = (delay: number) =>
      postJson(`${server.http}/v2/models/queued/infer`, {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 2], data: [1, 2] }],
        parameters: { delay_ms: delay },
      });
    const executing = held(3000);
    await new Promise((r) => setTimeout(r, 300));
    const queued = held(0);
    await new Promise((r) => setTimeout(r, 300));
    const raw = await postRaw("queued", bytesOf(floats(2)));
    expect(raw.status).toBe(503);
    expect(JSON.parse(raw.body.toString()).error).toMatch(/Exceeds maximum queue size/);
    expect((await executing).status).toBe(200);
    expect((await queued).status).toBe(200);
    // Once the queue drains, the raw request is served.
    const after = await postRaw("queued", bytesOf(floats(2)));
    expect(after.status).toBe(200);
    expect(Buffer.compare(splitAnswer(after).binary, Buffer.from(bytesOf(floats(2))))).toBe(0);
  });
});

const fp32Input = (data: unknown, shape: number[] = [2]) => ({ name: "INPUT0", datatype: "FP32", shape, data });

describe("duplicate requested outputs", () => {
  const DUPLICATE = `${NONE}output 'A_out' already exists in request`;
  const threeInputs = ["A", "B", "C"].map((n) => ({ ...fp32Input([1, 2]), name: n }));

  it("HTTP: 400 with Triton's text", async () => {
    const { status, json } = await postJson(`${server.http}/v2/models/three/infer`, {
      inputs: threeInputs,
      outputs: [{ name: "A_out" }, { name: "B_out" }, { name: "A_out" }],
    });
    expect({ status, json }).toEqual({ status: 400, json: { error: DUPLICATE } });
  });

  it("gRPC: INVALID_ARGUMENT with Triton's text; the same outputs once each are answered", async () => {
    const client = grpcClientOf(server);
    const request = (outputs: string[]) =>
      create(ModelInferRequestSchema, {
        modelName: "three",
        inputs: threeInputs.map((i) => ({ name: i.name, datatype: "FP32", shape: [2n] })),
        rawInputContents: threeInputs.map(() => bytesOf(Float32Array.from([1, 2]))),
        outputs: outputs.map((name) => ({ name })),
      });
    const err = await rejectionOf(client.modelInfer(request(["A_out", "A_out"])), ConnectError);
    expect([err.code, err.rawMessage]).toEqual([Code.InvalidArgument, DUPLICATE]);
    const ok = await client.modelInfer(request(["A_out", "B_out"]));
    expect(ok.outputs.map((o) => o.name)).toEqual(["A_out", "B_out"]);
  });

  it("gRPC ModelStreamInfer (grpc-js): the stream answers the duplicate with Triton's text, the next request served", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const request = (outputs: string[]) => ({
        model_name: "three",
        inputs: threeInputs.map((i) => ({ name: i.name, datatype: "FP32", shape: [2] })),
        raw_input_contents: threeInputs.map(() => Buffer.from(bytesOf(Float32Array.from([1, 2])))),
        outputs: outputs.map((name) => ({ name })),
      });
      const answers = await streamAll(client, [request(["A_out", "A_out"]), request(["A_out"])]);
      expect(answers.map((a) => a.error_message)).toEqual([DUPLICATE, ""]);
      expect(answers[1]?.infer_response.outputs.map((o) => o.name)).toEqual(["A_out"]);
    } finally {
      client.close();
    }
  });

  it("gRPC: contents beside raw_input_contents is refused with Triton's text", async () => {
    const client = grpcClientOf(server);
    const err = await rejectionOf(
      client.modelInfer(
        create(ModelInferRequestSchema, {
          modelName: "fp32",
          inputs: [{ name: "INPUT0", datatype: "FP32", shape: [2n], contents: { fp32Contents: [1, 2] } }],
          rawInputContents: [bytesOf(Float32Array.from([1, 2]))],
        }),
      ),
      ConnectError,
    );
    expect([err.code, err.rawMessage]).toEqual([
      Code.InvalidArgument,
      "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'fp32'",
    ]);
  });
});

/** `value` inside `depth` arrays. */
const nested = (depth: number, value: unknown): unknown => (depth === 0 ? value : [nested(depth - 1, value)]);

describe("JSON data: nesting, element counts, sizes (Triton's texts)", () => {
  const infer = (input: object) => postJson(`${server.http}/v2/models/fp32/infer`, { inputs: [input] });

  it("flattens `data` of any nesting up to depth 99; refuses 100 with Triton's text", async () => {
    const fifty = await infer(fp32Input(nested(50, 1.5), [1]));
    expect(fifty.status).toBe(200);
    expect(fifty.json.outputs[0].data).toEqual([1.5]);
    const mixed = await infer(
      fp32Input(
        [
          [1, [2]],
          [[[3]], 4],
        ],
        [4],
      ),
    );
    expect(mixed.json.outputs[0].data).toEqual([1, 2, 3, 4]);
    expect((await infer(fp32Input(nested(99, 2), [1]))).status).toBe(200);
    const deep = await infer(fp32Input(nested(100, 2), [1]));
    expect(deep).toEqual({ status: 400, json: { error: "JSON nesting depth exceeds maximum allowed limit (100)" } });
  });

  it("refuses too many or too few elements with Triton's texts, naming no internal field", async () => {
    // Triton's main, src/http_server.cc ReadDataFromJsonHelper (too many: the read stops at the
    // first extra element) and ReadDataFromJson (too few: counted after the read); qa/L0_http/test.sh
    // checks both. Triton answers them INTERNAL (500); we answer 400, the client's error
    // (docs/triton-parity.md).
    const TOO_MANY = "Unable to parse 'data': Shape does not match true shape of 'data' field";
    const TOO_FEW = "Failed to parse 'data' field: shape does not match true shape";
    for (const data of [
      [1, 2, 3],
      [[1], [2], [3]],
    ]) {
      expect(await infer(fp32Input(data, [2]))).toEqual({ status: 400, json: { error: TOO_MANY } });
    }
    expect(await infer(fp32Input([1], [2]))).toEqual({ status: 400, json: { error: TOO_FEW } });
  });

  it("refuses a shape whose element count or byte size overflows INT64, with Triton's texts", async () => {
    const count = await infer(fp32Input([1], [2 ** 40, 2 ** 40]));
    expect(count).toEqual({
      status: 400,
      json: {
        error: `invalid shape for input 'INPUT0': shape [${2 ** 40},${2 ** 40}] causes total element count to exceed maximum size of 9223372036854775807`,
      },
    });
    const size = await infer(fp32Input([1], [2 ** 31, 2 ** 31]));
    expect(size).toEqual({
      status: 400,
      json: {
        error: `byte size overflow for input 'INPUT0': element count (${2n ** 62n}) * data type size (4) exceeds maximum allowed size (9223372036854775807)`,
      },
    });
  });

  it("keeps 400 for a negative dimension (a deliberate difference: docs/triton-parity.md)", async () => {
    const negative = await infer(fp32Input([1, 2], [-2]));
    expect(negative.status).toBe(400);
    expect(typeof negative.json.error).toBe("string");
  });

  it("refuses a body over --http-max-input-size with Triton's text", async () => {
    const { status, json } = await infer(fp32Input(Array(20_000).fill(1.25), [20_000]));
    expect(status).toBe(400);
    expect(json.error).toMatch(
      /^request JSON size of \d+ bytes exceeds the maximum allowed input size of 65536 bytes\. Use --http-max-input-size to increase the limit\.$/,
    );
  });

  it("refuses a repository index with a non-boolean 'ready' with Triton's text", async () => {
    for (const ready of ["yes", 1, null]) {
      const { status, json } = await postJson(`${server.http}/v2/repository/index`, { ready });
      expect({ status, json }).toEqual({
        status: 400,
        json: { error: "Invalid value for 'ready': expected a boolean" },
      });
    }
    expect((await postJson(`${server.http}/v2/repository/index`, { ready: true })).status).toBe(200);
  });
});

describe("binary_data_output precedence, as Triton's", () => {
  // Triton: an output the request lists is binary only when its own binary_data is true; one it
  // does not list (no `outputs`: all of them) takes the request's binary_data_output.
  const requestFlags = [undefined, false, true] as const;
  const listings = ["not listed", "listed", "listed, binary_data false", "listed, binary_data true"] as const;
  const table = requestFlags.flatMap((flag) => listings.map((listing) => ({ flag, listing })));

  it.each(table)("request binary_data_output $flag, output A_out $listing", async ({ flag, listing }) => {
    const own = listing.endsWith("true") ? true : listing.endsWith("false") ? false : undefined;
    const body = {
      inputs: ["A", "B", "C"].map((n) => ({ ...fp32Input([1, 2]), name: n })),
      ...(flag === undefined ? {} : { parameters: { binary_data_output: flag } }),
      ...(listing === "not listed"
        ? {}
        : { outputs: [{ name: "A_out", ...(own === undefined ? {} : { parameters: { binary_data: own } }) }] }),
    };
    const res = await fetch(`${server.http}/v2/models/three/infer`, { method: "POST", body: JSON.stringify(body) });
    expect(res.status).toBe(200);
    const { json, outputs } = await binaryResponse(res);
    const a = json.outputs.find((o: { name: string }) => o.name === "A_out");
    const binary = listing === "not listed" ? flag === true : own === true;
    if (binary) {
      expect(a.parameters).toEqual({ binary_data_size: 8 });
      expect(a.data).toBeUndefined();
      expect(Array.from(new Float32Array(Uint8Array.from(outputs.get("A_out") ?? []).buffer))).toEqual([1, 2]);
    } else {
      expect(a.data).toEqual([1, 2]);
    }
    expect(json.outputs.length).toBe(listing === "not listed" ? 3 : 1);
  });
});

describe("INT64 and UINT64 beyond 2^53 in JSON data", () => {
  const post = (model: string, datatype: string, literals: string[]) =>
    fetch(`${server.http}/v2/models/${model}/infer`, {
      method: "POST",
      body: `{"inputs":[{"name":"INPUT0","datatype":"${datatype}","shape":[${literals.length}],"data":[${literals.join(",")}]}]}`,
    });

  it("reads them exactly and answers them exactly", async () => {
    const int64 = ["9223372036854775807", "-9223372036854775808", "9007199254740993", "-12", "0"];
    const a = await post("int64", "INT64", int64);
    expect(a.status).toBe(200);
    expect(await a.text()).toContain(`"data":[${int64.join(",")}]`);
    const uint64 = ["18446744073709551615", "9007199254740993", "7"];
    const b = await post("uint64", "UINT64", uint64);
    expect(b.status).toBe(200);
    expect(await b.text()).toContain(`"data":[${uint64.join(",")}]`);
  });

  it("refuses one outside the type's range, and a long integer for an FP32 input is its nearest float", async () => {
    const over = await post("int64", "INT64", ["9223372036854775808"]);
    expect(over.status).toBe(400);
    expect(((await over.json()) as { error: string }).error).toContain("outside INT64's range");
    const negative = await post("uint64", "UINT64", ["-9007199254740993"]);
    expect(negative.status).toBe(400);
    const float = await post("fp32", "FP32", ["16777216000000000"]);
    expect(float.status).toBe(200);
    const answer = (await float.json()) as { outputs: { data: number[] }[] };
    expect(answer.outputs[0]?.data).toEqual([16777216000000000]);
  });
});

describe("percent-encoded model names over HTTP", () => {
  it.each(["post:v1", "a=b+c@d,e"])("%s answers under its encoded name, as tritonclient sends it", async (name) => {
    const encoded = encodeURIComponent(name);
    expect(encoded).not.toBe(name);
    expect((await fetch(`${server.http}/v2/models/${encoded}/ready`)).status).toBe(200);
    expect((await fetch(`${server.http}/v2/models/${name}/ready`)).status).toBe(200);
    const meta = await fetch(`${server.http}/v2/models/${encoded}`);
    expect(((await meta.json()) as { name: string }).name).toBe(name);
    const { status, json } = await postJson(`${server.http}/v2/models/${encoded}/versions/1/infer`, {
      inputs: [fp32Input([1, 2])],
    });
    expect(status).toBe(200);
    expect(json.model_name).toBe(name);
  });

  it("an encoded '/' stays within its segment: never a path separator", async () => {
    // "fp32%2Fready" is a model named "fp32/ready", not fp32's readiness.
    const res = await fetch(`${server.http}/v2/models/fp32%2Fready`);
    expect(res.status).toBe(404);
    expect((await fetch(`${server.http}/v2/models/fp32%2Fready/ready`)).status).not.toBe(200);
    expect((await fetch(`${server.http}/v2/models/fp32/ready`)).status).toBe(200);
  });
});
