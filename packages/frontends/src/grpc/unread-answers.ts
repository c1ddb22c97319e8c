/**
 * A bound on the bytes of answers written for clients that have not taken them, across every
 * gRPC connection of a server. node:http2 keeps an answer the client's flow-control window
 * does not let out; maxSessionMemory bounds one connection, so six connections that never
 * read each held their share (a 70-byte request earns a 602 KB preprocess answer) and the
 * process grew by gigabytes. Past the bound the connection holding the most is reset
 * (GOAWAY ENHANCE_YOUR_CALM), which frees what it held; clients that read hold next to nothing.
 */
import http2 from "node:http2";

/** Default bound on unread answer bytes across all gRPC connections (--grpc-max-unread-answer-bytes). */
export const DEFAULT_MAX_UNREAD_ANSWER_BYTES = 256 * 1024 * 1024;

/** How often the held bytes are added up while any connection is open. */
const CHECK_INTERVAL_MS = 50;

export class UnreadAnswers {
  private readonly open = new Map<http2.ServerHttp2Session, Set<http2.ServerHttp2Stream>>();
  private timer: NodeJS.Timeout | undefined;
  /** Connections reset for holding the most when the total passed the bound. */
  resets = 0;

  constructor(
    readonly limitBytes: number,
    private readonly onReset?: (heldBytes: number, totalBytes: number) => void,
  ) {}

  /** Counts what `session`'s streams hold, from now until it closes. */
  watch(session: http2.ServerHttp2Session): void {
    const streams = new Set<http2.ServerHttp2Stream>();
    this.open.set(session, streams);
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      streams.add(stream);
      stream.once("close", () => streams.delete(stream));
    });
    session.once("close", () => {
      this.open.delete(session);
      if (this.open.size === 0) this.stop();
    });
    if (!this.timer) this.timer = setInterval(() => this.enforce(), CHECK_INTERVAL_MS).unref();
  }

  /** Bytes written and not yet sent, by connection, and in all. */
  held(): { total: number; bySession: Map<http2.ServerHttp2Session, number> } {
    const bySession = new Map<http2.ServerHttp2Session, number>();
    let total = 0;
    for (const [session, streams] of this.open) {
      let bytes = 0;
      // writableLength: written and not yet done (bufferSize would count a write in flight twice).
      for (const stream of streams) bytes += stream.writableLength;
      bySession.set(session, bytes);
      total += bytes;
    }
    return { total, bySession };
  }

  /** Resets the connections holding the most until the total is within the bound. */
  enforce(): void {
    let { total } = this.held();
    const { bySession } = this.held();
    if (total <= this.limitBytes) return;
    const worst = [...bySession].sort((a, b) => b[1] - a[1]);
    for (const [session, bytes] of worst) {
      if (total <= this.limitBytes || bytes === 0) break;
      this.onReset?.(bytes, total);
      this.resets++;
      this.open.delete(session);
      // GOAWAY first, so the client is told why; the streams it never read are then dropped.
      session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      setImmediate(() => session.destroy());
      total -= bytes;
    }
    if (this.open.size === 0) this.stop();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
