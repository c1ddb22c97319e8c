import type http2 from "node:http2";

/**
 * HTTP/2 flow-control windows for tensor traffic. Node's 64 KiB defaults
 * make a batch of images (megabytes per message) wait on a WINDOW_UPDATE
 * round trip every 64 KiB; these let a whole batch flow at once.
 */
export const HTTP2_WINDOW_BYTES = 32 * 1024 * 1024;
export const HTTP2_SETTINGS: http2.Settings = { initialWindowSize: HTTP2_WINDOW_BYTES, maxFrameSize: 2 ** 24 - 1 };

/** Widens a new session's connection-level window (settings only cover streams). */
export function widenSessionWindow(session: http2.Http2Session): void {
  const widen = () => session.setLocalWindowSize(HTTP2_WINDOW_BYTES);
  if (session.connecting) session.once("connect", widen);
  else widen();
}
