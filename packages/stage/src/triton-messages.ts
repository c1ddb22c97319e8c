/**
 * The words Triton uses when it refuses an inference request, so a client that matches on them
 * (tritonclient users, Triton's own qa tests) reads the same text from Trellis. Triton's core
 * checks every request against its model's config before any backend sees it, in a fixed order;
 * `checkInferRequest` does the same checks in that order, for every kind of model. The text
 * comes first; where Trellis adds a detail it follows, never replaces it.
 */
import { Code, StageError } from "./errors.js";
import type { InferRequest } from "./stage.js";
import { elementCount, elementSize, formatShape, type TensorData } from "./tensor.js";

/**
 * What Triton puts before the messages of its request normalisation: the request's id, or
 * "<id_unknown>" for a request without one. Messages Triton takes from the model's tensor
 * lookups (unexpected input or output) have no such prefix.
 */
export function requestPrefix(id: string | undefined): string {
  return `[request id: ${id || "<id_unknown>"}] `;
}

/** A Triton request refusal (INVALID_ARGUMENT), its text first and a Trellis detail after it. */
export function requestRefusal(message: string, detail?: string): StageError {
  return new StageError(Code.InvalidArgument, "", detail ? `${message} (${detail})` : message);
}

const quoted = (names: readonly string[]) => `[${names.map((n) => `'${n}'`).join(",")}]`;

/** The texts, as Triton's core words them (src/infer_request.cc, src/model.cc). */
export const tritonMessages = {
  unexpectedInput: (model: string, input: string) => `unexpected inference input '${input}' for model '${model}'`,
  unexpectedOutput: (model: string, output: string) => `unexpected inference output '${output}' for model '${model}'`,
  duplicateInput: (id: string | undefined, input: string) =>
    `${requestPrefix(id)}input '${input}' already exists in request`,
  /** Too few or too many inputs: the config's input count (or range, with optional inputs). */
  inputCount(
    id: string | undefined,
    model: string,
    configured: number,
    required: number,
    given: readonly string[],
    missing: readonly string[],
  ): string {
    const expected =
      configured === required
        ? `expected ${configured} inputs`
        : `expected number of inputs between ${required} and ${configured}`;
    // Triton's list of the missing ones reads "]" when none is missing (more inputs than the config has).
    const missingList = missing.length > 0 ? quoted(missing) : "]";
    return `${requestPrefix(id)}${expected} but got ${given.length} inputs for model '${model}'. Got input(s) ${quoted(given)}, but missing required input(s) ${missingList}. Please provide all required input(s).`;
  },
  noBatchDimension: (id: string | undefined, model: string, input: string) =>
    `${requestPrefix(id)}input '${input}' has no shape but model requires batch dimension for '${model}'`,
  batchMismatch: (id: string | undefined, model: string, input: string) =>
    `${requestPrefix(id)}input '${input}' batch size does not match other inputs for '${model}'`,
  batchTooLarge: (id: string | undefined, model: string, maxBatchSize: number) =>
    `${requestPrefix(id)}inference request batch-size must be <= ${maxBatchSize} for '${model}'`,
  datatype: (id: string | undefined, model: string, input: string, given: string, expected: string) =>
    `${requestPrefix(id)}inference input '${input}' data-type is '${given}', but model '${model}' expects '${expected}'`,
  /** `expected` is the full shape a client sends (with -1 for the batch when the model batches). */
  shape(id: string | undefined, model: string, input: string, expected: readonly number[], given: readonly number[]) {
    const batching = expected.length > 0 && expected[0] === -1;
    const note = batching
      ? "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
      : "";
    return `${requestPrefix(id)}unexpected shape for input '${input}' for model '${model}'. Expected ${formatShape(expected)}, got ${formatShape(given)}. ${note}`;
  },
  byteSize: (id: string | undefined, model: string, input: string, expected: number, given: number) =>
    `${requestPrefix(id)}input byte size mismatch for input '${input}' for model '${model}'. Expected ${expected}, got ${given}`,
  stringCount: (id: string | undefined, model: string, input: string, expected: number, given: number) =>
    `${requestPrefix(id)}expected ${expected} string elements for inference input '${input}' for model '${model}', got ${given}`,
  /** More elements than the shape holds: Triton stops counting at the first one too many. */
  stringCountOver: (id: string | undefined, model: string, input: string, expected: number) =>
    `${requestPrefix(id)}unexpected number of string elements ${expected + 1} for inference input '${input}' for model '${model}', expecting ${expected}`,
  stringLengthIndicator: (id: string | undefined, model: string, input: string, available: number) =>
    `${requestPrefix(id)}incomplete string length indicator for inference input '${input}' for model '${model}', expecting 4 bytes but only ${available} bytes available. Please make sure the string length indicator is in one buffer.`,
  /** Load and unload: a name empty once trimmed of whitespace (core's ValidateModelName). */
  emptyModelName: () => "Model name cannot be empty. Please enter a valid name to deploy.",
  /** Load and unload: a name that is ".." or holds '/', once trimmed (core's ValidateModelName). */
  modelNamePathTraversal: (name: string) =>
    `invalid model name '${name}', model name must not contain path traversal characters`,
};

/** A model input as a request is checked against it; `dims` without the batch dimension. */
export interface RequestInputSpec {
  name: string;
  datatype: string;
  dims: readonly number[];
  optional?: boolean;
  /** Accept this shape too (a Trellis leniency, e.g. [N] for [N,1]); the batch dim included. */
  alsoAccepts?: (shape: readonly number[]) => boolean;
}

/** What `checkInferRequest` checks a request against. */
export interface RequestSpec {
  model: string;
  maxBatchSize: number;
  inputs: readonly RequestInputSpec[];
  /** The model's outputs, for the names a request may ask for; undefined leaves them unchecked. */
  outputs?: readonly string[];
  /** Names listed after Triton's text when an input or output is unknown. */
  detail?: boolean;
  /** Take a batch of 0 (answered with an empty batch) instead of refusing it. */
  emptyBatch?: boolean;
}

/**
 * Checks a request against its model as Triton's core does, in the same order (requested
 * outputs, input count, input names, batch dimension, batch size, then each input's data-type,
 * shape and element count), throwing INVALID_ARGUMENT with Triton's text. Returns the batch
 * size (1 when the model does not batch). Trellis also refuses a batch of 0, which Triton lets
 * through to fail later on its byte count (unless `emptyBatch`).
 */
export function checkInferRequest(request: InferRequest, spec: RequestSpec): number {
  const { model } = spec;
  const id = request.id;
  const specs = new Map(spec.inputs.map((s) => [s.name, s]));
  const seen = new Set<string>();
  for (const t of request.inputs) {
    if (seen.has(t.name)) throw requestRefusal(tritonMessages.duplicateInput(id, t.name));
    seen.add(t.name);
  }
  if (spec.outputs) {
    for (const o of request.outputs ?? []) {
      if (!spec.outputs.includes(o.name)) {
        throw requestRefusal(
          tritonMessages.unexpectedOutput(model, o.name),
          spec.detail === false ? undefined : `its outputs: ${spec.outputs.join(", ")}`,
        );
      }
    }
  }
  const required = spec.inputs.filter((s) => !s.optional);
  const countRefusal = (missing: string[]) =>
    requestRefusal(
      tritonMessages.inputCount(
        id,
        model,
        spec.inputs.length,
        required.length,
        request.inputs.map((t) => t.name),
        missing,
      ),
    );
  if (request.inputs.length > spec.inputs.length || request.inputs.length < required.length) {
    throw countRefusal(required.filter((s) => !seen.has(s.name)).map((s) => s.name));
  }
  for (const t of request.inputs) {
    if (!specs.has(t.name)) {
      throw requestRefusal(
        tritonMessages.unexpectedInput(model, t.name),
        spec.detail === false ? undefined : `its inputs: ${spec.inputs.map((s) => s.name).join(", ")}`,
      );
    }
  }
  // Every input is known; a required one not given is caught here when the count matched.
  const absent = required.find((s) => !seen.has(s.name));
  if (absent) throw countRefusal([absent.name]);
  const batching = spec.maxBatchSize > 0;
  let batch: number | undefined;
  if (batching) {
    for (const t of request.inputs) {
      if (t.shape.length === 0) throw requestRefusal(tritonMessages.noBatchDimension(id, model, t.name));
      const b = t.shape[0]!;
      if (batch === undefined) batch = b;
      else if (b !== batch) {
        throw requestRefusal(tritonMessages.batchMismatch(id, model, t.name), `${b}, not ${batch}`);
      }
    }
    if (batch !== undefined && batch > spec.maxBatchSize) {
      throw requestRefusal(tritonMessages.batchTooLarge(id, model, spec.maxBatchSize), `got ${batch}`);
    }
  }
  for (const t of request.inputs) {
    const s = specs.get(t.name)!;
    if (t.datatype !== s.datatype)
      throw requestRefusal(tritonMessages.datatype(id, model, t.name, t.datatype, s.datatype));
    const expected = batching ? [-1, ...s.dims] : [...s.dims];
    const fits =
      (t.shape.length === expected.length && expected.every((d, i) => d === -1 || d === t.shape[i])) ||
      (s.alsoAccepts?.(t.shape) ?? false);
    if (!fits) throw requestRefusal(tritonMessages.shape(id, model, t.name, expected, t.shape));
    const count = elementCount(t.shape);
    const length = (t.data as TensorData).length;
    if (length !== count) {
      const size = elementSize(t.datatype);
      throw requestRefusal(
        size > 0
          ? tritonMessages.byteSize(id, model, t.name, count * size, length * size)
          : tritonMessages.stringCount(id, model, t.name, count, length),
      );
    }
  }
  if (batching && batch !== undefined && batch < 1 && !spec.emptyBatch) {
    throw requestRefusal(`batch size must be at least 1 for '${model}', got ${batch}`);
  }
  return batching ? (batch ?? 1) : 1;
}

/**
 * Triton's answer to a request its model's full queue cannot take: UNAVAILABLE (HTTP 503), worth
 * retrying later, "Exceeds maximum queue size" first, then how many wait and which bound is full.
 * The one place this refusal is made, whichever bound refused (max_queue_size of a priority
 * level, the server's --default-max-queue-size, an ensemble's tightest step).
 */
export function queueFullRefusal(model: string, waiting: string, bound: string): StageError {
  return new StageError(Code.Unavailable, model, `Exceeds maximum queue size: ${waiting}, ${bound}`);
}
