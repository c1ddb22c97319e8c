import { Code, ConnectError } from "@connectrpc/connect";

export { Code };

/**
 * An error raised by a stage. It is a ConnectError, so its code survives
 * every transport unchanged; `stage` names the model that raised it.
 */
export class StageError extends ConnectError {
  readonly stage: string;

  // ConnectError answers instanceof by shape; StageError and its subclasses use the prototype chain.
  static override [Symbol.hasInstance](v: unknown): boolean {
    // biome-ignore lint/complexity/noThisInStatic: `this` is the class instanceof asks about, a subclass too
    return v instanceof Error && Object.prototype.isPrototypeOf.call(this.prototype, v);
  }

  constructor(code: Code, stage: string, message: string, options?: { cause?: unknown }) {
    super(stage ? `${stage}: ${message}` : message, code, undefined, undefined, options?.cause);
    // ConnectError's constructor pins the prototype to ConnectError; restore ours.
    Object.setPrototypeOf(this, new.target.prototype);
    // `name` must stay "ConnectError": Connect recognises its errors by name and shape,
    // and sends any other error as INTERNAL. Pinned, so a subclass that sets its own
    // name fails at once instead of losing its code on the wire.
    Object.defineProperty(this, "name", { value: "ConnectError", writable: false, configurable: false });
    this.stage = stage;
  }
}

/** Shorthands for the codes stages raise most. */
export const invalidArgument = (stage: string, message: string) => new StageError(Code.InvalidArgument, stage, message);
export const notFound = (stage: string, message: string) => new StageError(Code.NotFound, stage, message);
export const unavailable = (stage: string, message: string) => new StageError(Code.Unavailable, stage, message);
export const resourceExhausted = (stage: string, message: string) =>
  new StageError(Code.ResourceExhausted, stage, message);
export const internal = (stage: string, message: string) => new StageError(Code.Internal, stage, message);

/**
 * Turns anything thrown into a ConnectError, keeping its code when it has
 * one. Unknown errors become INTERNAL so nothing leaves a stage untyped.
 */
export function toConnectError(err: unknown, stage = ""): ConnectError {
  if (err instanceof ConnectError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new StageError(Code.Internal, stage, message, { cause: err });
}

/** The protocol's wording of a Connect code, e.g. INVALID_ARGUMENT. */
export function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** A URL (any scheme), to its last character that is not punctuation closing a sentence. */
const URL_PATTERN = /\b[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^\s'"`<>]*[^\s'"`<>.,:;)\]}]/g;
/** " at <URL>": where a remote model was reached, said after its name. */
const REMOTE_AT_PATTERN = new RegExp(` at ${URL_PATTERN.source}`, "g");
/** An absolute POSIX path of two or more segments, not the tail of a relative one ("1/model.onnx"). */
const PATH_PATTERN = /(?<![\w.~/-])\/[^\s/'"`<>:;,()[\]{}]+(?:\/[^\s/'"`<>:;,()[\]{}]*)+/g;
/** An IPv4 or bracketed IPv6 address, with or without a port, and name lookups' host names. */
const ADDRESS_PATTERN = /\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-fA-F:.]+\](?::\d+)?|\blocalhost:\d+\b/g;
const LOOKUP_PATTERN = /\b(ENOTFOUND|EAI_AGAIN|EAI_FAIL|EAI_NONAME) [^\s:;,)]+/g;
/** Stack frames ("    at f (/x/y.js:1:2)"). */
const STACK_PATTERN = /\n\s+at [^\n]*/g;

const lastSegment = (path: string) => path.replace(/\/+$/, "").split("/").at(-1) || "/";

/**
 * `message` as a client may see it: the server's filesystem paths shortened to their last
 * segment (a file's name says which file; where it lies is the server's business), URLs and
 * network addresses withheld, stack frames dropped. The full text belongs in the server's log.
 */
export function clientMessage(message: string): string {
  return (
    message
      .replace(STACK_PATTERN, "")
      .replace(REMOTE_AT_PATTERN, "")
      .replace(URL_PATTERN, (url) => (url.toLowerCase().startsWith("file:") ? lastSegment(url) : "<address>"))
      // The server's own paths are normalised; one with "." or ".." segments is a client's, echoed.
      .replace(PATH_PATTERN, (path) => (/\/\.\.?(\/|$)/.test(path) ? path : lastSegment(path)))
      .replace(LOOKUP_PATTERN, "$1 <address>")
      .replace(ADDRESS_PATTERN, "<address>")
  );
}

/**
 * `err` as a client may see it (see clientMessage), with its code; the same error when its
 * message has nothing to withhold. `withheld` hears of the rest, to log the detail.
 */
export function clientError(err: unknown, withheld?: (detail: string, sent: string) => void): ConnectError {
  const ce = toConnectError(err);
  const sent = clientMessage(ce.rawMessage);
  if (sent === ce.rawMessage) return ce;
  withheld?.(ce.rawMessage, sent);
  return new ConnectError(sent, ce.code, ce.metadata, undefined, err);
}
