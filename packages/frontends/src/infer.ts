/**
 * The one infer path both frontends take: the model resolved in the registry, the wire request
 * decoded into the stage's request, forwarded headers merged into its parameters, its options
 * read, a sampled request traced, the stage run (once, or for every answer of a decoupled model),
 * each answer encoded back, and errors as the client may see them (clientError; the withheld
 * detail logged). A frontend supplies only its wire format: a decoder (JSON and binary tensors
 * for HTTP/REST, protobuf for gRPC, each reading shared memory inputs) that returns the request
 * with the encoder for its answers (writing shared memory outputs).
 */
import { clientError, type ModelRegistry } from "@trellis/kserve";
import type { InferOptions, InferRequest, InferResponse, Parameters, RequestTrace, Stage } from "@trellis/stage";
import { answersOf } from "@trellis/stage/backend";
import { withForwardedHeaders } from "./header-forwarding.js";
import type { TraceControl } from "./trace-settings.js";

/** A wire request decoded for its stage, with how its answers go back. */
export interface DecodedInfer<Answer> {
  request: InferRequest;
  /**
   * The options the request asks for (priority, timeout; those parameters refused when of the
   * wrong type), read once forwarded headers have joined `request.parameters`.
   */
  options(request: InferRequest): InferOptions;
  /** One answer in the wire's form. */
  encode(response: InferResponse): Answer;
}

/** A frontend's decoder: the wire request for `stage` (the model it names, resolved). */
export type InferDecoder<Answer> = (stage: Stage) => DecodedInfer<Answer> | Promise<DecodedInfer<Answer>>;

/** One call's model, and what the frontend knows of the call besides its message. */
export interface InferCall {
  registry: ModelRegistry;
  model: string;
  version: string;
  /** The call's: aborts when the client goes away or its deadline passes. */
  signal: AbortSignal;
  tracing?: TraceControl;
  /** The call's headers (a W3C traceparent continues the caller's trace). */
  header?: (name: string) => string | undefined;
  /** Parameters from the call's forwarded headers; the request's own parameters win over them. */
  forwarded?: Parameters;
  /** Hears of error detail withheld from the client (see clientError). */
  withheld?: (detail: string, sent: string) => void;
  /**
   * Takes over a sampled request's trace as it begins (stamps the call's receive times, ends it
   * once the answer is sent); without it the path ends the trace after the last answer.
   */
  traced?: (trace: RequestTrace) => void;
}

/** A request ready to run: its stage, the stage's request and options, and its answers' encoder. */
export interface PreparedInfer<Answer> {
  stage: Stage;
  request: InferRequest;
  options: InferOptions;
  encode(response: InferResponse): Answer;
}

/** The call's request resolved, decoded, with forwarded headers, options and (when sampled) its trace. */
export async function prepareInfer<A>(call: InferCall, decode: InferDecoder<A>): Promise<PreparedInfer<A>> {
  const stage = call.registry.resolve(call.model, call.version);
  const { request, options, encode } = await decode(stage);
  if (call.forwarded) request.parameters = withForwardedHeaders(request.parameters, call.forwarded);
  const prepared = { stage, request, options: { ...options(request), signal: call.signal }, encode };
  const trace = call.tracing?.begin(stage.name, stage.version, request.id, call.header);
  if (trace) {
    prepared.options.trace = trace;
    call.traced?.(trace);
  }
  return prepared;
}

/** Runs the call's request once and encodes its answer; errors as the client may see them. */
export async function inferOnce<A>(call: InferCall, decode: InferDecoder<A>): Promise<A> {
  let prepared: PreparedInfer<A> | undefined;
  try {
    prepared = await prepareInfer(call, decode);
    return prepared.encode(await prepared.stage.infer(prepared.request, prepared.options));
  } catch (err) {
    throw clientError(err, call.withheld);
  } finally {
    if (!call.traced) prepared?.options.trace?.end();
  }
}

/**
 * The call's answers: a decoupled model's responses as it sends them (Stage.inferStream), else
 * its one answer, each encoded. Whether the model is decoupled is known before the first answer.
 * The request is prepared first: its errors reject the promise, as the client may see them.
 */
export async function inferAnswers<A>(
  call: InferCall,
  decode: InferDecoder<A>,
): Promise<{ decoupled: boolean; answers: AsyncGenerator<A> }> {
  let prepared: PreparedInfer<A>;
  try {
    prepared = await prepareInfer(call, decode);
  } catch (err) {
    throw clientError(err, call.withheld);
  }
  const { stage, request, options, encode } = prepared;
  async function* encoded() {
    try {
      for await (const answer of answersOf(stage, request, options)) yield encode(answer);
    } catch (err) {
      throw clientError(err, call.withheld);
    } finally {
      if (!call.traced) options.trace?.end();
    }
  }
  return { decoupled: stage.inferStream !== undefined, answers: encoded() };
}
