/**
 * What the HTTP listener answers a request Node's parser refuses before any route sees it. Node's
 * own answers (an empty 400, 408, 413 or 431, then the connection closed) are kept, with one
 * change: a request carrying both `Content-Length` and `Transfer-Encoding: chunked` (what Python's
 * `requests` sends when a caller sets Content-Length by hand on a streamed body) is told why, as
 * JSON, instead of an empty 400. Triton processes such a body by its chunked encoding; Trellis
 * refuses it, since a message with both framings is how request smuggling through a proxy that
 * reads the other one works (RFC 9112 §6.3 allows either; SECURITY.md, docs/triton-parity.md).
 */
import type { Duplex } from "node:stream";

/** The answer to a request that names both framings. */
export const BOTH_FRAMINGS =
  "the request has both Content-Length and Transfer-Encoding: chunked, which make its body ambiguous (RFC 9112 section 6.3); send only one of them";

/** Node's answer for the parse errors it answers by itself (lib/_http_server.js socketOnError). */
function nodeStatusLine(code: string | undefined): string {
  switch (code) {
    case "HPE_HEADER_OVERFLOW":
      return "431 Request Header Fields Too Large";
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW":
      return "413 Payload Too Large";
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return "408 Request Timeout";
    default:
      return "400 Bad Request";
  }
}

/** http.Server's 'clientError' listener (see the module comment). */
export function answerParseError(err: Error & { code?: string }, socket: Duplex): void {
  // An answer already begun on this connection (pipelining) must not be cut by ours; one not yet
  // begun (a request whose body is still arriving, as at a request timeout) is, as Node does.
  const pending = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } | null })._httpMessage;
  const busy = pending?.headersSent === true;
  if (socket.writable && !busy) {
    const both = err.code === "HPE_INVALID_TRANSFER_ENCODING" && /Content-Length/i.test(err.message);
    if (both) {
      const body = JSON.stringify({ error: BOTH_FRAMINGS });
      socket.end(
        `HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
    } else {
      socket.end(`HTTP/1.1 ${nodeStatusLine(err.code)}\r\nConnection: close\r\n\r\n`);
    }
    // end() closes once the answer is flushed; a client that never reads it is cut by the timer.
    setTimeout(() => socket.destroy(), 5_000).unref();
    return;
  }
  socket.destroy(err);
}
