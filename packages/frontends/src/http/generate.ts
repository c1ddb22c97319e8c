/**
 * Triton's generate extension (HTTP/REST only): POST
 * /v2/models/{m}[/versions/{v}]/generate and /generate_stream take one JSON
 * object instead of a tensor list. Its fields named after the model's inputs
 * become those inputs (a scalar or a flat array of values, shaped by the
 * model's dims), and its other fields, with those under "parameters", become
 * request parameters (a field under "parameters" named after an input is that
 * input). Each answer is {"model_name", "model_version", <output>: value, ...}:
 * an output of one element as that value, others as flat arrays, BYTES as
 * text. This is Triton's exact mapping, the only one it implements.
 */
import {
  Code,
  type InferRequest,
  type InferResponse,
  StageError,
  type StageMetadata,
  type Tensor,
} from "@trellis/stage";
import { type JsonTensor, parametersFromJson, tensorFromJson, tensorToJsonData } from "./json.js";

const bad = (message: string) => new StageError(Code.InvalidArgument, "", message);

/**
 * The shape `count` values take for an input of `shape` (metadata's: -1 where any size goes,
 * the batch dimension included): a batch of 1, the variable dimension that is left holding
 * what the fixed ones do not (the others 1).
 */
function shapeFor(name: string, shape: number[], count: number, batched: boolean): number[] {
  const dims = shape.map((d, i) => (batched && i === 0 ? 1 : d));
  const fixed = dims.filter((d) => d >= 0).reduce((a, b) => a * b, 1);
  const variable = dims.flatMap((d, i) => (d < 0 ? [i] : []));
  const last = variable.at(-1);
  if (last === undefined || fixed === 0 || count % fixed !== 0) {
    if (last === undefined && fixed === count) return dims;
    throw bad(
      `input '${name}': ${count} value${count === 1 ? "" : "s"} given, which shape [${shape.join(",")}] cannot hold`,
    );
  }
  return dims.map((d, i) => (i === last ? count / fixed : d < 0 ? 1 : d));
}

function inputTensor(name: string, value: unknown, md: StageMetadata["inputs"][number], batched: boolean): Tensor {
  const values = Array.isArray(value) ? value : [value];
  const tensor: JsonTensor = {
    name,
    datatype: md.datatype,
    shape: shapeFor(name, md.shape, values.length, batched),
    data: values,
  };
  return tensorFromJson(tensor);
}

/** The inference request a generate request body makes for a model with this metadata. */
export function generateRequest(body: unknown, metadata: StageMetadata, batched: boolean): InferRequest {
  if (!body || typeof body !== "object" || Array.isArray(body)) throw bad("the generate request must be a JSON object");
  const inputs = new Map(metadata.inputs.map((i) => [i.name, i]));
  const tensors: Tensor[] = [];
  const loose: Record<string, unknown> = {};
  const take = (key: string, value: unknown) => {
    const input = inputs.get(key);
    if (input) tensors.push(inputTensor(key, value, input, batched));
    else loose[key] = value;
  };
  const { parameters, ...fields } = body as Record<string, unknown>;
  for (const [key, value] of Object.entries(fields)) take(key, value);
  if (parameters !== undefined) {
    if (!parameters || typeof parameters !== "object" || Array.isArray(parameters)) {
      throw bad("the generate request's 'parameters' must be an object");
    }
    for (const [key, value] of Object.entries(parameters)) take(key, value);
  }
  const missing = metadata.inputs.filter((i) => !tensors.some((t) => t.name === i.name)).map((i) => i.name);
  if (missing.length > 0) {
    throw bad(
      `the generate request has no field for input${missing.length > 1 ? "s" : ""} ${missing.map((m) => `'${m}'`).join(", ")} (the model's inputs are ${metadata.inputs.map((i) => i.name).join(", ")})`,
    );
  }
  const params = parametersFromJson(loose, "generate request");
  return { inputs: tensors, ...(params && Object.keys(params).length > 0 ? { parameters: params } : {}) };
}

/** A response as a generate answer: its outputs by name (one element as a value), and its parameters. */
export function generateAnswer(response: InferResponse): Record<string, unknown> {
  const answer: Record<string, unknown> = {
    model_name: response.modelName,
    model_version: response.modelVersion,
  };
  for (const [key, value] of Object.entries(response.parameters ?? {})) answer[key] = value;
  for (const t of response.outputs) {
    const data = tensorToJsonData(t);
    answer[t.name] = data.length === 1 ? data[0] : data;
  }
  return answer;
}
