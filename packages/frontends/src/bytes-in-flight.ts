/**
 * A server-wide bound on the memory BYTES tensors hold while their requests are in flight.
 * A BYTES element costs far more than its bytes once a model works on it: a view or string
 * object in JavaScript, ONNX Runtime's std::string, the answer's own copy. Sixteen requests of
 * 10,485,760 one-byte strings took the server to 3.34 GB of RSS (one alone to 1.45 GB, some
 * 120 bytes an element over its payload) while the queue, which counts requests, admitted them
 * all. Each request's BYTES inputs reserve their cost here after the wire is read (elements
 * still packed in the buffer they came in: nothing per element is made yet) and before the
 * model is queued; past the bound the request is refused at once, RESOURCE_EXHAUSTED (HTTP
 * 429), and its cost is given back when it is answered or fails.
 */
import { Code, type InferRequest, StageError } from "@trellis/stage";
import { framedBytesOf } from "@trellis/stage/backend";

/** Default bound (--max-inflight-bytes-tensor-bytes): room for one of Triton's 10,485,760-element tests at a time. */
export const DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES = 2 * 1024 * 1024 * 1024;

/**
 * What one BYTES element is counted at beyond its payload: its share of the ~120 bytes an
 * element cost above its payload, measured through an ONNX identity model (the 1.45 GB
 * for 10,485,760 one-byte elements), rounded up.
 */
export const BYTES_ELEMENT_OVERHEAD = 128;

/** Each element's length prefix in KServe's BYTES framing. */
const PREFIX_BYTES = 4;

/** The refusal of a request whose BYTES inputs do not fit: RESOURCE_EXHAUSTED, 429 over HTTP. */
export class BytesInFlightExhausted extends StageError {
  /** The HTTP status it is answered with (the in-flight budgets' 429, "try again later"). */
  readonly httpStatus = 429;
}

/** What a request's BYTES inputs are counted at: elements and bytes. */
export interface BytesCost {
  elements: number;
  bytes: number;
}

/** The cost of `request`'s BYTES inputs: payload and prefixes as framed, plus BYTES_ELEMENT_OVERHEAD each. */
export function bytesCostOf(request: InferRequest): BytesCost {
  let elements = 0;
  let bytes = 0;
  for (const input of request.inputs) {
    if (input.datatype !== "BYTES") continue;
    const data = input.data as readonly Uint8Array[];
    elements += data.length;
    // Packed (the wire's buffer behind the array): its length, without making an element.
    const framed = framedBytesOf(data);
    if (framed) bytes += framed.byteLength;
    else for (const element of data) bytes += PREFIX_BYTES + element.byteLength;
  }
  return { elements, bytes: bytes + elements * BYTES_ELEMENT_OVERHEAD };
}

export class BytesInFlight {
  private used = 0;
  /** Requests refused because their BYTES inputs did not fit. */
  refusals = 0;

  constructor(
    readonly limitBytes: number,
    /** The setting that raises the bound, named in refusals. */
    readonly flag = "--max-inflight-bytes-tensor-bytes",
  ) {}

  /** Bytes reserved right now. */
  get inUse(): number {
    return this.used;
  }

  /**
   * Reserves what `request`'s BYTES inputs cost; returns the release (safe to call more than
   * once). Throws BytesInFlightExhausted, naming the bound and the request's cost, when they
   * do not fit beside the requests in flight.
   */
  reserve(request: InferRequest, model: string): () => void {
    const { elements, bytes } = bytesCostOf(request);
    if (bytes === 0) return () => undefined;
    if (this.used + bytes > this.limitBytes) {
      this.refusals++;
      const alone = bytes > this.limitBytes;
      throw new BytesInFlightExhausted(
        Code.ResourceExhausted,
        model,
        `BYTES inputs of ${elements} elements count ${bytes} bytes (payload and ${BYTES_ELEMENT_OVERHEAD} bytes an element), ` +
          (alone
            ? `more than the server's bound of ${this.limitBytes} bytes on BYTES tensors in flight; use ${this.flag} to raise it`
            : `past what the server's bound of ${this.limitBytes} bytes on BYTES tensors in flight has left (${Math.max(0, this.limitBytes - this.used)}): try again later; use ${this.flag} to raise it`),
      );
    }
    this.used += bytes;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.used -= bytes;
    };
  }
}
