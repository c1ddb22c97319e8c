/**
 * The gRPC frontend's ModelInfer over the shared infer path (../infer.ts): the protobuf request
 * decoded for its stage (shared memory inputs read, Triton's stream-only parameter taken off),
 * each answer encoded as a ModelInferResponse (shared memory outputs written).
 */
import { create } from "@bufbuild/protobuf";
import { inferOptionsFromParameters, type ModelRegistry } from "@trellis/kserve";
import {
  inferRequestFromWire,
  inferResponseToWire,
  namesSharedMemory,
  parametersFromWire,
  parametersToWire,
  type SharedMemoryRef,
  type SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  tensorFromContents,
  tensorToRaw,
  withoutSharedMemory,
} from "@trellis/kserve/wire";
import { type ModelInferRequest, ModelInferRequestSchema, type ModelInferResponse } from "@trellis/protocol";
import { Code, type InferRequest, type InferResponse, type Parameters, StageError } from "@trellis/stage";
import type { BytesInFlight } from "../bytes-in-flight.js";
import { withForwardedHeaders } from "../header-forwarding.js";
import { type InferCall, type InferDecoder, inferAnswers, inferOnce } from "../infer.js";
import type { TraceControl } from "../trace-settings.js";
import type { GrpcCallTimes } from "./model-infer.js";

/** What a ModelInfer call has besides its message: tracing, what the call can tell, shared memory. */
export interface ModelInferContext {
  tracing?: TraceControl;
  /** The bound on BYTES tensors in flight the request's reserve theirs in. */
  bytesInFlight?: BytesInFlight;
  /** Regions the request may name for its inputs and outputs. */
  sharedMemory?: SystemSharedMemory;
  /** The direct gRPC path's call: its read times go on the trace, which the path finishes once the answer is sent. */
  call?: GrpcCallTimes;
  /** The call's headers (a W3C traceparent continues the caller's trace). */
  header?: (name: string) => string | undefined;
  /** Parameters from the call's forwarded headers; the request's own parameters win over them. */
  forwarded?: Parameters;
  /** Hears of error detail withheld from the client (see clientError). */
  withheld?: (detail: string, sent: string) => void;
}

/** Triton's request parameter asking that a stream's last answer to the request say so, and the answer's flag. */
export const EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response";
export const FINAL_RESPONSE = "triton_final_response";

/**
 * Takes Triton's triton_enable_empty_final_response off the request: it is the stream's
 * setting (see InferStream), not the model's; refused unless it is a bool, as in Triton.
 */
function dropFinalResponseFlag(request: InferRequest, model: string): void {
  const value = request.parameters?.[EMPTY_FINAL_RESPONSE];
  if (value === undefined) return;
  if (typeof value !== "boolean") {
    throw new StageError(
      Code.InvalidArgument,
      model,
      `invalid value type for '${EMPTY_FINAL_RESPONSE}' parameter, expected bool_param`,
    );
  }
  const { [EMPTY_FINAL_RESPONSE]: _, ...rest } = request.parameters ?? {};
  request.parameters = Object.keys(rest).length > 0 ? rest : undefined;
}

/** The infer path's call for a ModelInfer message; `signal` is the call's. */
function grpcCall(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  { tracing, bytesInFlight, call, header, withheld }: ModelInferContext,
): InferCall {
  return {
    registry,
    model: msg.modelName,
    version: msg.modelVersion,
    signal,
    tracing,
    bytesInFlight,
    header: header ?? call?.header,
    withheld,
    // The direct path stamps the send and ends the trace once the answer is out.
    traced:
      call &&
      ((trace) => {
        trace.stamp("GRPC_WAITREAD_START", call.readStartNs);
        trace.stamp("GRPC_WAITREAD_END", call.readEndNs);
        call.trace = trace;
      }),
  };
}

/**
 * The ModelInfer decoder: the message read for its stage (shared memory inputs, the stream's
 * final-response flag taken off, forwarded headers joining its parameters), its options read
 * from those parameters, and its answers as ModelInferResponses (shared memory outputs written).
 */
function decodeModelInfer(
  msg: ModelInferRequest,
  { sharedMemory, forwarded }: ModelInferContext,
): InferDecoder<ModelInferResponse> {
  return (stage) => {
    const shm = withSharedMemoryInputs(msg, sharedMemory);
    const request = inferRequestFromWire(shm.msg, stage.name);
    dropFinalResponseFlag(request, stage.name);
    if (forwarded) request.parameters = withForwardedHeaders(request.parameters, forwarded);
    const encode =
      sharedMemory && shm.outputs.size > 0
        ? (answer: InferResponse) => writeSharedMemoryOutputs(inferResponseToWire(answer), shm.outputs, sharedMemory)
        : inferResponseToWire;
    // Priority, timeout, sequence_id, sequence_start and sequence_end refused when of the wrong type.
    return { request, options: inferOptionsFromParameters(request.parameters, stage.name), encode };
  };
}

/**
 * Runs one ModelInfer against the registry; `signal` is the call's. Errors come back as ConnectErrors.
 * With `tracing`, a sampled request is traced; with `sharedMemory`, it may name regions (see ModelInferContext).
 */
export function handleModelInfer(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  context: ModelInferContext = {},
): Promise<ModelInferResponse> {
  return inferOnce(grpcCall(registry, msg, signal, context), decodeModelInfer(msg, context));
}

/**
 * One ModelStreamInfer request's answers: a decoupled model's responses as it sends them
 * (Stage.inferStream), else its one answer. Whether the model is decoupled is known before
 * the first answer, for the stream's final-response flags.
 */
export function streamModelInfer(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  context: ModelInferContext,
): { decoupled: boolean; responses: AsyncGenerator<ModelInferResponse> } {
  const call = grpcCall(registry, msg, signal, context);
  const { decoupled, answers } = inferAnswers(call, decodeModelInfer(msg, context));
  return { decoupled, responses: answers };
}

/** Which inputs and outputs name shared memory regions, as refs (undefined for an input that does not). */
function sharedMemoryRefs(msg: ModelInferRequest): {
  inputs: (SharedMemoryRef | undefined)[];
  outputs: Map<string, SharedMemoryRef>;
} {
  const inputs = msg.inputs.map((i) => sharedMemoryRef(parametersFromWire(i.parameters), `input ${i.name}`));
  const outputs = new Map<string, SharedMemoryRef>();
  for (const o of msg.outputs) {
    const ref = sharedMemoryRef(parametersFromWire(o.parameters), `output ${o.name}`);
    if (ref) outputs.set(o.name, ref);
  }
  return { inputs, outputs };
}

/**
 * The request with every input's bytes in raw_input_contents (those naming a shared memory
 * region read from it), and requested outputs without their shared_memory_* parameters, which
 * come back separately by output name. raw_input_contents may list only the inputs not in
 * shared memory (as tritonclient sends it) or one entry per input.
 */
function withSharedMemoryInputs(
  msg: ModelInferRequest,
  sharedMemory: SystemSharedMemory | undefined,
): { msg: ModelInferRequest; outputs: Map<string, SharedMemoryRef> } {
  // The common case, no region named, costs two key lookups per tensor.
  if (
    !msg.inputs.some((i) => namesSharedMemory(i.parameters)) &&
    !msg.outputs.some((o) => namesSharedMemory(o.parameters))
  ) {
    return { msg, outputs: new Map() };
  }
  if (!sharedMemory) throw sharedMemoryNotTaken();
  const refs = sharedMemoryRefs(msg);
  const requested = msg.outputs.map((o) =>
    refs.outputs.has(o.name)
      ? { ...o, parameters: parametersToWire(withoutSharedMemory(parametersFromWire(o.parameters))) }
      : o,
  );
  return {
    msg: create(ModelInferRequestSchema, {
      ...msg,
      inputs: msg.inputs.map((i) => ({ ...i, contents: undefined })),
      outputs: requested,
      rawInputContents: inputContents(msg, refs.inputs, sharedMemory),
    }),
    outputs: refs.outputs,
  };
}

/** Every input's bytes: read from its region, its raw_input_contents entry, or its typed contents. */
function inputContents(
  msg: ModelInferRequest,
  inputRefs: (SharedMemoryRef | undefined)[],
  sharedMemory: SystemSharedMemory,
): Uint8Array[] {
  const raw = msg.rawInputContents;
  const inShm = inputRefs.filter(Boolean).length;
  const byIndex = raw.length === msg.inputs.length;
  if (raw.length > 0 && !byIndex && raw.length !== msg.inputs.length - inShm) {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `raw_input_contents has ${raw.length} entries for ${msg.inputs.length} inputs, ${inShm} of them in shared memory`,
    );
  }
  let next = 0;
  return msg.inputs.map((input, i) => {
    const ref = inputRefs[i];
    if (ref) {
      if (byIndex) next++;
      return sharedMemory.read(ref, `input ${input.name}`);
    }
    const bytes = raw.length > 0 ? raw[byIndex ? i : next++] : undefined;
    if (bytes && input.contents) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `contents field must not be specified when using raw_input_contents for '${input.name}' for model '${msg.modelName}'`,
      );
    }
    if (bytes) return bytes;
    // An input sent as typed contents, among others in shared memory: its bytes too.
    if (!input.contents) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `input ${input.name}: no data (neither contents nor raw_input_contents)`,
      );
    }
    return tensorToRaw(tensorFromContents("input", input, input.contents));
  });
}

/** Writes each output the request placed in shared memory there; its answer says where, and carries no bytes. */
function writeSharedMemoryOutputs(
  response: ModelInferResponse,
  refs: Map<string, SharedMemoryRef>,
  sharedMemory: SystemSharedMemory,
): ModelInferResponse {
  response.outputs.forEach((output, i) => {
    const ref = refs.get(output.name);
    if (!ref) return;
    const bytes = response.rawOutputContents[i] ?? new Uint8Array(0);
    sharedMemory.write(ref, bytes, `output ${output.name}`);
    output.parameters = {
      ...output.parameters,
      ...parametersToWire(sharedMemoryOutputParameters(ref, bytes.byteLength)),
    };
    // Kept in place (empty), so raw_output_contents stays one entry per output.
    response.rawOutputContents[i] = new Uint8Array(0);
  });
  return response;
}
