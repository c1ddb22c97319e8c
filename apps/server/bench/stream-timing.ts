/**
 * Preloaded into the server process by transport.bench (node --import): stamps each
 * gRPC ModelInfer stream with process.hrtime (one monotonic clock for every process on
 * the machine) as it arrives, as its body ends, when the answer's headers and its
 * trailers go out, and writes the stamps to $STREAM_TIMING_OUT on SIGTERM.
 */
import { writeFileSync } from "node:fs";
import http2 from "node:http2";

export interface StreamStamps {
  arrived: number;
  bodyEnd?: number;
  respond?: number;
  trailers?: number;
}

const now = () => Number(process.hrtime.bigint()) / 1e6;
const stamps: StreamStamps[] = [];
const stampsOf = new WeakMap<object, StreamStamps>();
let patched = false;

const createServer = http2.createServer;
// biome-ignore lint/suspicious/noExplicitAny: wrapping node's overloaded createServer as it is
(http2 as any).createServer = (...args: any[]) => {
  const server = (createServer as (...a: unknown[]) => http2.Http2Server)(...args);
  server.prependListener("stream", (stream, headers) => {
    if (!String(headers[":path"]).endsWith("/ModelInfer")) return;
    const s: StreamStamps = { arrived: now() };
    stamps.push(s);
    stampsOf.set(stream, s);
    stream.once("end", () => {
      s.bodyEnd = now();
    });
    if (!patched) {
      patched = true;
      const proto = Object.getPrototypeOf(stream) as http2.ServerHttp2Stream;
      const { respond, sendTrailers } = proto;
      proto.respond = function (this: http2.ServerHttp2Stream, ...a: Parameters<typeof respond>) {
        const mine = stampsOf.get(this);
        if (mine) mine.respond = now();
        return respond.apply(this, a);
      };
      proto.sendTrailers = function (this: http2.ServerHttp2Stream, ...a: Parameters<typeof sendTrailers>) {
        const mine = stampsOf.get(this);
        if (mine) mine.trailers = now();
        return sendTrailers.apply(this, a);
      };
    }
  });
  return server;
};

// Written as the stop begins; the server's own SIGTERM handler then shuts down as always (and writes its traces).
process.on("SIGTERM", () => {
  if (process.env.STREAM_TIMING_OUT) writeFileSync(process.env.STREAM_TIMING_OUT, JSON.stringify(stamps));
});
