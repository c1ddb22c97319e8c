/**
 * Loading Triton's config.pbtxt into our ModelConfig with protobuf-es's
 * text-format parser.
 */
import { readFile } from "node:fs/promises";
import { fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import { fromText } from "@bufbuild/protobuf/txtpb";
import { type ModelConfig, ModelConfigSchema } from "./gen/model_config_pb.js";

/** A config.pbtxt that does not parse; the message reads `path:line:col: reason`. */
export class ModelConfigError extends Error {
  override name = "ModelConfigError";
  constructor(
    readonly path: string,
    readonly line: number,
    readonly column: number,
    readonly reason: string,
  ) {
    super(`${path}:${line}:${column}: ${reason}`);
  }
}

function parseError(text: string): string | undefined {
  try {
    fromText(ModelConfigSchema, text);
    return undefined;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
}

/**
 * Where in `text` the parser fails with `reason`. The parser reports no
 * position, so we find the shortest prefix that fails the same way (a
 * prefix cut short elsewhere only fails with "end of input"), then step
 * back to the start of the token that prefix ends in.
 */
function locate(text: string, reason: string): { line: number; column: number } {
  let lo = 0;
  let hi = text.length;
  // Failing "the same way" is monotone in the prefix length: once a prefix
  // contains the bad token, every longer prefix does too.
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (parseError(text.slice(0, mid)) === reason) hi = mid;
    else lo = mid + 1;
  }
  let end = lo;
  while (end > 0 && /[\w."'\-+]/.test(text[end - 1] ?? "") && /[\w."'\-+]/.test(text[end - 2] ?? "")) end--;
  // Unless the prefix ended right after whitespace, its last character belongs to the bad token.
  if (end > 0 && !/\s/.test(text[end - 1] ?? "")) end--;
  const before = text.slice(0, end);
  const line = before.split("\n").length;
  const column = end - (before.lastIndexOf("\n") + 1) + 1;
  return { line, column };
}

/** Parses config.pbtxt text; `path` is only used in error messages. */
export function parseModelConfig(text: string, path = "config.pbtxt"): ModelConfig {
  try {
    return fromText(ModelConfigSchema, text);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    const { line, column } = locate(text, reason);
    throw new ModelConfigError(path, line, column, reason);
  }
}

/** Reads and parses a config.pbtxt file. */
export async function loadModelConfig(path: string): Promise<ModelConfig> {
  return parseModelConfig(await readFile(path, "utf8"), path);
}

/**
 * Parses a model config in Triton's JSON form, as a load request's "config"
 * parameter carries it and GET .../config answers it (snake_case or
 * camelCase fields, int64 as numbers or strings). Throws an Error naming
 * `source` and what is wrong.
 */
export function parseModelConfigJson(text: string, source = "config"): ModelConfig {
  let json: JsonValue;
  try {
    json = JSON.parse(text) as JsonValue;
  } catch (err) {
    throw new Error(`${source} is not JSON: ${(err as Error).message}`);
  }
  try {
    return fromJson(ModelConfigSchema, json);
  } catch (err) {
    throw new Error(`${source} is not a model config: ${(err as Error).message}`);
  }
}

type Json = { [key: string]: JsonValue };

const asObject = (value: JsonValue | undefined): Json | undefined =>
  value !== null && typeof value === "object" && !Array.isArray(value) ? value : undefined;
const asArray = (value: JsonValue | undefined): JsonValue[] => (Array.isArray(value) ? value : []);

/** A 64-bit field protobuf's JSON wrote as a string, written as a number instead. */
function fixNumber(obj: Json | undefined, key: string): void {
  const v = obj?.[key];
  if (obj && typeof v === "string" && /^-?\d+$/.test(v)) obj[key] = Number(v);
}

/** A repeated 64-bit field, each element written as a number. */
function fixNumbers(obj: Json | undefined, key: string): void {
  const v = obj?.[key];
  if (obj && Array.isArray(v)) obj[key] = v.map((d) => (typeof d === "string" && /^-?\d+$/.test(d) ? Number(d) : d));
}

/**
 * A model config as Triton's ModelConfigToJson writes it (core src/model_config_utils.cc):
 * protobuf's JSON with the proto field names and every implicit field shown, then exactly
 * the 64-bit fields Triton fixes written as numbers instead of protobuf's strings. The
 * fields it leaves alone stay strings as in Triton: map keys (priority_queue_policy),
 * sequence_batching state initial_state dims (its lookup for them misses), CUDA graph
 * spec dims and secondary device ids.
 */
export function modelConfigToJson(config: ModelConfig): JsonValue {
  const json = toJson(ModelConfigSchema, config, { useProtoFieldName: true, alwaysEmitImplicit: true }) as Json;
  for (const key of ["input", "output"]) {
    for (const io of asArray(json[key])) {
      fixNumbers(asObject(io), "dims");
      fixNumbers(asObject(asObject(io)?.reshape), "shape");
    }
  }
  fixNumbers(asObject(asObject(json.version_policy)?.specific), "versions");

  const db = asObject(json.dynamic_batching);
  for (const key of ["max_queue_delay_microseconds", "priority_levels", "default_priority_level"]) fixNumber(db, key);
  fixNumber(asObject(db?.default_queue_policy), "default_timeout_microseconds");
  for (const policy of Object.values(asObject(db?.priority_queue_policy) ?? {})) {
    fixNumber(asObject(policy), "default_timeout_microseconds");
  }

  const sb = asObject(json.sequence_batching);
  fixNumber(sb, "max_sequence_idle_microseconds");
  fixNumber(asObject(sb?.oldest), "max_queue_delay_microseconds");
  fixNumber(asObject(sb?.direct), "max_queue_delay_microseconds");
  for (const state of asArray(sb?.state)) fixNumbers(asObject(state), "dims");

  for (const step of asArray(asObject(json.ensemble_scheduling)?.step)) fixNumber(asObject(step), "model_version");

  for (const warmup of asArray(json.model_warmup)) {
    for (const input of Object.values(asObject(asObject(warmup)?.inputs) ?? {})) fixNumbers(asObject(input), "dims");
  }
  return json;
}
