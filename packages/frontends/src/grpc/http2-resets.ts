/**
 * Keeping a gRPC connection serving while its client resets calls: one caller with short
 * deadlines must not break the other callers sharing its connection (tritonclient.grpc,
 * grpcio on gRPC C-core, shares one connection among all of a client's callers). Two things
 * in node:http2 broke the whole connection, and gRPC C-core (Triton's server) suffers neither:
 *
 * 1. A reset leaves node's memory count of the session behind. node counts an answer's bytes
 *    against the session (maxSessionMemory, 10 MB by default) from the write until nghttp2
 *    sends them; when the client resets a stream whose answer still waits on its flow-control
 *    window, node frees the bytes but never takes them off the count (Http2Stream::Destroy).
 *    Past the cap every new stream is refused with RST_STREAM ENHANCE_YOUR_CALM, and past 100
 *    refusals in a row the session is torn down with GOAWAY. So the cap is raised (sessions
 *    still hold a bound, and one that counts what they really hold), the bytes each reset
 *    leaves counted are added up here, and a session whose count has drifted by half the cap
 *    is closed gracefully (GOAWAY NO_ERROR: calls in flight finish, the client opens a new
 *    connection for new ones, as it does at --grpc-max-connection-age) long before it refuses.
 *
 * 2. grpcio resets streams it never opened: a call cancelled at its deadline after it was given
 *    a stream id and before its HEADERS went out gets a RST_STREAM (and may have had a
 *    WINDOW_UPDATE) for that id, written ahead of other streams' HEADERS. To HTTP/2 that is a
 *    frame on an idle stream, a connection error: nghttp2 sends GOAWAY PROTOCOL_ERROR and node
 *    destroys the session with every call on it. C-core ignores frames for streams it does not
 *    know. So the bytes from the client pass through a filter before nghttp2 reads them, which
 *    drops exactly those frames: RST_STREAM and WINDOW_UPDATE for a client stream id above every
 *    stream the client has opened. Everything else passes untouched (only frame headers are read).
 *    The filter makes every byte take a hop through JavaScript, so only connections whose first
 *    SETTINGS frame says C-core (it announces gRPC's own settings, ids 0xfe00 and up; grpc-js,
 *    Connect and other HTTP/2 clients do not) get it; the rest run on the socket as node runs them.
 */

import { EventEmitter } from "node:events";
import http2 from "node:http2";
import type net from "node:net";

/** node:http2's memory cap for one gRPC session, in MB (node's default is 10). */
export const GRPC_SESSION_MEMORY_MB = 256;

/** Bytes that resets may leave on a session's count before it is closed gracefully: half the cap. */
export const RESET_DRIFT_LIMIT_BYTES = (GRPC_SESSION_MEMORY_MB / 2) * 1_000_000;

/**
 * Adds up what each reset stream of `session` leaves counted (its answer's bytes node had not
 * sent yet) and closes the session gracefully (GOAWAY NO_ERROR) once that reaches `limitBytes`.
 */
export function closeOnResetDrift(
  session: http2.ServerHttp2Session,
  limitBytes = RESET_DRIFT_LIMIT_BYTES,
  onClose?: (driftBytes: number) => void,
): void {
  let drift = 0;
  session.on("stream", (stream: http2.ServerHttp2Stream) => {
    stream.once("close", () => {
      // A stream that ended cleanly sent all it was given; one that was reset may not have.
      if (stream.rstCode === http2.constants.NGHTTP2_NO_ERROR) return;
      drift += stream.bufferSize ?? 0;
      if (drift < limitBytes || session.closed || session.destroyed) return;
      onClose?.(drift);
      session.close();
    });
  });
}

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");
const FRAME_HEADER_BYTES = 9;
const HEADERS = 0x1;
const RST_STREAM = 0x3;
const WINDOW_UPDATE = 0x8;

/**
 * The bytes a client sends on an HTTP/2 connection (preface first), less RST_STREAM and
 * WINDOW_UPDATE frames for client streams it has not opened yet (idle streams). Anything that
 * does not start with the HTTP/2 preface passes through as it is.
 */
export class IdleStreamFrameFilter {
  /** Preface bytes matched so far; -1 once the bytes are not HTTP/2 (all pass). */
  private preface = 0;
  /** The start of a frame header that ended a chunk, held back until the rest comes. */
  private pending: Buffer | undefined;
  /** Payload bytes of the current frame still to come, and whether they are dropped. */
  private payloadLeft = 0;
  private dropping = false;
  /** The highest stream id the client has opened (sent HEADERS for). */
  private lastOpened = 0;
  /** Frames dropped so far. */
  dropped = 0;

  /** The part of `chunk` to pass on (`chunk` itself when nothing is dropped or held back). */
  push(chunk: Buffer): Buffer {
    if (this.preface < 0) return chunk;
    let pos = 0;
    if (this.preface < PREFACE.length) {
      const n = Math.min(PREFACE.length - this.preface, chunk.length);
      if (!chunk.subarray(0, n).equals(PREFACE.subarray(this.preface, this.preface + n))) {
        this.preface = -1;
        return chunk;
      }
      this.preface += n;
      pos = n;
    }
    const out: Buffer[] = [];
    // The part of chunk from runStart to pos is passed on.
    let runStart = 0;
    const cut = (from: number, to: number) => {
      if (from > runStart) out.push(chunk.subarray(runStart, from));
      runStart = to;
    };
    while (pos < chunk.length) {
      if (this.payloadLeft > 0) {
        const n = Math.min(this.payloadLeft, chunk.length - pos);
        if (this.dropping) cut(pos, pos + n);
        pos += n;
        this.payloadLeft -= n;
        continue;
      }
      const held = this.pending?.length ?? 0;
      if (held + chunk.length - pos < FRAME_HEADER_BYTES) {
        // Part of a frame header: held back until its frame can be judged.
        this.pending = Buffer.concat(this.pending ? [this.pending, chunk.subarray(pos)] : [chunk.subarray(pos)]);
        cut(pos, chunk.length);
        pos = chunk.length;
        break;
      }
      const taken = FRAME_HEADER_BYTES - held;
      const header = this.pending
        ? Buffer.concat([this.pending, chunk.subarray(pos, pos + taken)])
        : chunk.subarray(pos, pos + FRAME_HEADER_BYTES);
      const type = header[3];
      const stream = header.readUInt32BE(5) & 0x7fffffff;
      const idle = stream % 2 === 1 && stream > this.lastOpened;
      if (type === HEADERS && idle) this.lastOpened = stream;
      const drop = idle && (type === RST_STREAM || type === WINDOW_UPDATE);
      if (drop) {
        this.dropped++;
        cut(pos, pos + taken);
      } else if (this.pending) {
        // The held-back start of this header goes out first, then the rest from this chunk.
        cut(pos, pos);
        out.push(this.pending);
      }
      this.pending = undefined;
      pos += taken;
      this.payloadLeft = header.readUIntBE(0, 3);
      this.dropping = drop;
    }
    if (runStart === 0 && out.length === 0) return chunk;
    if (runStart < chunk.length) out.push(chunk.subarray(runStart));
    return out.length === 1 ? (out[0] as Buffer) : Buffer.concat(out);
  }
}

/**
 * `socket` as node:http2 is to run a session on it: reads pass through an IdleStreamFrameFilter,
 * writes go straight to the socket. Only what node's stream wrapper (JSStreamSocket) uses of a
 * stream is here, so the bytes take one hop through JavaScript, not two stream layers.
 */
export function filteringIdleStreamFrames(socket: net.Socket): EventEmitter {
  const filter = new IdleStreamFrameFilter();
  // node:http2 turns Nagle off on sockets it runs on itself; this one it does not see.
  socket.setNoDelay(true);
  const facade = Object.assign(new EventEmitter(), {
    readable: true,
    writable: true,
    readableObjectMode: false,
    pause: () => {
      socket.pause();
      return facade;
    },
    resume: () => {
      socket.resume();
      return facade;
    },
    cork: () => socket.cork(),
    uncork: () => socket.uncork(),
    write: (chunk: Buffer, callback?: (err?: Error | null) => void) => socket.write(chunk, callback),
    end: (callback?: () => void) => {
      socket.end(callback);
      return facade;
    },
    destroy: () => {
      socket.destroy();
      return facade;
    },
  });
  // What node:http2 reads of a TLS socket (the ALPN protocol picks HTTP/2 or HTTP/1.1).
  Object.defineProperty(facade, "alpnProtocol", { get: () => (socket as { alpnProtocol?: unknown }).alpnProtocol });
  socket.on("data", (chunk: Buffer) => {
    const passed = filter.push(chunk);
    if (passed.length > 0) facade.emit("data", passed);
  });
  socket.on("end", () => facade.emit("end"));
  socket.on("error", (err) => facade.emit("error", err));
  socket.on("close", () => {
    facade.readable = false;
    facade.writable = false;
    facade.emit("close");
  });
  return facade;
}

/** gRPC's own HTTP/2 settings ids (grpc_allow_true_binary_metadata is 0xfe03): C-core sends them. */
const GRPC_SETTINGS_FROM = 0xfe00;
const SETTINGS = 0x4;

/**
 * Whether the first bytes of a connection come from gRPC C-core: true or false once the preface
 * and the first frame (SETTINGS) are in, undefined while more bytes are needed. Bytes that are
 * not HTTP/2, or a first frame that is not SETTINGS, are not C-core's (node deals with them).
 */
export function fromGrpcCore(start: Buffer): boolean | undefined {
  const preface = Math.min(start.length, PREFACE.length);
  if (!start.subarray(0, preface).equals(PREFACE.subarray(0, preface))) return false;
  if (start.length < PREFACE.length + FRAME_HEADER_BYTES) return undefined;
  if (start[PREFACE.length + 3] !== SETTINGS) return false;
  const end = PREFACE.length + FRAME_HEADER_BYTES + start.readUIntBE(PREFACE.length, 3);
  if (start.length < end) return undefined;
  for (let i = PREFACE.length + FRAME_HEADER_BYTES; i + 6 <= end; i += 6) {
    if (start.readUInt16BE(i) >= GRPC_SETTINGS_FROM) return true;
  }
  return false;
}

/** How long a new connection may take to send its preface and SETTINGS before it is run filtered. */
const FIRST_SETTINGS_WAIT_MS = 1000;

/**
 * Runs the HTTP/2 sessions of `server` that gRPC C-core opens through filteringIdleStreamFrames:
 * node's own connection listener ('connection', or 'secureConnection' with TLS) is handed the
 * filtered stream instead of the socket once the client's first SETTINGS shows it is C-core; other
 * clients' sockets are handed over as they are, with the bytes read so far put back (node reads a
 * socket's buffered bytes first). A client silent past FIRST_SETTINGS_WAIT_MS is run filtered, so
 * its session (and the server's handshake timeout) starts all the same.
 */
export function ignoreIdleStreamFrames(server: http2.Http2Server | http2.Http2SecureServer, tls: boolean): void {
  const event = tls ? "secureConnection" : "connection";
  const [nodeListener, ...others] = server.listeners(event) as ((socket: unknown) => void)[];
  // node:http2 registers exactly one; anything else means its internals changed: leave them be.
  if (!nodeListener || others.length > 0) return;
  server.removeListener(event, nodeListener);
  server.on(event, function (this: unknown, socket: net.Socket) {
    let start: Buffer = Buffer.alloc(0);
    let decided = false;
    const handOver = (filter: boolean) => {
      if (decided) return;
      decided = true;
      clearTimeout(timer);
      socket.removeListener("data", onData);
      socket.removeListener("close", onClose);
      socket.pause();
      // Every byte read so far goes back, joined or not yet.
      if (heldBytes > 0) socket.unshift(held.length === 1 ? (held[0] as Buffer) : Buffer.concat(held, heldBytes));
      nodeListener.call(this, filter ? filteringIdleStreamFrames(socket) : socket);
      // node's session listens for the socket's errors from here on.
      socket.removeListener("error", onError);
    };
    // Chunks are joined only once enough bytes are here to judge (the preface and SETTINGS
    // header, then the whole SETTINGS frame): joining on every chunk was quadratic in its size.
    let held: Buffer[] = [];
    let heldBytes = 0;
    let wanted = 0;
    const onData = (chunk: Buffer) => {
      held.push(chunk);
      heldBytes += chunk.byteLength;
      if (heldBytes < wanted) return;
      start = held.length === 1 ? chunk : Buffer.concat(held, heldBytes);
      held = [start];
      const core = fromGrpcCore(start);
      if (core !== undefined) return handOver(core);
      wanted =
        start.length < PREFACE.length + FRAME_HEADER_BYTES
          ? PREFACE.length + FRAME_HEADER_BYTES
          : PREFACE.length + FRAME_HEADER_BYTES + start.readUIntBE(PREFACE.length, 3);
    };
    const onClose = () => {
      decided = true;
      clearTimeout(timer);
    };
    // A reset before the hand-over would otherwise be an unhandled 'error'.
    const onError = () => undefined;
    const timer = setTimeout(() => handOver(true), FIRST_SETTINGS_WAIT_MS);
    socket.on("data", onData);
    socket.on("error", onError);
    socket.once("close", onClose);
  });
}
