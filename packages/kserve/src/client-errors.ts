/** What a client may see of an error: the server's paths, addresses and stack frames withheld. */
import { ConnectError } from "@connectrpc/connect";
import { toConnectError } from "@trellis/stage/backend";

/** A URL (any scheme), to its last character that is not punctuation closing a sentence. */
const URL_PATTERN = /\b[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^\s'"`<>]*[^\s'"`<>.,:;)\]}]/g;
/** " at <URL>": where a remote model was reached, said after its name. */
const REMOTE_AT_PATTERN = new RegExp(` at ${URL_PATTERN.source}`, "g");
/** An absolute POSIX path of two or more segments, not the tail of a relative one ("1/model.onnx"). */
const PATH_PATTERN = /(?<![\w.~/-])\/[^\s/'"`<>:;,()[\]{}]+(?:\/[^\s/'"`<>:;,()[\]{}]*)+/g;
/**
 * An IPv4 or bracketed IPv6 address, with or without a port, and name lookups' host names. A
 * bracketed IPv6 address has at least two colons ("[::1]"), which tells it from a shape ("[2]").
 */
const ADDRESS_PATTERN =
  /\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[(?=[0-9a-fA-F.]*:[0-9a-fA-F.]*:)[0-9a-fA-F:.]+\](?::\d+)?|\blocalhost:\d+\b/g;
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
