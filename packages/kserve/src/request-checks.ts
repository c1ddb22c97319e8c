/**
 * Checks on what a client sends that every frontend makes alike: the KServe / Triton request
 * parameters whose type the protocol fixes, and the names a load request writes or reads by.
 * A wrong one is the client's mistake, refused with INVALID_ARGUMENT naming it, never ignored.
 */

import type { InferOptions, Parameters } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import { tritonMessages } from "@trellis/stage/backend";

type ParameterValue = Parameters[string] | Uint8Array | null | undefined;

/** A value as an error message shows it: short, and never by walking a structure a client built. */
export function shownValue(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v);
  if (typeof v === "bigint" || typeof v === "number" || typeof v === "boolean") return String(v);
  if (v === null) return "null";
  if (v === undefined) return "nothing";
  if (v instanceof Uint8Array) return "bytes";
  return Array.isArray(v) ? "an array" : "an object";
}

const isUnsigned = (v: ParameterValue): boolean =>
  (typeof v === "bigint" && v >= 0n) || (typeof v === "number" && Number.isSafeInteger(v) && v >= 0);

/**
 * Triton's request parameters with a fixed type, checked (priority and timeout are unsigned
 * integers, sequence_id an unsigned integer or a string, sequence_start and sequence_end
 * booleans), and the options priority and timeout give. Other parameters pass as they are.
 */
export function inferOptionsFromParameters(parameters: Parameters | undefined, model = ""): InferOptions {
  const options: InferOptions = {};
  if (!parameters) return options;
  const refuse = (key: string, expected: string) =>
    new StageError(
      Code.InvalidArgument,
      model,
      `request parameter '${key}' must be ${expected}, got ${shownValue(parameters[key])}`,
    );
  const { priority, timeout, sequence_id: sequenceId } = parameters as Record<string, ParameterValue>;
  if (priority !== undefined) {
    if (!isUnsigned(priority)) throw refuse("priority", "an unsigned integer");
    options.priority = Number(priority);
  }
  if (timeout !== undefined) {
    if (!isUnsigned(timeout)) throw refuse("timeout", "an unsigned integer (microseconds)");
    options.timeoutMicroseconds = Number(timeout);
  }
  if (sequenceId !== undefined && typeof sequenceId !== "string" && !isUnsigned(sequenceId)) {
    throw refuse("sequence_id", "an unsigned integer or a string");
  }
  for (const key of ["sequence_start", "sequence_end"]) {
    const flag = parameters[key];
    if (flag !== undefined && typeof flag !== "boolean") throw refuse(key, "a boolean");
  }
  return options;
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it looks for
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * Why `name` cannot be a model's name, or undefined when it can. A load with files makes a folder
 * of that name, so it is one folder name: no separators, no '.' or '..', no control characters
 * (a NUL cuts a path short), at most 255 bytes. Where Triton refuses it too (empty or only
 * whitespace; '..' or a '/'), this is Triton's whole message (core's ValidateModelName).
 */
export function modelNameProblem(name: string): string | undefined {
  const trimmed = name.trim();
  if (trimmed === "") return tritonMessages.emptyModelName();
  if (trimmed === ".." || name.includes("/")) return tritonMessages.modelNamePathTraversal(name);
  if (name === ".") return `a model name must not be "${name}"`;
  if (name.includes("\\") || CONTROL.test(name)) return "a model name must not contain '/', '\\' or control characters";
  if (Buffer.byteLength(name) > 255) return "a model name must be at most 255 bytes";
  return undefined;
}

/**
 * The refusal of `name` as a model's name, or undefined when it can be one: Triton's words as they
 * are where Triton refuses it too, else `prefix: why`.
 */
export function modelNameRefusal(name: string, prefix = `invalid model name ${shownValue(name)}`): string | undefined {
  const problem = modelNameProblem(name);
  if (problem === undefined) return undefined;
  const triton = problem === tritonMessages.emptyModelName() || problem === tritonMessages.modelNamePathTraversal(name);
  return triton ? problem : `${prefix}: ${problem}`;
}

/** A model name a repository request (load, unload) may carry, else INVALID_ARGUMENT saying why. */
export function checkModelName(name: string): void {
  const refusal = modelNameRefusal(name);
  if (refusal) throw new StageError(Code.InvalidArgument, "", refusal);
}

/** Longest file override path, and longest name in it (Linux's PATH_MAX and NAME_MAX). */
const MAX_OVERRIDE_PATH_BYTES = 4096;
const MAX_OVERRIDE_NAME_BYTES = 255;

/**
 * A load request's file override path ("file:<path>"): no control characters, at most 4096
 * bytes, each name in it at most 255 (what the filesystem would refuse with ENAMETOOLONG).
 */
export function checkFileOverridePath(path: string): void {
  if (CONTROL.test(path)) {
    throw new StageError(Code.InvalidArgument, "", `load parameter 'file:${path}' contains a control character`);
  }
  const tooLong =
    Buffer.byteLength(path) > MAX_OVERRIDE_PATH_BYTES ||
    path.split(/[/\\]/).some((name) => Buffer.byteLength(name) > MAX_OVERRIDE_NAME_BYTES);
  if (tooLong) {
    const shown = path.length > 64 ? `${path.slice(0, 64)}...` : path;
    throw new StageError(
      Code.InvalidArgument,
      "",
      `load parameter 'file:${shown}' is too long: a file override's path may have at most ${MAX_OVERRIDE_PATH_BYTES} bytes, each name in it ${MAX_OVERRIDE_NAME_BYTES}`,
    );
  }
}
