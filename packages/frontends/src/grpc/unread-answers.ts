/**
 * A bound on the bytes of answers written for clients that have not taken them, across every
 * gRPC connection of a server. node:http2 keeps an answer the client's flow-control window
 * does not let out; maxSessionMemory bounds one connection, so six connections that never
 * read each held their share (a 70-byte request earns a 602 KB preprocess answer) and the
 * process grew by gigabytes. Past the bound a connection is reset (GOAWAY ENHANCE_YOUR_CALM),
 * which frees what it held.
 *
 * Which one: not simply the one holding the most. An honest client reading one large answer
 * holds more than each of many connections that read nothing, and cutting it freed the bytes
 * only for the idle ones to keep theirs (issue 52 item 6). So the bytes count with how long
 * they sit: a connection is cut first when it has taken no answer bytes (nothing left its
 * socket) for a grace period, the largest of those first; then one that reads so slowly that
 * what it holds would take longer than a horizon to clear at its pace. A connection reading at
 * a pace that clears what it holds within the horizon is never cut: while only such
 * connections are over the bound, the total falls as they read.
 */
import http2 from "node:http2";

/** Default bound on unread answer bytes across all gRPC connections (--grpc-max-unread-answer-bytes). */
export const DEFAULT_MAX_UNREAD_ANSWER_BYTES = 256 * 1024 * 1024;

/** How often the held bytes are added up while any connection is open. */
const CHECK_INTERVAL_MS = 50;

/** How long a connection may take nothing, while it holds answers, before its bytes count against it. */
const GRACE_MS = 1000;

/** A connection whose pace would clear what it holds within this is reading, and never cut. */
const CLEAR_HORIZON_MS = 30_000;

/** The span over which a connection's reading pace is measured. */
const PACE_WINDOW_MS = 2000;

/**
 * What a connection must take to count as reading. Control frames leave a socket too (a PING's
 * answer, a new call's headers): a connection that reads nothing must not pass for a reader by
 * sending pings.
 */
const PROGRESS_BYTES = 16 * 1024;

/** What one connection holds and how it reads. */
interface Watched {
  streams: Set<http2.ServerHttp2Stream>;
  /** Bytes its socket had sent at the last check. */
  sent: number;
  /** Bytes its socket had sent when it last counted as reading. */
  mark: number;
  /** When it last took PROGRESS_BYTES, or last held none. */
  lastTakenAt: number;
  /** Its socket's bytes sent, sampled at each check over the last PACE_WINDOW_MS, oldest first. */
  pace: { at: number; sent: number }[];
}

/** Why a connection may be cut, most deserving first. */
interface Candidate {
  session: http2.ServerHttp2Session;
  bytes: number;
  /** 0: took nothing for the grace period; 1: reads too slowly to clear within the horizon. */
  tier: 0 | 1;
  /** Within a tier, larger is cut first: bytes held (tier 0), seconds to clear (tier 1). */
  weight: number;
}

/** Bytes a session's socket has sent (its proxy allows reading counters); 0 once it is gone. */
function bytesSent(session: http2.ServerHttp2Session): number {
  try {
    return session.socket?.bytesWritten ?? 0;
  } catch {
    return 0;
  }
}

export class UnreadAnswers {
  private readonly open = new Map<http2.ServerHttp2Session, Watched>();
  private timer: NodeJS.Timeout | undefined;
  /** Connections reset because the total passed the bound. */
  resets = 0;

  constructor(
    readonly limitBytes: number,
    private readonly onReset?: (heldBytes: number, totalBytes: number) => void,
  ) {}

  /** Counts what `session`'s streams hold, from now until it closes. */
  watch(session: http2.ServerHttp2Session): void {
    const now = performance.now();
    const watched: Watched = { streams: new Set(), sent: 0, mark: 0, lastTakenAt: now, pace: [] };
    this.open.set(session, watched);
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      watched.streams.add(stream);
      stream.once("close", () => watched.streams.delete(stream));
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
    for (const [session, { streams }] of this.open) {
      let bytes = 0;
      // writableLength: written and not yet done (bufferSize would count a write in flight twice).
      for (const stream of streams) bytes += stream.writableLength;
      bySession.set(session, bytes);
      total += bytes;
    }
    return { total, bySession };
  }

  /** Notes each connection's progress; past the bound, resets connections that do not read until within it. */
  enforce(): void {
    const now = performance.now();
    const { total, bySession } = this.held();
    for (const [session, bytes] of bySession) this.notePace(session, bytes, now);
    if (total <= this.limitBytes) return;
    let left = total;
    for (const { session, bytes } of this.candidates(bySession, now)) {
      if (left <= this.limitBytes) break;
      this.onReset?.(bytes, left);
      this.resets++;
      this.open.delete(session);
      // GOAWAY first, so the client is told why; the streams it never read are then dropped.
      session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      setImmediate(() => session.destroy());
      left -= bytes;
    }
    if (this.open.size === 0) this.stop();
  }

  private notePace(session: http2.ServerHttp2Session, bytes: number, now: number): void {
    const watched = this.open.get(session);
    if (!watched) return;
    const sent = bytesSent(session);
    watched.sent = sent;
    // Took a fair share since it last did, or owes nothing: its idle clock starts again.
    if (bytes === 0 || sent - watched.mark >= PROGRESS_BYTES) {
      watched.lastTakenAt = now;
      watched.mark = sent;
    }
    // A pace is measured from when it began to hold: what it did while it owed nothing says nothing.
    if (bytes === 0) watched.pace.length = 0;
    watched.pace.push({ at: now, sent });
    // Keep one sample at least a window old, so the pace spans a whole window once it can.
    while (watched.pace.length > 2 && now - (watched.pace[1]?.at ?? now) >= PACE_WINDOW_MS) watched.pace.shift();
  }

  /** The connections that may be cut, in the order they are: idle ones, then readers too slow to clear. */
  private candidates(bySession: Map<http2.ServerHttp2Session, number>, now: number): Candidate[] {
    const found: Candidate[] = [];
    for (const [session, bytes] of bySession) {
      const watched = this.open.get(session);
      if (!watched || bytes === 0 || now - watched.lastTakenAt < GRACE_MS) continue;
      found.push({ session, bytes, tier: 0, weight: bytes });
    }
    for (const [session, bytes] of bySession) {
      const watched = this.open.get(session);
      if (!watched || bytes === 0 || now - watched.lastTakenAt >= GRACE_MS) continue;
      const oldest = watched.pace[0];
      const spanMs = oldest ? now - oldest.at : 0;
      // Its pace is judged over a whole window only: a fresh answer gets that long to start.
      if (!oldest || spanMs < PACE_WINDOW_MS) continue;
      const perMs = (watched.sent - oldest.sent) / spanMs;
      const clearMs = perMs > 0 ? bytes / perMs : Number.POSITIVE_INFINITY;
      if (clearMs > CLEAR_HORIZON_MS) found.push({ session, bytes, tier: 1, weight: clearMs });
    }
    return found.sort((a, b) => a.tier - b.tier || b.weight - a.weight);
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
