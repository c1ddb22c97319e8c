/**
 * KServe v2 HTTP/REST tensors: JSON `data` (flat or nested, typed per
 * datatype, BYTES as strings) and Triton's binary-tensor extension. The
 * byte-level work is @trellis/stage's codec; this file only maps JSON
 * values onto InferTensorContents and back.
 */
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { shownValue } from "@trellis/kserve";
import { contentsFieldOf, tensorFromContents, tensorFromRaw, tensorToContents } from "@trellis/kserve/wire";
import { type InferTensorContents, InferTensorContentsSchema } from "@trellis/protocol";
import { Code, type DataType, type Parameters, StageError, type Tensor } from "@trellis/stage";
import { elementSize, isDataType } from "@trellis/stage/backend";
import { parse as parseLossless } from "lossless-json";

export interface JsonTensor {
  name: string;
  datatype: string;
  shape: number[];
  data?: unknown;
  parameters?: Record<string, unknown>;
}

export interface JsonInferRequest {
  id?: string;
  inputs: JsonTensor[];
  outputs?: { name: string; parameters?: Record<string, unknown> }[];
  parameters?: Record<string, unknown>;
}

const bad = (message: string) => new StageError(Code.InvalidArgument, "", message);

/** Triton's bound on how deeply a JSON `data` array may nest (http_server.cc HTTP_MAX_JSON_NESTING_DEPTH). */
export const MAX_DATA_NESTING = 100;

/**
 * `data`'s elements in order, flat or nested to any depth (as Triton flattens them), walked
 * without recursion and refused past Triton's nesting bound with its text: a client can nest
 * 200k deep in a few hundred kilobytes.
 */
function flatten(data: unknown): unknown[] {
  if (!Array.isArray(data)) return [data];
  if (!data.some(Array.isArray)) return data;
  const out: unknown[] = [];
  const arrays: unknown[][] = [data];
  const next: number[] = [0];
  while (arrays.length > 0) {
    const top = arrays.length - 1;
    const array = arrays[top] as unknown[];
    const i = next[top] as number;
    if (i >= array.length) {
      arrays.pop();
      next.pop();
      continue;
    }
    next[top] = i + 1;
    // The element's depth is the number of arrays around it; Triton refuses one at depth 100.
    if (arrays.length >= MAX_DATA_NESTING) {
      throw bad(`JSON nesting depth exceeds maximum allowed limit (${MAX_DATA_NESTING})`);
    }
    const v = array[i];
    if (Array.isArray(v)) {
      arrays.push(v);
      next.push(0);
    } else {
      out.push(v);
    }
  }
  return out;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Value ranges of the fixed-width integer types; a typed array would silently wrap anything outside. */
const INTEGER_RANGE: Partial<Record<DataType, [bigint, bigint]>> = {
  INT8: [-(2n ** 7n), 2n ** 7n - 1n],
  INT16: [-(2n ** 15n), 2n ** 15n - 1n],
  INT32: [-(2n ** 31n), 2n ** 31n - 1n],
  INT64: [-(2n ** 63n), 2n ** 63n - 1n],
  UINT8: [0n, 2n ** 8n - 1n],
  UINT16: [0n, 2n ** 16n - 1n],
  UINT32: [0n, 2n ** 32n - 1n],
  UINT64: [0n, 2n ** 64n - 1n],
};

/** The same ranges as numbers, for the common path (a JSON.parse number), which needs no bigint. */
const NUMBER_RANGE: Partial<Record<DataType, [number, number]>> = {
  INT8: [-(2 ** 7), 2 ** 7 - 1],
  INT16: [-(2 ** 15), 2 ** 15 - 1],
  INT32: [-(2 ** 31), 2 ** 31 - 1],
  INT64: [-(2 ** 63), 2 ** 63],
  UINT8: [0, 2 ** 8 - 1],
  UINT16: [0, 2 ** 16 - 1],
  UINT32: [0, 2 ** 32 - 1],
  UINT64: [0, 2 ** 64],
};

const INT64_MAX = 2n ** 63n - 1n;

/**
 * Thrown when an INT64 or UINT64 element read by JSON.parse is past 2^53, so its literal was
 * rounded: the caller reads the body again with parseExactJson. The common body never has one,
 * so it pays nothing for exact 64-bit integers.
 */
export class LongIntegerSeen extends StageError {
  constructor() {
    // Where a caller does not read again (the generate extension), a clear refusal.
    super(Code.InvalidArgument, "", "an INT64 or UINT64 value in 'data' is past 2^53: send it as binary data");
  }
}

/**
 * One element of `data` as its datatype's value. Read `exact`ly (parseExactJson), integers past
 * 2^53 arrive as bigints: INT64 and UINT64 take them whole; another type's range refuses them.
 */
function element(name: string, datatype: DataType, v: unknown, i: number, exact: boolean): unknown {
  const wrong = (why = `not a valid ${datatype} value`) =>
    bad(`input '${name}': element ${i} of 'data' is ${shownValue(v)}, ${why}`);
  switch (datatype) {
    case "BYTES":
      if (typeof v !== "string") throw wrong();
      return encoder.encode(v);
    case "BOOL":
      if (typeof v !== "boolean") throw wrong();
      return v;
    case "FP32":
    case "FP64":
      if (typeof v === "bigint") return Number(v);
      if (typeof v !== "number") throw wrong();
      return v;
    case "INT64":
    case "UINT64":
      // The common case first: a safe integer in range is its exact bigint.
      if (Number.isSafeInteger(v) && (datatype === "INT64" || (v as number) >= 0)) return BigInt(v as number);
      return integerElement(datatype, v, exact, wrong);
    default:
      return integerElement(datatype, v, exact, wrong);
  }
}

/** An integer element past the common case: a bigint read exactly, or a number checked against its range. */
function integerElement(datatype: DataType, v: unknown, exact: boolean, wrong: (why?: string) => StageError): unknown {
  const range = INTEGER_RANGE[datatype];
  if (typeof v === "bigint") {
    // Read exactly and past 2^53: whole for INT64 and UINT64, out of range for any other type.
    if (range && (v < range[0] || v > range[1])) throw wrong(`outside ${datatype}'s range ${range[0]}..${range[1]}`);
    return datatype === "INT64" || datatype === "UINT64" ? v : Number(v);
  }
  if (typeof v !== "number" || !Number.isInteger(v)) throw wrong();
  if (!Number.isSafeInteger(v)) {
    // JSON.parse rounded a long literal: the body is read again, exactly (see parseExactJson).
    if (!exact && (datatype === "INT64" || datatype === "UINT64")) throw new LongIntegerSeen();
    // Still a double when read exactly (an exponent form such as 1e300): no exact integer, refused.
    if (datatype === "INT64" || datatype === "UINT64") throw wrong("outside the range JSON integers carry exactly");
  }
  // Compared as numbers: no bigint per element on the common path.
  const limits = NUMBER_RANGE[datatype];
  if (range && limits && (v < limits[0] || v > limits[1])) {
    throw wrong(`outside ${datatype}'s range ${range[0]}..${range[1]}`);
  }
  return datatype === "INT64" || datatype === "UINT64" ? BigInt(v) : v;
}

function header(t: JsonTensor): { name: string; datatype: string; shape: number[] } {
  if (!t || typeof t.name !== "string") throw bad("every input needs a string 'name'");
  if (typeof t.datatype !== "string") throw bad(`input '${t.name}': missing 'datatype'`);
  const dims = t.shape as unknown[];
  if (!Array.isArray(dims) || !dims.every((d) => Number.isInteger(d) || typeof d === "bigint")) {
    throw bad(`input '${t.name}': 'shape' must be an array of integers`);
  }
  const shape = dims as (number | bigint)[];
  // As Triton counts a shape's elements (http_server.cc), before any data is read: an overflow with its text.
  if (shape.every((d) => d >= 0)) {
    const count = shape.reduce<bigint>((n, d) => n * BigInt(d), 1n);
    if (count > INT64_MAX) {
      throw bad(
        `invalid shape for input '${t.name}': shape [${shape.join(",")}] causes total element count to exceed maximum size of ${INT64_MAX}`,
      );
    }
    const size = BigInt(isDataType(t.datatype) && t.datatype !== "BYTES" ? elementSize(t.datatype) : 1);
    if (size > 1n && count > INT64_MAX / size) {
      throw bad(
        `byte size overflow for input '${t.name}': element count (${count}) * data type size (${size}) exceeds maximum allowed size (${INT64_MAX})`,
      );
    }
  }
  return { name: t.name, datatype: t.datatype, shape: shape.map(Number) };
}

/**
 * Triton's refusals of `data` whose element count is not the shape's (http_server.cc
 * ReadDataFromJson on main): more elements stop the read at the first one too many; fewer are
 * found once all are read. A BYTES input's count is checked by the model's request checks, in
 * core's words (its JSON byte size is computed from the data, so Triton's read never overruns).
 */
const TOO_MANY_ELEMENTS = "Unable to parse 'data': Shape does not match true shape of 'data' field";
const TOO_FEW_ELEMENTS = "Failed to parse 'data' field: shape does not match true shape";

/** An input from JSON `data`, its body read by JSON.parse or, `exact`, by parseExactJson. */
export function tensorFromJson(t: JsonTensor, exact = false): Tensor {
  const h = header(t);
  if (!isDataType(h.datatype)) throw bad(`input '${h.name}': unknown datatype "${h.datatype}"`);
  const field = contentsFieldOf(h.datatype);
  if (!field) {
    throw bad(
      `receiving ${h.datatype} data via JSON is not supported. Please use the binary data format for input ${h.name}`,
    );
  }
  if (t.data === undefined) throw bad(`input '${h.name}': no 'data' and no binary_data_size parameter`);
  const flat = flatten(t.data);
  if (h.datatype !== "BYTES" && h.shape.every((d) => d >= 0)) {
    const count = h.shape.reduce((n, d) => n * d, 1);
    if (flat.length > count) throw bad(TOO_MANY_ELEMENTS);
    if (flat.length < count) throw bad(TOO_FEW_ELEMENTS);
  }
  const contents = create(InferTensorContentsSchema);
  (contents[field] as unknown[]) = flat.map((v, i) => element(h.name, h.datatype as DataType, v, i, exact));
  return tensorFromContents("input", h, contents);
}

/** An input from the binary section of a request (to `model`, for Triton's byte-size refusal). */
export function tensorFromBinary(t: JsonTensor, raw: Uint8Array, model = "", requestId?: string): Tensor {
  return tensorFromRaw("input", header(t), raw, model, requestId);
}

/** An output as JSON `data` (flat, as Triton returns it). */
export function tensorToJsonData(t: Tensor): unknown[] {
  if (t.datatype === "BYTES") return (t.data as Uint8Array[]).map((b) => decoder.decode(b));
  if (t.datatype === "FP16" || t.datatype === "BF16") {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `output ${t.name}: ${t.datatype} cannot be returned as JSON; request it with binary_data`,
    );
  }
  const contents = tensorToContents(t);
  // INT64/UINT64 stay bigints: stringifyJson writes them exactly.
  return contents[contentsFieldOf(t.datatype) as keyof InferTensorContents] as unknown[];
}

/**
 * JSON text for a response body, with bigints (INT64/UINT64 data and
 * parameters) written as exact JSON integers, as Triton writes them:
 * JSON.stringify cannot write a bigint, and a double rounds past 2^53.
 */
export function stringifyJson(body: unknown): string {
  try {
    // Most bodies hold no bigint: no replacer call per value for them.
    return JSON.stringify(body);
  } catch (err) {
    if (!(err instanceof TypeError)) throw err;
  }
  let marker: string | undefined;
  const text = JSON.stringify(body, (_key, v: unknown) => {
    if (typeof v !== "bigint") return v;
    marker ??= `\u0000${randomUUID()}:`;
    return `${marker}${v}`;
  });
  if (marker === undefined) return text;
  // Each bigint came out as "<marker><digits>"; a control character plus a fresh UUID is in no other string.
  const [head = "", ...rest] = text.split(JSON.stringify(marker).slice(0, -1));
  return head + rest.map((part) => part.replace(/^(-?\d+)"/, "$1")).join("");
}

/** A JSON number's text as the value it writes: an integer past 2^53 as an exact bigint. */
function exactNumber(text: string): number | bigint {
  const n = Number(text);
  return Number.isSafeInteger(n) || !/^-?\d+$/.test(text) ? n : BigInt(text);
}

/**
 * JSON with integers past 2^53 kept exact (as bigints), as Triton reads INT64 and UINT64 data:
 * lossless-json, for a body JSON.parse rounded (LongIntegerSeen).
 */
export function parseExactJson(text: string): unknown {
  return parseLossless(text, null, exactNumber);
}

/** JSON parameters as stage Parameters (strings, numbers, booleans only). */
export function parametersFromJson(params: Record<string, unknown> | undefined, where: string): Parameters | undefined {
  if (params === undefined) return undefined;
  if (typeof params !== "object" || params === null || Array.isArray(params)) {
    throw bad(`${where}: 'parameters' must be an object`);
  }
  const out: Parameters = {};
  for (const [k, v] of Object.entries(params)) {
    if (typeof v === "string" || typeof v === "number" || typeof v === "boolean" || typeof v === "bigint") out[k] = v;
    else {
      throw bad(
        `${where}: parameter '${k}' has invalid type. It should be either 'int', 'double', 'bool', or 'string'.`,
      );
    }
  }
  return out;
}
