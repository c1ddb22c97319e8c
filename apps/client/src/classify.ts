/**
 * Classifying images against a model that takes encoded images (the seed
 * ensemble): each image an element of the model's BYTES input, each answer
 * its output strings (the ensemble's top-5 JSON). A numeric output is asked
 * for through Triton's classification extension, so it answers top-k
 * "score:index:label" strings too.
 */
import { bytesToStrings, type InferRequest } from "@trellis/stage";
import { describeError, type Endpoint } from "./endpoint.js";
import { imageInput, imageRequests } from "./inputs.js";

export interface Classification {
  /** Index of the image in the input list. */
  image: number;
  /** Per output name, the strings for this image. */
  outputs: Record<string, string[]>;
  /** Why the request carrying this image failed (the other requests go on). */
  error?: string;
}

export async function classify(
  endpoint: Endpoint,
  model: string,
  images: Uint8Array[],
  options: { batch?: number; classes?: number } = {},
): Promise<Classification[]> {
  const metadata = await endpoint.metadata(model);
  const input = imageInput(model, metadata);
  // A model without a batch dimension takes one image per request.
  const batching = input.shape[0] === -1;
  const batch = batching ? Math.max(1, Math.min(options.batch ?? 1, images.length)) : 1;
  const outputs = metadata.outputs.map((o) =>
    o.datatype === "BYTES" ? { name: o.name } : { name: o.name, parameters: { classification: options.classes ?? 5 } },
  );
  const results: Classification[] = [];
  for (const [n, request] of imageRequests(input, images, batch).entries()) {
    const withOutputs: InferRequest = { ...request, outputs };
    const count = Math.min(batch, images.length - n * batch);
    let response: Awaited<ReturnType<Endpoint["infer"]>>;
    try {
      response = await endpoint.infer(model, withOutputs);
    } catch (err) {
      const error = describeError(err);
      for (let item = 0; item < count; item++) results.push({ image: n * batch + item, outputs: {}, error });
      continue;
    }
    for (let item = 0; item < count; item++) {
      const perOutput: Record<string, string[]> = {};
      for (const t of response.outputs) {
        const strings = bytesToStrings(t);
        const per = strings.length / batch;
        perOutput[t.name] = strings.slice(item * per, (item + 1) * per);
      }
      results.push({ image: n * batch + item, outputs: perOutput });
    }
  }
  return results;
}

/** One of an answer's top-k classes: its score, class index (when the answer has it) and label. */
export interface TopClass {
  score: string;
  index?: number;
  label: string;
}

/**
 * An output string's top-k classes, when it has them: the seed ensemble's top-k JSON
 * (`top5_labels` and `top5_probs`, probabilities to 3 decimals; it names no class index)
 * or Triton's classification extension's `score:index[:label]` (the score as the server
 * wrote it). Undefined for anything else.
 */
export function topClasses(output: string): TopClass[] | undefined {
  const extension = /^(-?[\d.eE+-]+|nan|inf|-inf):(\d+)(?::(.*))?$/s.exec(output);
  if (extension) return [{ score: extension[1]!, index: Number(extension[2]), label: extension[3] ?? "" }];
  if (!output.trimStart().startsWith("{")) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(output);
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null) return undefined;
  // top<k>_labels and top<k>_probs, whatever k the postprocess was configured with
  const entries = Object.entries(parsed);
  const labels = entries.find(([key]) => /^top\d+_labels$/.test(key))?.[1];
  const probs = entries.find(([key]) => /^top\d+_probs$/.test(key))?.[1];
  const index = entries.find(([key]) => /^top\d+_index$/.test(key))?.[1];
  if (!Array.isArray(labels) || !Array.isArray(probs) || labels.length !== probs.length) return undefined;
  return labels.map((label, i) => ({
    score: typeof probs[i] === "number" ? probs[i].toFixed(3) : String(probs[i]),
    ...(Array.isArray(index) && typeof index[i] === "number" ? { index: index[i] } : {}),
    label: String(label),
  }));
}

/**
 * A classification as Triton's image_client prints one: the image's name, then a line
 * per class, `    <score> (<index>) = <label>` (`    <score> = <label>` where the answer
 * names no index, as the seed ensemble's JSON does not). Outputs that are not top-k classes are
 * printed as `    <output>: <string>`, a failed request as `    error: CODE: message`.
 */
export function formatClassification(name: string, result: Classification): string {
  const lines = [`Image '${name}':`];
  if (result.error) lines.push(`    error: ${result.error}`);
  for (const [output, strings] of Object.entries(result.outputs)) {
    for (const s of strings) {
      const classes = topClasses(s);
      if (!classes) {
        lines.push(`    ${output}: ${s}`);
        continue;
      }
      for (const c of classes) lines.push(`    ${c.score}${c.index === undefined ? "" : ` (${c.index})`} = ${c.label}`);
    }
  }
  return lines.join("\n");
}
