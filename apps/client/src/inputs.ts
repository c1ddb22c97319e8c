/**
 * Requests the client tools send: images as a model's BYTES input (the seed
 * ensemble's RAW_IMAGE), or random data shaped by the model's metadata, as
 * perf_analyzer makes when it is given no input data.
 */
import { randomBytes } from "node:crypto";
import {
  Code,
  type InferRequest,
  StageError,
  type StageMetadata,
  type Tensor,
  type TensorMetadata,
} from "@trellis/stage";
import { randomData } from "@trellis/stage/backend";

/** A model input's shape for a batch of `batch`: the batch dimension (-1 first) filled in, other -1s as 1. */
export function concreteShape(input: TensorMetadata, batch: number): number[] {
  return input.shape.map((d, i) => (d >= 0 ? d : i === 0 ? batch : 1));
}

/** The model's single BYTES input, which images go into; a clear error when there is none or several. */
export function imageInput(model: string, metadata: StageMetadata): TensorMetadata {
  const bytes = metadata.inputs.filter((i) => i.datatype === "BYTES");
  if (metadata.inputs.length !== 1 || bytes.length !== 1) {
    const list = metadata.inputs.map((i) => `${i.name} (${i.datatype})`).join(", ");
    throw new StageError(
      Code.InvalidArgument,
      model,
      `images go into a model's one BYTES input, as the seed ensemble's RAW_IMAGE; this model takes ${list || "no inputs"}`,
    );
  }
  return bytes[0]!;
}

/** One request per `batch` images (cycling through them), each image an element of the BYTES input. */
export function imageRequests(input: TensorMetadata, images: Uint8Array[], batch: number): InferRequest[] {
  const requests: InferRequest[] = [];
  for (let start = 0; start < images.length; start += batch) {
    const items = Array.from({ length: batch }, (_, i) => images[(start + i) % images.length]!);
    const shape = concreteShape(input, batch);
    requests.push({ inputs: [{ name: input.name, datatype: "BYTES", shape, data: items }] });
  }
  return requests;
}

/** A request of random data for every input (BYTES: random 16-byte strings), batch `batch`. */
export function randomRequest(metadata: StageMetadata, batch: number): InferRequest {
  const inputs = metadata.inputs.map((input): Tensor => {
    const shape = concreteShape(input, batch);
    const count = shape.reduce((a, b) => a * b, 1);
    if (input.datatype === "BYTES") {
      return { name: input.name, datatype: "BYTES", shape, data: Array.from({ length: count }, () => randomBytes(16)) };
    }
    return { name: input.name, datatype: input.datatype, shape, data: randomData(input.datatype, count) } as Tensor;
  });
  return { inputs };
}
