/**
 * Merging requests along dim 0 and splitting a merged result back into each request's rows.
 * Splitting copies nothing (typed-array views); merging allocates each input once.
 */
import type { InferRequest, RequestOutcome, Tensor, TensorData } from "@trellis/stage";
import { Code, elementCount, formatShape, StageError } from "@trellis/stage";
import { allocate, toConnectError } from "@trellis/stage/backend";
import type { BatchResult } from "../execution.js";

/** Rows a request carries along dim 0 (1 when it has none). */
export const rowsOf = (request: InferRequest): number => request.inputs[0]?.shape[0] ?? 1;

function sliceData(data: TensorData, start: number, end: number): TensorData {
  // subarray: a view, so splitting a batch copies nothing; BYTES arrays are sliced.
  return Array.isArray(data)
    ? data.slice(start, end)
    : (data as Exclude<TensorData, Uint8Array[]>).subarray(start, end);
}

/** Concatenates the requests' inputs along dim 0 (they share a batch key, so shapes agree past dim 0). */
export function mergeRequests(requests: readonly InferRequest[]): InferRequest {
  const first = requests[0]!;
  const inputs = first.inputs.map((t): Tensor => {
    const parts = requests.map((r) => r.inputs.find((x) => x.name === t.name)!);
    const rows = parts.reduce((n, x) => n + x.shape[0]!, 0);
    const shape = [rows, ...t.shape.slice(1)];
    if (t.datatype === "BYTES") {
      return { name: t.name, datatype: "BYTES", shape, data: parts.flatMap((x) => x.data as Uint8Array[]) };
    }
    const data = allocate(t.datatype, elementCount(shape)) as Exclude<TensorData, Uint8Array[]>;
    let offset = 0;
    for (const x of parts) {
      const src = x.data as Exclude<TensorData, Uint8Array[]>;
      (data as Float32Array).set(src as Float32Array, offset);
      offset += src.length;
    }
    return { name: t.name, datatype: t.datatype, shape, data } as Tensor;
  });
  // Every output any request wants, or all when one of them wants all.
  const wantsAll = requests.some((r) => !r.outputs || r.outputs.length === 0);
  const names = new Set(requests.flatMap((r) => (r.outputs ?? []).map((o) => o.name)));
  return {
    inputs,
    outputs: wantsAll ? undefined : [...names].map((n) => ({ name: n })),
    parameters: first.parameters,
  };
}
/** Each request's own rows of a merged result (an output of the wrong dim 0 fails them INTERNAL). */
export function splitRows(
  name: string,
  result: BatchResult,
  sizes: readonly number[],
  total: number,
): RequestOutcome[] {
  const responses: RequestOutcome[] = [];
  let offset = 0;
  for (const size of sizes) {
    try {
      responses.push(result.outputs.map((t) => sliceRows(name, t, offset, size, total)));
    } catch (err) {
      responses.push(toConnectError(err, name));
    }
    offset += size;
  }
  return responses;
}

function sliceRows(name: string, t: Tensor, offset: number, rows: number, total: number): Tensor {
  if (t.shape[0] !== total) {
    throw new StageError(
      Code.Internal,
      name,
      `output ${t.name}: batch of ${total} produced dim 0 = ${t.shape[0]} (shape ${formatShape(t.shape)})`,
    );
  }
  const per = elementCount(t.shape.slice(1));
  const data = sliceData(t.data, offset * per, (offset + rows) * per);
  return { name: t.name, datatype: t.datatype, shape: [rows, ...t.shape.slice(1)], data } as Tensor;
}
