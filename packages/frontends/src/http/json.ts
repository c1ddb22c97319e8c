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
import { isDataType } from "@trellis/stage/backend";

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

/**
 * `data`'s elements in order, flat or nested (as Triton takes them), walked without recursion:
 * nesting deeper than the shape has dimensions is refused, not followed (a client can nest
 * 200k deep in a few hundred kilobytes).
 */
function flatten(name: string, data: unknown, rank: number): unknown[] {
  if (!Array.isArray(data)) return [data];
  if (!data.some(Array.isArray)) return data;
  const maxDepth = Math.max(rank, 1);
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
    const v = array[i];
    if (!Array.isArray(v)) {
      out.push(v);
    } else if (arrays.length >= maxDepth) {
      throw bad(`input '${name}': 'data' is nested deeper than its shape's ${rank} dimension${rank === 1 ? "" : "s"}`);
    } else {
      arrays.push(v);
      next.push(0);
    }
  }
  return out;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Value ranges of the fixed-width integer types; a typed array would silently wrap anything outside. */
const INTEGER_RANGE: Partial<Record<DataType, [number, number]>> = {
  INT8: [-(2 ** 7), 2 ** 7 - 1],
  INT16: [-(2 ** 15), 2 ** 15 - 1],
  INT32: [-(2 ** 31), 2 ** 31 - 1],
  UINT8: [0, 2 ** 8 - 1],
  UINT16: [0, 2 ** 16 - 1],
  UINT32: [0, 2 ** 32 - 1],
  // JSON numbers are doubles: past 2^53 the value a client wrote is already lost.
  INT64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  UINT64: [0, Number.MAX_SAFE_INTEGER],
};

function element(name: string, datatype: DataType, v: unknown, i: number): unknown {
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
      if (typeof v !== "number") throw wrong();
      return v;
    default: {
      if (typeof v !== "number" || !Number.isInteger(v)) throw wrong();
      const [min, max] = INTEGER_RANGE[datatype] ?? [v, v];
      if (v < min || v > max) {
        const big = datatype === "INT64" || datatype === "UINT64";
        throw wrong(
          `outside ${datatype}'s range ${min}..${max}${big ? " that JSON carries exactly (send larger values as binary data)" : ""}`,
        );
      }
      return datatype === "INT64" || datatype === "UINT64" ? BigInt(v) : v;
    }
  }
}

function header(t: JsonTensor): { name: string; datatype: string; shape: number[] } {
  if (!t || typeof t.name !== "string") throw bad("every input needs a string 'name'");
  if (typeof t.datatype !== "string") throw bad(`input '${t.name}': missing 'datatype'`);
  if (!Array.isArray(t.shape) || !t.shape.every((d) => Number.isInteger(d))) {
    throw bad(`input '${t.name}': 'shape' must be an array of integers`);
  }
  return { name: t.name, datatype: t.datatype, shape: t.shape };
}

/** An input from JSON `data`. */
export function tensorFromJson(t: JsonTensor): Tensor {
  const h = header(t);
  if (!isDataType(h.datatype)) throw bad(`input '${h.name}': unknown datatype "${h.datatype}"`);
  const field = contentsFieldOf(h.datatype);
  if (!field) {
    throw bad(
      `receiving ${h.datatype} data via JSON is not supported. Please use the binary data format for input ${h.name}`,
    );
  }
  if (t.data === undefined) throw bad(`input '${h.name}': no 'data' and no binary_data_size parameter`);
  const flat = flatten(h.name, t.data, h.shape.length);
  const contents = create(InferTensorContentsSchema);
  (contents[field] as unknown[]) = flat.map((v, i) => element(h.name, h.datatype as DataType, v, i));
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

/** JSON parameters as stage Parameters (strings, numbers, booleans only). */
export function parametersFromJson(params: Record<string, unknown> | undefined, where: string): Parameters | undefined {
  if (params === undefined) return undefined;
  if (typeof params !== "object" || params === null || Array.isArray(params)) {
    throw bad(`${where}: 'parameters' must be an object`);
  }
  const out: Parameters = {};
  for (const [k, v] of Object.entries(params)) {
    if (typeof v === "string" || typeof v === "number" || typeof v === "boolean") out[k] = v;
    else {
      throw bad(
        `${where}: parameter '${k}' has invalid type. It should be either 'int', 'double', 'bool', or 'string'.`,
      );
    }
  }
  return out;
}
