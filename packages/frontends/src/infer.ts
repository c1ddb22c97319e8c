/**
 * The one infer path both frontends take: the model resolved in the registry, the wire request
 * decoded into the stage's request and its options (forwarded headers merged where the wire
 * says), a sampled request traced, the stage run (once, or for every answer of a decoupled model),
 * each answer encoded back, and errors as the client may see them (clientError; the withheld
 * detail logged). A frontend supplies only its wire format: a decoder (JSON and binary tensors
 * for HTTP/REST, protobuf for gRPC, each reading shared memory inputs) that returns the request
 * with the encoder for its answers (writing shared memory outputs).
 */
import { clientError, type ModelRegistry } from "@trellis/kserve";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  type RequestTrace,
  type Stage,
  StageError,
} from "@trellis/stage";
import { answersOf, requestPrefix, TRACE_REPLY_PARAMETER } from "@trellis/stage/backend";
import type { BytesInFlight } from "./bytes-in-flight.js";
import type { TraceControl } from "./trace-settings.js";

/** A wire request decoded for its stage, with how its answers go back. */
export interface DecodedInfer<Answer> {
  /** The stage's request, with the call's forwarded headers among its parameters. */
  request: InferRequest;
  /**
   * The options the request asks for (priority, timeout; those parameters refused when of the
   * wrong type): a fresh object of this request's, which the path completes (signal, trace).
   */
  options: InferOptions;
  /** One answer in the wire's form. */
  encode(response: InferResponse): Answer;
}

/** A frontend's decoder: the wire request for `stage` (the model it names, resolved). */
export type InferDecoder<Answer> = (stage: Stage) => DecodedInfer<Answer>;

/** One call's model, and what the frontend knows of the call besides its message. */
export interface InferCall {
  registry: ModelRegistry;
  model: string;
  version: string;
  /** The model already resolved for the call, when the frontend looked it up itself. */
  stage?: Stage;
  /** The call's: aborts when the client goes away or its deadline passes. */
  signal: AbortSignal;
  tracing?: TraceControl;
  /** The server-wide bound on BYTES tensors in flight: the request's reserve theirs until it is answered. */
  bytesInFlight?: BytesInFlight;
  /** The call's headers (a W3C traceparent continues the caller's trace). */
  header?: (name: string) => string | undefined;
  /** Hears of error detail withheld from the client (see clientError). */
  withheld?: (detail: string, sent: string) => void;
  /**
   * Takes over a sampled request's trace as it begins (stamps the call's receive times, ends it
   * once the answer is sent); without it the path ends the trace after the last answer.
   */
  traced?: (trace: RequestTrace) => void;
}

/** A logger's report of error detail withheld from a client (see clientError); none without its warn. */
export function loggingWithheld(
  logger: { warn?(obj: object, msg?: string): void } | undefined,
): ((detail: string, sent: string) => void) | undefined {
  return logger?.warn && ((detail, sent) => logger.warn?.({ detail, sent }, "error detail withheld from the client"));
}

/** A request ready to run: its stage, the stage's request and options, and its answers' encoder. */
export interface PreparedInfer<Answer> extends DecodedInfer<Answer> {
  stage: Stage;
  /** Gives back what its BYTES inputs reserved (see InferCall.bytesInFlight); safe to call twice. */
  release(): void;
}

/** As Triton's core (InferenceRequest::AddOriginalRequestedOutput): an output asked for twice is refused. */
function refuseDuplicateOutputs(request: InferRequest): void {
  if (!request.outputs || request.outputs.length < 2) return;
  const seen = new Set<string>();
  for (const { name } of request.outputs) {
    if (seen.has(name)) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `${requestPrefix(request.id)}output '${name}' already exists in request`,
      );
    }
    seen.add(name);
  }
}

/** The call's request resolved, decoded, with its options, the call's signal and (when sampled) its trace. */
export function prepareInfer<A>(call: InferCall, decode: InferDecoder<A>): PreparedInfer<A> {
  const stage = call.stage ?? call.registry.resolve(call.model, call.version);
  const { request, options, encode } = decode(stage);
  refuseDuplicateOutputs(request);
  // Before the model's queue and anything it does per element: a refusal costs the wire's read only.
  const release = call.bytesInFlight?.reserve(request, stage.name) ?? (() => undefined);
  options.signal = call.signal;
  try {
    const trace = call.tracing?.begin(stage.name, stage.version, request.id, call.header);
    if (trace) {
      options.trace = trace;
      call.traced?.(trace);
    }
  } catch (err) {
    release();
    throw err;
  }
  return { stage, request, options, encode, release };
}

/** The response with the request's trace among its parameters, when a calling Trellis server asked for it back. */
function withTraceReply(response: InferResponse, trace: RequestTrace | undefined): InferResponse {
  const reply = trace?.reply?.();
  if (reply === undefined) return response;
  return { ...response, parameters: { ...response.parameters, [TRACE_REPLY_PARAMETER]: reply } };
}

/** Runs the call's request once and encodes its answer; errors as the client may see them. */
export async function inferOnce<A>(call: InferCall, decode: InferDecoder<A>): Promise<A> {
  let prepared: PreparedInfer<A> | undefined;
  try {
    prepared = prepareInfer(call, decode);
    return prepared.encode(
      withTraceReply(await prepared.stage.infer(prepared.request, prepared.options), prepared.options.trace),
    );
  } catch (err) {
    throw clientError(err, call.withheld);
  } finally {
    prepared?.release();
    if (!call.traced) prepared?.options.trace?.end();
  }
}

/**
 * The call's answers: a decoupled model's responses as it sends them (Stage.inferStream), else
 * its one answer, each encoded. Whether the model is decoupled is known before the first answer.
 * The request is prepared first: its errors are thrown, as the client may see them.
 */
export function inferAnswers<A>(
  call: InferCall,
  decode: InferDecoder<A>,
): { decoupled: boolean; answers: AsyncGenerator<A> } {
  let prepared: PreparedInfer<A>;
  try {
    prepared = prepareInfer(call, decode);
  } catch (err) {
    throw clientError(err, call.withheld);
  }
  const { stage, request, options, encode, release } = prepared;
  // A stream the caller never reads to its end still gives its reservation back when the call ends.
  call.signal.addEventListener("abort", release, { once: true });
  async function* encoded() {
    try {
      for await (const answer of answersOf(stage, request, options)) yield encode(answer);
    } catch (err) {
      throw clientError(err, call.withheld);
    } finally {
      // A stream's calls share its signal: the listener goes with the request.
      call.signal.removeEventListener("abort", release);
      release();
      if (!call.traced) options.trace?.end();
    }
  }
  return { decoupled: stage.inferStream !== undefined, answers: encoded() };
}
