/**
 * What crosses the thread boundary between the main thread and an instance thread: the
 * thread's workerData, the messages each way, errors as they cross, and tensors made ready
 * to post (their buffers moved, or copied first).
 */
import { ConnectError } from "@connectrpc/connect";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  StageError,
  type StageMetadata,
  type Tensor,
} from "@trellis/stage";

/** workerData of an instance thread. */
export interface InstanceLoad {
  specifier: string;
  label: string;
  model: string;
  config: Uint8Array;
  modelDir: string;
  version: string;
  versionDir: string;
  /** Modules imported before `specifier` (see importInInstanceThreads). */
  imports?: string[];
}

export interface WireError {
  code: Code;
  /** The error's message without its code prefix (ConnectError's rawMessage). */
  message: string;
  /** The StageError's stage, "" for another error. */
  stage: string;
}

export type ToInstance =
  | {
      type: "infer";
      id: number;
      request: InferRequest;
      options: Pick<InferOptions, "priority" | "timeoutMicroseconds">;
      stream: boolean;
    }
  | { type: "cancel"; id: number }
  | { type: "close" };

export type FromInstance =
  | { type: "ready"; name: string; version: string; config: Uint8Array; metadata: StageMetadata; stream: boolean }
  | { type: "load-error"; error: WireError }
  | { type: "log"; level: "info" | "warn" | "error"; obj: object | string; msg?: string }
  | { type: "response"; id: number; response: InferResponse }
  | { type: "end"; id: number }
  | { type: "error"; id: number; error: WireError }
  | { type: "closed" };

const ownsBuffer = (v: ArrayBufferView): boolean =>
  v.buffer instanceof ArrayBuffer && v.byteOffset === 0 && v.byteLength === v.buffer.byteLength;

/**
 * `t` ready to post, its buffers added to `transfer`. With `move`, data that owns its whole
 * buffer is sent as it is (the buffer moves: detached here once posted); anything else (a view
 * into a larger buffer, a shared one, or any buffer without `move`) is copied into a buffer of
 * its own, which moves. BYTES elements are copied into one buffer unless one element owns its own.
 */
/**
 * Most BYTES elements moved one buffer each; a larger tensor is packed into one buffer (one copy,
 * linear), since a transfer list of millions of buffers costs more than copying their bytes.
 */
const MAX_TRANSFERRED_ELEMENTS = 1024;

export function portableTensor(t: Tensor, transfer: ArrayBuffer[], move: boolean): Tensor {
  if (t.datatype === "BYTES") {
    const items = t.data as Uint8Array[];
    if (move && items.length <= MAX_TRANSFERRED_ELEMENTS) {
      // Moved as they are only when each element owns a buffer no other element or tensor moves.
      const taken = new Set(transfer);
      const buffers = new Set<ArrayBuffer>();
      for (const b of items) {
        const buffer = b.buffer as ArrayBuffer;
        if (!ownsBuffer(b) || taken.has(buffer) || buffers.has(buffer)) break;
        buffers.add(buffer);
      }
      if (buffers.size === items.length) {
        for (const buffer of buffers) transfer.push(buffer);
        return t;
      }
    }
    let total = 0;
    for (const b of items) total += b.byteLength;
    const packed = new ArrayBuffer(total);
    let offset = 0;
    const data = items.map((b) => {
      const view = new Uint8Array(packed, offset, b.byteLength);
      view.set(b);
      offset += b.byteLength;
      return view;
    });
    transfer.push(packed);
    return { ...t, data };
  }
  const data = t.data as Exclude<Tensor["data"], Uint8Array[]>;
  if (move && ownsBuffer(data)) {
    if (!transfer.includes(data.buffer as ArrayBuffer)) transfer.push(data.buffer as ArrayBuffer);
    return t;
  }
  const copy = data.slice() as typeof data;
  transfer.push(copy.buffer as ArrayBuffer);
  return { ...t, data: copy } as Tensor;
}

export const portableRequest = (r: InferRequest, transfer: ArrayBuffer[], move: boolean): InferRequest => ({
  ...r,
  inputs: r.inputs.map((t) => portableTensor(t, transfer, move)),
});

export const portableResponse = (r: InferResponse, transfer: ArrayBuffer[], move: boolean): InferResponse => ({
  ...r,
  outputs: r.outputs.map((t) => portableTensor(t, transfer, move)),
});

/** An error as it crosses: its code, message and stage. Another error is INTERNAL under `model`. */
export function errorToWire(err: unknown, model: string): WireError {
  if (err instanceof StageError) return { code: err.code, message: err.rawMessage, stage: err.stage };
  if (err instanceof ConnectError) return { code: err.code, message: err.rawMessage, stage: "" };
  return { code: Code.Internal, message: err instanceof Error ? err.message : String(err), stage: model };
}

/** The StageError a WireError was, named as it was (another ConnectError under `model`). */
export function errorFromWire(w: WireError, model: string): StageError {
  const prefix = `${w.stage}: `;
  if (w.stage && w.message.startsWith(prefix)) return new StageError(w.code, w.stage, w.message.slice(prefix.length));
  if (w.stage) return new StageError(w.code, w.stage, w.message);
  return new StageError(w.code, model, w.message);
}
