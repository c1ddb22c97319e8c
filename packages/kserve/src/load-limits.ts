/**
 * Refusals of a repository load that carries too many file overrides, shared by both frontends
 * (which count before parsing) and the repository manager (which sums bytes as it writes).
 */
import { Code, StageError } from "@trellis/stage";
import type { ModelLoadLimits } from "./registry.js";

/**
 * A load of model `name` refused for carrying `files` file overrides (undefined: counting stopped
 * past the limit), past `limit` (--max-load-files).
 */
export function tooManyLoadFiles(name: string, files: number | undefined, limit: number): StageError {
  const carries =
    files === undefined
      ? `more than the ${limit} file overrides allowed`
      : `${files} file overrides, more than the ${limit} allowed`;
  return new StageError(
    Code.InvalidArgument,
    "",
    `failed to load '${name}': the request carries ${carries}; use --max-load-files to raise the limit`,
  );
}

/**
 * Refuses a load request's JSON body carrying more "file:" keys than `limits` allow, before it is
 * parsed: parsing a million keys blocks the event loop for seconds, counting to the limit does not.
 */
export function checkLoadFilesInJson(name: string, body: Uint8Array, limits: ModelLoadLimits | undefined): void {
  if (!limits) return;
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  let count = 0;
  for (let at = bytes.indexOf('"file:'); at !== -1; at = bytes.indexOf('"file:', at + 6)) {
    // A quote escaped inside a string (the config's text) opens no key.
    if (at > 0 && bytes[at - 1] === 0x5c) continue;
    if (++count > limits.maxFiles) throw tooManyLoadFiles(name, undefined, limits.maxFiles);
  }
}

/** A load of model `name` refused for `bytes` of file overrides (or more), past `limit` (--max-load-bytes). */
export function tooManyLoadBytes(name: string, bytes: number, limit: number): StageError {
  return new StageError(
    Code.InvalidArgument,
    "",
    `failed to load '${name}': the request's file overrides hold ${bytes} bytes, more than the ${limit} bytes allowed; use --max-load-bytes to raise the limit`,
  );
}
