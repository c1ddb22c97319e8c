/**
 * Messages between the stage (main thread) and its session workers. Tensor
 * data travels as typed arrays whose buffers are transferred, not copied; the
 * feeds' buffers travel back with the reply (`spent`) for reuse.
 */

/**
 * A tensor as ORT names its element types ("float32", "int64", "string", ...). A "string"
 * tensor's data is its elements framed in one buffer (string-frames.ts), not a string[].
 */
export interface WireTensor {
  name: string;
  type: string;
  dims: number[];
  data: ArrayBufferView;
}

/** An ORT model input or output: fixed dims are numbers, symbolic or unknown ones are -1. */
export interface ModelTensorInfo {
  name: string;
  type: string;
  shape: number[];
}

export interface WorkerInit {
  modelPath: string;
  /** Plain (structured-cloneable) onnxruntime-node SessionOptions. */
  sessionOptions: Record<string, unknown>;
}

export type WorkerRequest = { type: "run"; id: number; feeds: WireTensor[]; fetches: string[] } | { type: "close" };

export type WorkerReply =
  | { type: "ready"; inputs: ModelTensorInfo[]; outputs: ModelTensorInfo[] }
  | { type: "load-error"; message: string }
  | { type: "result"; id: number; outputs: WireTensor[]; startNs: number; endNs: number; spent: ArrayBuffer[] }
  | { type: "error"; id: number; message: string; spent: ArrayBuffer[] };

/** Buffers to transfer for these tensors (each once: two views may share one). */
export function transferList(tensors: WireTensor[]): ArrayBuffer[] {
  const buffers = new Set<ArrayBuffer>();
  for (const t of tensors) {
    if (t.data.buffer instanceof ArrayBuffer) buffers.add(t.data.buffer);
  }
  return [...buffers];
}
