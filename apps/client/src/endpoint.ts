/**
 * A KServe v2 server (Trellis or Triton) as the client tools see it, over gRPC
 * or HTTP/REST with the binary tensor extension: inference, model metadata and
 * statistics. Errors come back as StageErrors with the server's code and message.
 */
import { create, fromJson } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { type ClosableTransport, grpcTransport } from "@trellis/kserve";
import {
  inferRequestToWire,
  inferResponseFromWire,
  metadataFromWire,
  tensorFromRaw,
  tensorToRaw,
} from "@trellis/kserve/wire";
import {
  GRPCInferenceService,
  InferParameterSchema,
  type ModelInferRequest,
  type ModelInferResponse,
  ModelInferResponseSchema,
  type ModelStatistics,
  ModelStatisticsSchema,
} from "@trellis/protocol";
import {
  Code,
  codeName,
  type InferRequest,
  type InferResponse,
  StageError,
  type StageMetadata,
  type Tensor,
} from "@trellis/stage";
import { allocate, isDataType } from "@trellis/stage/backend";

export type Protocol = "grpc" | "http";

/** Triton's request parameter asking each stream answer to say whether it is the request's last, and that flag. */
const EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response";
const FINAL_RESPONSE = "triton_final_response";

/**
 * One gRPC ModelStreamInfer stream, used one request at a time (perf_analyzer's --streaming).
 * Each request asks for Triton's final-response flag and is done at the answer carrying it, so a
 * decoupled model's requests (several answers each, then an empty final one) are timed to their
 * end, as perf_analyzer times them; infer() gives the request's last answer with outputs.
 */
export interface InferStream {
  infer(request: InferRequest): Promise<InferResponse>;
  close(): void;
}

export interface Endpoint {
  readonly url: string;
  readonly protocol: Protocol;
  infer(model: string, request: InferRequest, version?: string): Promise<InferResponse>;
  /** A ModelStreamInfer stream to `model` (gRPC only; undefined over HTTP). */
  openStream?(model: string, version?: string): InferStream;
  metadata(model: string, version?: string): Promise<StageMetadata>;
  /** Every model's statistics, or one model's. */
  statistics(model?: string): Promise<ModelStatistics[]>;
  close(): void;
}

/** tritonclient's defaults: HTTP on 8000, gRPC on 8001. */
export const DEFAULT_URLS: Record<Protocol, string> = { grpc: "localhost:8001", http: "localhost:8000" };

/** "host:port" (as tritonclient and perf_analyzer take it) or a full http:// URL. */
function baseUrl(url: string): string {
  return /^https?:\/\//.test(url) ? url.replace(/\/+$/, "") : `http://${url}`;
}

/** An error as the tools print it: the server's code and message ("INVALID_ARGUMENT: ..."). */
export function describeError(err: unknown): string {
  if (err instanceof ConnectError) return `${codeName(err.code)}: ${err.rawMessage}`;
  return err instanceof Error ? err.message : String(err);
}

export function connectEndpoint(url: string, protocol: Protocol): Endpoint {
  return protocol === "grpc" ? grpcEndpoint(url) : httpEndpoint(url);
}

function grpcEndpoint(url: string): Endpoint {
  const transport: ClosableTransport = grpcTransport(baseUrl(url));
  const client = createClient(GRPCInferenceService, transport);
  const label = `gRPC ${url}`;
  const call = async <T>(model: string, f: () => Promise<T>): Promise<T> => {
    try {
      return await f();
    } catch (err) {
      // The server's own message names the model; only a failure to reach it needs the address.
      const ce = ConnectError.from(err);
      throw ce.code === Code.Unavailable && !ce.rawMessage.includes(model)
        ? new StageError(ce.code, "", `${label}: ${ce.rawMessage}`, { cause: err })
        : new StageError(ce.code, "", ce.rawMessage, { cause: err });
    }
  };
  return {
    url,
    protocol: "grpc",
    infer: (model, request, version = "") =>
      call(model, async () =>
        inferResponseFromWire(await client.modelInfer(inferRequestToWire(request, model, version)), model),
      ),
    openStream(model, version = "") {
      const requests = new RequestQueue<ModelInferRequest>();
      const responses = client.modelStreamInfer(requests)[Symbol.asyncIterator]();
      return {
        infer: (request) =>
          call(model, async () => {
            const wire = inferRequestToWire(request, model, version);
            wire.parameters[EMPTY_FINAL_RESPONSE] = create(InferParameterSchema, {
              parameterChoice: { case: "boolParam", value: true },
            });
            requests.push(wire);
            let last: ModelInferResponse | undefined;
            for (;;) {
              const next = await responses.next();
              if (next.done) throw new StageError(Code.Unavailable, "", `${label}: the stream ended`);
              const { errorMessage, inferResponse } = next.value;
              if (errorMessage) throw new StageError(Code.Unknown, "", errorMessage);
              if (inferResponse && (inferResponse.outputs.length > 0 || !last)) last = inferResponse;
              const final = inferResponse?.parameters[FINAL_RESPONSE]?.parameterChoice;
              if (final?.case === "boolParam" && final.value) break;
            }
            const answer = last ?? create(ModelInferResponseSchema);
            // The flag is the stream's, not the model's answer.
            delete answer.parameters[FINAL_RESPONSE];
            return inferResponseFromWire(answer, model);
          }),
        close: () => requests.end(),
      };
    },
    metadata: (model, version = "") =>
      call(model, async () => metadataFromWire(await client.modelMetadata({ name: model, version }))),
    statistics: (model = "") => call(model, async () => (await client.modelStatistics({ name: model })).modelStats),
    close: () => transport.close(),
  };
}

/** The requests of a client stream, sent as they are pushed, until end(). */
class RequestQueue<T> implements AsyncIterable<T> {
  private readonly queued: T[] = [];
  private ended = false;
  private wake?: () => void;

  push(item: T): void {
    this.queued.push(item);
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.queued.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

/** KServe's HTTP status for an error, back to its code (Triton's mapping). */
function codeOfStatus(status: number): Code {
  if (status === 404) return Code.NotFound;
  if (status === 503) return Code.Unavailable;
  if (status === 501) return Code.Unimplemented;
  if (status >= 500) return Code.Internal;
  return Code.InvalidArgument;
}

interface JsonTensor {
  name: string;
  datatype: string;
  shape: number[];
  data?: unknown[];
  parameters?: { binary_data_size?: number };
}

function httpEndpoint(url: string): Endpoint {
  const base = baseUrl(url);
  const modelPath = (model: string, version?: string) =>
    `${base}/v2/models/${encodeURIComponent(model)}${version ? `/versions/${encodeURIComponent(version)}` : ""}`;
  const request = async (model: string, path: string, init?: RequestInit): Promise<Response> => {
    let res: Response;
    try {
      res = await fetch(path, init);
    } catch (err) {
      const why = (err as Error & { cause?: Error }).cause?.message ?? (err as Error).message;
      throw new StageError(Code.Unavailable, "", `HTTP ${url} (model ${model}): ${why}`);
    }
    if (res.ok) return res;
    const text = await res.text();
    let message = text;
    try {
      message = (JSON.parse(text) as { error?: string }).error ?? text;
    } catch {
      // Not JSON: the body as it is.
    }
    throw new StageError(codeOfStatus(res.status), "", message);
  };
  return {
    url,
    protocol: "http",
    async infer(model, req, version) {
      const raws = req.inputs.map(tensorToRaw);
      const header = new TextEncoder().encode(
        JSON.stringify({
          ...(req.id ? { id: req.id } : {}),
          ...(req.parameters ? { parameters: req.parameters } : {}),
          inputs: req.inputs.map((t, i) => ({
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
            parameters: { binary_data_size: raws[i]!.byteLength },
          })),
          // Every output comes back binary: exact, and no JSON number formatting either way.
          ...(req.outputs?.length
            ? {
                outputs: req.outputs.map((o) => ({ name: o.name, parameters: { ...o.parameters, binary_data: true } })),
              }
            : { parameters: { ...req.parameters, binary_data_output: true } }),
        }),
      );
      const res = await request(model, `${modelPath(model, version)}/infer`, {
        method: "POST",
        body: Buffer.concat([header, ...raws]),
        headers: { "inference-header-content-length": String(header.byteLength) },
      });
      const body = new Uint8Array(await res.arrayBuffer());
      const headerLength = Number(res.headers.get("inference-header-content-length") ?? body.byteLength);
      const json = JSON.parse(new TextDecoder().decode(body.subarray(0, headerLength))) as {
        id?: string;
        model_name: string;
        model_version: string;
        outputs?: JsonTensor[];
      };
      let offset = headerLength;
      const outputs = (json.outputs ?? []).map((o): Tensor => {
        const size = o.parameters?.binary_data_size;
        if (size === undefined) return jsonTensor(model, o);
        const raw = body.slice(offset, offset + size);
        offset += size;
        return tensorFromRaw("output", o, raw, model);
      });
      return { id: json.id, modelName: json.model_name, modelVersion: json.model_version, outputs };
    },
    async metadata(model, version) {
      return (await (await request(model, modelPath(model, version))).json()) as StageMetadata;
    },
    async statistics(model) {
      const path = model ? `${modelPath(model)}/stats` : `${base}/v2/models/stats`;
      const json = (await (await request(model ?? "", path)).json()) as { model_stats: unknown[] };
      return json.model_stats.map((s) =>
        fromJson(ModelStatisticsSchema, s as Parameters<typeof fromJson>[1], { ignoreUnknownFields: true }),
      );
    },
    close: () => undefined,
  };
}

/** An output the server wrote as JSON (a server that ignores binary_data): its flat data, typed. */
function jsonTensor(model: string, o: JsonTensor): Tensor {
  if (!isDataType(o.datatype)) {
    throw new StageError(Code.Internal, model, `output ${o.name}: unknown datatype ${o.datatype}`);
  }
  const flat = (o.data ?? []).flat(Number.POSITIVE_INFINITY);
  if (o.datatype === "BYTES") {
    const enc = new TextEncoder();
    return { name: o.name, datatype: "BYTES", shape: o.shape, data: flat.map((v) => enc.encode(String(v))) };
  }
  const datatype = o.datatype;
  const data = allocate(datatype, flat.length);
  const wide = datatype === "INT64" || datatype === "UINT64";
  for (let i = 0; i < flat.length; i++) {
    (data as unknown as (number | bigint)[])[i] = wide ? BigInt(flat[i] as number) : Number(flat[i]);
  }
  return { name: o.name, datatype, shape: o.shape, data } as Tensor;
}
