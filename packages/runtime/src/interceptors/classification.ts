/**
 * Triton's classification extension as an interceptor: an output asked for with the
 * `classification` parameter is answered as the top-k classes of what the model computed
 * ("score:index[:label]" strings), whichever frontend asked (src/classification.cc). The one
 * place classification is formatted.
 */
import type { ModelConfig } from "@trellis/protocol";
import {
  Code,
  datatypeFromConfig,
  type InferResponse,
  type RequestedOutput,
  StageError,
  type Tensor,
} from "@trellis/stage";
import type { ModelInterceptor } from "./chain.js";

/** Types Triton's classification refuses (src/classification.cc TopkClassifications). */
const UNCLASSIFIABLE = new Set(["BYTES", "BOOL", "FP16", "BF16"]);

/** Triton's refusal of classification on an output of `datatype`, naming the output after Triton's words. */
const unclassifiable = (model: string, output: string, datatype: string) =>
  new StageError(
    Code.InvalidArgument,
    model,
    `class result not available for output due to unsupported type '${datatype}' (output '${output}')`,
  );

/**
 * Output name -> k for each requested output carrying the `classification` parameter; refused
 * before the model runs when the config gives the output a type Triton cannot classify.
 */
export function classificationRequests(
  model: string,
  outputs: RequestedOutput[] | undefined,
  config: ModelConfig,
): Map<string, number> {
  const classify = new Map<string, number>();
  for (const o of outputs ?? []) {
    const k = o.parameters?.classification;
    if (k === undefined) continue;
    const count = Number(k);
    if (!Number.isInteger(count) || count < 1) {
      throw new StageError(
        Code.InvalidArgument,
        model,
        `output ${o.name}: classification must be a positive integer, got ${String(k)}`,
      );
    }
    const declared = config.output.find((c) => c.name === o.name);
    // TYPE_INVALID (0): a config that does not say; the answer's type is checked then.
    if (declared?.dataType) {
      const datatype = datatypeFromConfig(declared.dataType);
      if (UNCLASSIFIABLE.has(datatype)) throw unclassifiable(model, o.name, datatype);
    }
    classify.set(o.name, count);
  }
  return classify;
}

const encoder = new TextEncoder();

/**
 * Triton's classification output: per batch item the top-k classes as
 * "score:index[:label]" strings (score printed like C++ std::to_string),
 * shape [batch, k] (or [k] for a model without batching).
 */
export function classification(
  model: string,
  t: Tensor,
  k: number,
  batched: boolean,
  labels: string[] | undefined,
): Tensor {
  if (UNCLASSIFIABLE.has(t.datatype)) throw unclassifiable(model, t.name, t.datatype);
  const values = t.data as ArrayLike<number | bigint>;
  const items = batched ? (t.shape[0] ?? 1) : 1;
  const classes = items === 0 ? 0 : values.length / items;
  const topk = Math.min(k, classes);
  const out: Uint8Array[] = [];
  for (let b = 0; b < items; b++) {
    const base = b * classes;
    const order = Array.from({ length: classes }, (_, i) => i);
    order.sort((i, j) => Number(values[base + j]) - Number(values[base + i]) || i - j);
    for (const index of order.slice(0, topk)) {
      const score = Number(values[base + index]).toFixed(6);
      const label = labels?.[index];
      out.push(encoder.encode(label !== undefined ? `${score}:${index}:${label}` : `${score}:${index}`));
    }
  }
  return { name: t.name, datatype: "BYTES", shape: batched ? [items, topk] : [topk], data: out };
}

/**
 * The response with the outputs `classify` names as Triton's classification. The request went
 * through unchanged, and the output the model answers with is what is classified, as Triton's
 * frontend does: a BYTES output is refused.
 */
export function classified(
  model: string,
  config: ModelConfig,
  response: InferResponse,
  classify: Map<string, number>,
  labels: ReadonlyMap<string, string[]>,
): InferResponse {
  if (classify.size === 0) return response;
  const batched = config.maxBatchSize > 0;
  return {
    ...response,
    outputs: response.outputs.map((t) => {
      const k = classify.get(t.name);
      if (k === undefined) return t;
      return classification(model, t, k, batched, labels.get(t.name));
    }),
  };
}

/** Classification, with the class labels per output name (config `label_filename`). */
export function classificationInterceptor(labels: ReadonlyMap<string, string[]> = new Map()): ModelInterceptor {
  return {
    name: "classification",
    infer:
      (next, { name, config }) =>
      async (request, options) => {
        const classify = classificationRequests(name, request.outputs, config);
        return classified(name, config, await next(request, options), classify, labels);
      },
    inferStream: (next, { name, config }) =>
      async function* (request, options) {
        const classify = classificationRequests(name, request.outputs, config);
        for await (const response of next(request, options)) yield classified(name, config, response, classify, labels);
      },
  };
}
