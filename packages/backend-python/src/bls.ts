/**
 * What a model asks of the server while it runs (Triton's BLS): `InferenceRequest.exec()` /
 * `async_exec()` (several at once: each call carries its own id), `exec(decoupled=True)` (every
 * response of a decoupled model, bounded), and model control (`pb_utils.is_model_ready`; loading
 * and unloading stay with the repository API). Each answer is a `bls_result` frame with the call's
 * id; a decoupled call's responses come one frame each, as the callee sends them.
 */
import type { InferResponse, ModelCaller, Parameters } from "@trellis/stage";
import { Code } from "@trellis/stage";
import { tritonCodeOf } from "./codes.js";
import { decodeTensor, encodeFrame, encodeTensors, type Frame, type TensorMeta } from "./frames.js";

/** Most responses one `exec(decoupled=True)` passes to the model; past it the call ends with an error response, named. */
export const MAX_BLS_STREAM_RESPONSES = 1024;

/** A request's parameters as Triton's `request.parameters()` gives them: JSON text of key → value. */
export function parametersJson(parameters: Parameters | undefined): string {
  const plain: Record<string, string | number | boolean> = {};
  for (const [key, value] of Object.entries(parameters ?? {})) {
    plain[key] =
      typeof value === "bigint" ? (Number.isSafeInteger(Number(value)) ? Number(value) : String(value)) : value;
  }
  return JSON.stringify(plain);
}

/** Parameters a model gave (checked in pb_utils: bool, int or str values). */
export function parametersFromJson(value: unknown): Parameters {
  const parsed = typeof value === "string" ? (JSON.parse(value) as unknown) : value;
  const parameters: Parameters = {};
  if (!parsed || typeof parsed !== "object") return parameters;
  for (const [key, v] of Object.entries(parsed as Record<string, unknown>)) {
    if (typeof v === "string" || typeof v === "boolean") parameters[key] = v;
    else if (typeof v === "number") parameters[key] = Number.isInteger(v) ? BigInt(v) : v;
  }
  return parameters;
}

function errorReply(id: unknown, e: unknown): Buffer {
  const code = typeof (e as { code?: unknown }).code === "number" ? (e as { code: Code }).code : Code.Internal;
  const message = (e as { rawMessage?: string }).rawMessage ?? (e as Error).message ?? String(e);
  return encodeFrame({ type: "bls_result", id, error: message, code: tritonCodeOf(code) });
}

class BlsError extends Error {
  constructor(
    readonly code: Code,
    message: string,
  ) {
    super(message);
  }
}

function wireResponse(response: InferResponse, parts: Uint8Array[], offset: number) {
  const outputs = encodeTensors(response.outputs, parts, offset);
  const parameters = response.parameters ? JSON.parse(parametersJson(response.parameters)) : undefined;
  return { outputs, ...(parameters && Object.keys(parameters).length ? { parameters } : {}) };
}

/**
 * Runs one BLS request on the server's models and sends its answer frames: one `bls_result`
 * (or an error reply) for `exec()`; for `exec(decoupled=True)` one frame per response as it comes
 * (`more: true`), then a last one (`done: true`, or an error reply), so the model iterates the
 * responses as the callee sends them. A stream is bounded in responses and bytes. `send` says
 * whether the stub that asked still listens.
 */
export async function answerModelCall(
  models: ModelCaller | undefined,
  frame: Frame,
  maxReplyBytes: number,
  send: (reply: Buffer) => boolean,
): Promise<void> {
  const { header, body } = frame;
  try {
    if (!models) throw new BlsError(Code.Unimplemented, "BLS needs the server's models");
    const inputs = (header.inputs as TensorMeta[]).map((m) => decodeTensor(m, body));
    const outputs = (header.outputs as string[]).map((name) => ({ name }));
    const parameters = parametersFromJson(header.parameters ?? "{}");
    const request = { inputs, outputs, ...(Object.keys(parameters).length ? { parameters } : {}) };
    const version = typeof header.version === "string" && header.version ? { version: header.version } : {};
    const model = String(header.model);
    if (header.decoupled !== true) {
      const parts: Uint8Array[] = [];
      const answer = await models.infer(model, request, version);
      send(encodeFrame({ type: "bls_result", id: header.id, ...wireResponse(answer, parts, 0) }, parts));
      return;
    }
    let count = 0;
    let bytes = 0;
    for await (const answer of models.inferStream(model, request, version)) {
      if (count === MAX_BLS_STREAM_RESPONSES)
        throw new BlsError(
          Code.ResourceExhausted,
          `exec(decoupled=True): model "${model}" sent more than ${MAX_BLS_STREAM_RESPONSES} responses`,
        );
      const parts: Uint8Array[] = [];
      const response = wireResponse(answer, parts, 0);
      bytes += parts.reduce((n, p) => n + p.byteLength, 0);
      if (bytes > maxReplyBytes)
        throw new BlsError(
          Code.ResourceExhausted,
          `exec(decoupled=True): model "${model}"'s responses passed ${maxReplyBytes} bytes`,
        );
      count++;
      // The model that asked is gone: stop pulling (leaving the loop ends the callee's stream).
      if (!send(encodeFrame({ type: "bls_result", id: header.id, more: true, response }, parts))) return;
    }
    send(encodeFrame({ type: "bls_result", id: header.id, done: true }));
  } catch (e) {
    send(errorReply(header.id, e));
  }
}

/** pb_utils.is_model_ready / load_model / unload_model. */
export async function answerControl(models: ModelCaller | undefined, header: Frame["header"]): Promise<Buffer> {
  try {
    const model = String(header.model);
    if (header.action === "ready") {
      const version = typeof header.version === "string" && header.version ? header.version : undefined;
      const ready = models ? await models.isReady(model, version) : false;
      return encodeFrame({ type: "bls_result", id: header.id, ready });
    }
    // Loading runs code and reads files on the server: the repository API's to do, with its checks.
    throw new BlsError(
      Code.Unimplemented,
      `pb_utils.${header.action === "load" ? "load_model" : "unload_model"}("${model}"): a Trellis model does not load or unload models; use the repository API (POST /v2/repository/models/${model}/${header.action === "load" ? "load" : "unload"})`,
    );
  } catch (e) {
    return errorReply(header.id, e);
  }
}
