/**
 * Black-box test helpers: temp model repositories of small test models and
 * small HTTP clients (the seed repository and the server process itself come
 * from @trellis/testing).
 */
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import http, { type IncomingHttpHeaders } from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { frameBytes } from "@trellis/kserve/wire";
import {
  GRPCInferenceService,
  InferParameterSchema,
  type ModelInferRequest,
  ModelInferRequestSchema,
  type ModelStreamInferResponse,
} from "@trellis/protocol";
import type { ServerProcess } from "@trellis/testing";

/** A Connect client of the server's KServe v2 gRPC service. */
export const grpcClientOf = (server: Pick<ServerProcess, "grpc">) =>
  createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.grpc }));

/** Server arguments: `repository` in explicit model control, with `models` loaded at start. */
export const explicitModels = (repository: string, ...models: string[]): string[] => [
  "--model-repository",
  repository,
  "--model-control-mode",
  "explicit",
  ...models.flatMap((m) => ["--load-model", m]),
];

export const ECHO_STAGE = join(import.meta.dirname, "fixtures", "echo-stage.js");

/**
 * config.pbtxt of the decoupled countdown test model (test/fixtures/countdown-stage.js): for an
 * INT32 input IN = N it sends N responses, OUT = N, N-1, ..., 1.
 */
export const COUNTDOWN_CONFIG = `name: "countdown"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
parameters { key: "module" value: { string_value: "${join(import.meta.dirname, "fixtures", "countdown-stage.js")}" } }
`;

export interface ModelSpec {
  /** config.pbtxt text. */
  config: string;
  versions?: string[];
  /** Extra files, path relative to the model directory -> contents. */
  files?: Record<string, string | Uint8Array>;
}

export async function makeRepository(models: Record<string, ModelSpec>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-repo-"));
  for (const [name, spec] of Object.entries(models)) await addModel(dir, name, spec);
  return dir;
}

export async function addModel(repository: string, name: string, spec: ModelSpec): Promise<void> {
  const modelDir = join(repository, name);
  await mkdir(modelDir, { recursive: true });
  await writeFile(join(modelDir, "config.pbtxt"), spec.config);
  for (const v of spec.versions ?? ["1"]) await mkdir(join(modelDir, v), { recursive: true });
  for (const [path, text] of Object.entries(spec.files ?? {})) {
    await mkdir(join(modelDir, path, ".."), { recursive: true });
    await writeFile(join(modelDir, path), text);
  }
}

/** config.pbtxt of an echo test model (OUTPUT = INPUT * scale) served by test/fixtures/echo-stage.js. */
export function echoConfig(
  name: string,
  opts: { datatype?: string; dims?: number[]; maxBatch?: number; extra?: string; params?: Record<string, string> } = {},
): string {
  const params = { module: ECHO_STAGE, ...opts.params };
  return `name: "${name}"
backend: "typescript"
max_batch_size: ${opts.maxBatch ?? 8}
input [ { name: "INPUT" data_type: ${opts.datatype ?? "TYPE_FP32"} dims: [ ${(opts.dims ?? [4]).join(", ")} ] } ]
output [ { name: "OUTPUT" data_type: ${opts.datatype ?? "TYPE_FP32"} dims: [ ${(opts.dims ?? [4]).join(", ")} ] } ]
${Object.entries(params)
  .map(([k, v]) => `parameters { key: "${k}" value: { string_value: "${v}" } }`)
  .join("\n")}
${opts.extra ?? ""}
`;
}

/** An ensemble of two echo models: OUT = echo10(echo(IN)). */
export const CHAIN_CONFIG = `name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "echo" model_version: -1 input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "mid" } },
  { model_name: "echo10" model_version: -1 input_map { key: "INPUT" value: "mid" } output_map { key: "OUTPUT" value: "OUT" } }
] }
`;

/** An ensemble of one step: OUT = echo10(IN). */
export const TENFOLD_CONFIG = `name: "tenfold"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "echo10" model_version: -1 input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "OUT" } }
] }
`;

/** A metric's value for {model, version} from Prometheus text (0 when absent). */
export function metricValue(text: string, name: string, model: string, version = "1"): number {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    if (line.includes(`model="${model}"`) && line.includes(`version="${version}"`)) {
      return Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return 0;
}

export async function scrape(server: ServerProcess): Promise<string> {
  const res = await fetch(`${server.metrics}/metrics`);
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  return res.text();
}

// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export async function postJson(url: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(url, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

/** Splits a binary-extension response into its JSON header and the binary chunks of each output. */
// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export async function binaryResponse(res: Response): Promise<{ json: any; outputs: Map<string, Uint8Array> }> {
  const body = new Uint8Array(await res.arrayBuffer());
  const headerLength = Number(res.headers.get("inference-header-content-length") ?? body.byteLength);
  const json = JSON.parse(new TextDecoder().decode(body.subarray(0, headerLength)));
  const outputs = new Map<string, Uint8Array>();
  let offset = headerLength;
  for (const o of json.outputs ?? []) {
    const size = o.parameters?.binary_data_size;
    if (size === undefined) continue;
    outputs.set(o.name, body.slice(offset, offset + size));
    offset += size;
  }
  return { json, outputs };
}

/** A binary-extension request body: JSON header + the inputs' raw bytes. */
export function binaryRequest(
  header: { inputs: { name: string; datatype: string; shape: number[] }[]; [k: string]: unknown },
  raws: Uint8Array[],
): { body: Uint8Array; headerLength: number } {
  const inputs = header.inputs.map((input, i) => ({
    ...input,
    parameters: { binary_data_size: (raws[i] as Uint8Array).byteLength },
  }));
  const json = new TextEncoder().encode(JSON.stringify({ ...header, inputs }));
  let total = json.byteLength;
  for (const r of raws) total += r.byteLength;
  const body = new Uint8Array(total);
  body.set(json, 0);
  let offset = json.byteLength;
  for (const r of raws) {
    body.set(r, offset);
    offset += r.byteLength;
  }
  return { body, headerLength: json.byteLength };
}

/** POSTs a binary-extension request (see binaryRequest) to `url`. */
export function postBinary(
  url: string,
  header: Parameters<typeof binaryRequest>[0],
  raws: Uint8Array[],
): Promise<Response> {
  const { body, headerLength } = binaryRequest(header, raws);
  return fetch(url, { method: "POST", body, headers: { "inference-header-content-length": String(headerLength) } });
}

/** FP32 values of raw bytes (copied: gRPC clients hand out views into pooled buffers). */
export const floats = (raw: Uint8Array) => new Float32Array(Uint8Array.from(raw).buffer);

/** A response body as JSON, for field-by-field assertions. */
// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export const jsonOf = async (res: Response): Promise<any> => res.json();

/** A POST through node:http, which (unlike fetch) hands back the body exactly as sent, compressed or not. */
export function rawPost(
  url: string,
  body: Uint8Array,
  headers: Record<string, string | number>,
): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: "POST", headers: { ...headers, "content-length": body.byteLength } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

/** A loopback port nothing listens on right now (for processes that cannot be given port 0). */
export function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as net.AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

/** A boolean request parameter, as tritonclient sends it. */
export const boolParam = (value: boolean) =>
  create(InferParameterSchema, { parameterChoice: { case: "boolParam", value } });
/** An int64 request parameter, as tritonclient sends it. */
export const int64Param = (value: bigint) =>
  create(InferParameterSchema, { parameterChoice: { case: "int64Param", value } });

/** A ModelStreamInfer request to the countdown model: IN = n. */
export function countdownRequest(
  id: string,
  n: number,
  parameters: ModelInferRequest["parameters"] = {},
): ModelInferRequest {
  return create(ModelInferRequestSchema, {
    modelName: "countdown",
    id,
    inputs: [{ name: "IN", datatype: "INT32", shape: [1n] }],
    rawInputContents: [new Uint8Array(Int32Array.of(n).buffer)],
    parameters,
  });
}

/** What a stream answer says: the request's id, the INT32 value sent (or the error), and its final flag if any. */
export function readStreamAnswer(a: ModelStreamInferResponse): string {
  const r = a.inferResponse;
  const flag = r?.parameters.triton_final_response?.parameterChoice;
  const final = flag?.case === "boolParam" ? ` final=${flag.value}` : "";
  if (a.errorMessage) return `${r?.id} error: ${a.errorMessage}${final}`;
  const raw = r?.rawOutputContents[0];
  const value = raw ? new Int32Array(Uint8Array.from(raw).buffer)[0] : "empty";
  return `${r?.id} ${value}${final}`;
}

/**
 * The decoupled countdown, a step multiplying by ten, and the ensemble "counting" of the two
 * (N in, TENS out: 10·N, 10·(N-1), ..., 10), for makeRepository.
 */
export function countingModels(): Record<string, ModelSpec> {
  return {
    countdown: { config: COUNTDOWN_CONFIG },
    tenfold_int: {
      config: echoConfig("tenfold_int", { datatype: "TYPE_INT32", dims: [1], maxBatch: 0, params: { scale: "10" } }),
    },
    counting: {
      config: `name: "counting"
platform: "ensemble"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TENS" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "countdown" model_version: -1 input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "count" } },
  { model_name: "tenfold_int" model_version: -1 input_map { key: "INPUT" value: "count" } output_map { key: "OUTPUT" value: "TENS" } }
] }
`,
    },
  };
}

/** A BYTES tensor's raw contents (4-byte little-endian length + bytes each) as strings. */
export function unframe(raw: Uint8Array): string[] {
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const decoder = new TextDecoder();
  const out: string[] = [];
  for (let off = 0; off < raw.byteLength; ) {
    const n = view.getUint32(off, true);
    out.push(decoder.decode(raw.subarray(off + 4, off + 4 + n)));
    off += 4 + n;
  }
  return out;
}

/** The seed ensemble's answer to one encoded image over HTTP (binary tensor extension): its JSON string. */
export async function classifyOverHttp(
  httpBase: string,
  image: Uint8Array,
  ensemble = "resnet50_ensemble",
): Promise<string> {
  const res = await postBinary(
    `${httpBase}/v2/models/${ensemble}/infer`,
    {
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: true } }],
    },
    [frameBytes([image])],
  );
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const { outputs } = await binaryResponse(res);
  return unframe(outputs.get("OUTPUT_RESULTS") as Uint8Array)[0] as string;
}

/** A ModelInfer of the echo test model, as wire bytes: [1, 2, 3, 4] in, the same out; `parameters` ride along. */
export function echoInferMessage(parameters: Record<string, string> = {}): Uint8Array {
  return toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: "echo",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
      rawInputContents: [new Uint8Array(new Float32Array([1, 2, 3, 4]).buffer)],
      parameters: Object.fromEntries(
        Object.entries(parameters).map(([k, value]) => [
          k,
          { parameterChoice: { case: "stringParam" as const, value } },
        ]),
      ),
    }),
  );
}
