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
