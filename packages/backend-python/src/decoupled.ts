/**
 * A decoupled Python model's responses (Triton's `request.get_response_sender()`): `execute()`
 * returns None at once, and the model sends each request's responses whenever it likes, from any
 * thread, until one carries TRITONSERVER_RESPONSE_COMPLETE_FINAL. Each request's responses arrive
 * as "response" frames and queue here until its reader takes them. Every way a model can misuse
 * this is bounded and named, failing only that request: no response (and no FINAL) for the
 * idle bound, more responses than the bound, more unread bytes than the answer bound.
 */
import { Code, StageError, type Tensor } from "@trellis/stage";
import { parametersFromJson } from "./bls.js";
import { codeOfTriton } from "./codes.js";
import { decodeTensor, type Frame, type TensorMeta } from "./frames.js";

/** Most responses one request may be sent by default; past it its stream fails and the sender is closed. */
export const MAX_RESPONSES = 100_000;

/** One response as the reader takes it: outputs (with the response's parameters), or the end. */
export type StreamItem = { outputs: Tensor[]; parameters?: ReturnType<typeof parametersFromJson> };

export interface ResponseStreamOptions {
  modelName: string;
  /** Longest the model may go without sending a response before FINAL. */
  idleMs: number;
  /** Most bytes of responses sent but not yet read. */
  maxUnreadBytes: number;
  /** Most responses one request may be sent (--python-max-responses). */
  maxResponses: number;
  /** Tells the model's process to close the sender (its later sends raise) and mark the request cancelled. */
  close(): void;
}

/** One decoupled request's responses, in order, as an async iterable; push() takes the frames. */
export class ResponseStream implements AsyncIterable<StreamItem> {
  private readonly queue: ({ item: StreamItem; bytes: number } | "final")[] = [];
  private unreadBytes = 0;
  private received = 0;
  private failure: Error | undefined;
  private done = false;
  private wake: (() => void) | undefined;
  private idleTimer: NodeJS.Timeout | undefined;

  constructor(private readonly options: ResponseStreamOptions) {
    this.armIdle();
  }

  /** A "response" frame for this request. */
  push(frame: Frame): void {
    if (this.done) return;
    const { modelName } = this.options;
    const header = frame.header as {
      final?: boolean;
      outputs?: TensorMeta[];
      parameters?: Record<string, unknown>;
      error?: string;
      code?: number;
    };
    if (header.error !== undefined) {
      this.fail(new StageError(codeOfTriton(header.code), modelName, header.error));
      return;
    }
    if (header.outputs) {
      this.received += 1;
      if (this.received > this.options.maxResponses) {
        this.fail(
          new StageError(
            Code.ResourceExhausted,
            modelName,
            `model "${modelName}" sent more than ${this.options.maxResponses} responses to one request (--python-max-responses); its response sender was closed`,
          ),
        );
        return;
      }
      this.unreadBytes += frame.body.byteLength;
      if (this.unreadBytes > this.options.maxUnreadBytes) {
        this.fail(
          new StageError(
            Code.ResourceExhausted,
            modelName,
            `model "${modelName}" sent responses faster than they were read: more than ${this.options.maxUnreadBytes} bytes unread (--python-max-answer-bytes); its response sender was closed`,
          ),
        );
        return;
      }
      const outputs = header.outputs.map((m) => decodeTensor(m, frame.body));
      const item = header.parameters ? { outputs, parameters: parametersFromJson(header.parameters) } : { outputs };
      this.queue.push({ item, bytes: frame.body.byteLength });
    }
    if (header.final) {
      this.queue.push("final");
      this.done = true;
      clearTimeout(this.idleTimer);
    } else {
      this.armIdle();
    }
    this.notify();
  }

  /** The request fails (its execute raised, the process ended, …): after what was already sent. */
  fail(error: Error): void {
    if (this.done) return;
    this.done = true;
    this.failure = error;
    clearTimeout(this.idleTimer);
    this.options.close();
    this.notify();
  }

  /** Whether the stream still waits for responses. */
  get open(): boolean {
    return !this.done;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<StreamItem> {
    try {
      for (;;) {
        const next = this.queue.shift();
        if (next === "final") return;
        if (next) {
          this.unreadBytes -= next.bytes;
          yield next.item;
          continue;
        }
        if (this.failure) throw this.failure;
        await new Promise<void>((resolve) => {
          this.wake = resolve;
        });
      }
    } finally {
      // The reader stopped early (the client went away): the model may stop sending.
      if (!this.done) this.fail(new StageError(Code.Canceled, this.options.modelName, "request cancelled"));
    }
  }

  private armIdle(): void {
    clearTimeout(this.idleTimer);
    const { idleMs, modelName } = this.options;
    this.idleTimer = setTimeout(() => {
      this.fail(
        new StageError(
          Code.DeadlineExceeded,
          modelName,
          `model "${modelName}" sent no response for ${idleMs} ms without closing its response sender (TRITONSERVER_RESPONSE_COMPLETE_FINAL); the request was ended and the sender closed`,
        ),
      );
    }, idleMs);
    this.idleTimer.unref();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }
}
