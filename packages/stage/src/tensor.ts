/**
 * The in-memory tensor every stage passes around. Numeric data is a typed
 * array over the tensor's bytes (little-endian, row-major), so a tensor read
 * off the wire is usually a view, not a copy. BYTES elements are separate
 * byte strings.
 */
import { randomFillSync } from "node:crypto";

export const DATATYPES = [
  "BOOL",
  "UINT8",
  "UINT16",
  "UINT32",
  "UINT64",
  "INT8",
  "INT16",
  "INT32",
  "INT64",
  "FP16",
  "BF16",
  "FP32",
  "FP64",
  "BYTES",
] as const;

export type DataType = (typeof DATATYPES)[number];

/** What `data` holds for each datatype. FP16 and BF16 are raw 16-bit patterns. */
export interface TensorDataMap {
  BOOL: Uint8Array;
  UINT8: Uint8Array;
  UINT16: Uint16Array;
  UINT32: Uint32Array;
  UINT64: BigUint64Array;
  INT8: Int8Array;
  INT16: Int16Array;
  INT32: Int32Array;
  INT64: BigInt64Array;
  FP16: Uint16Array;
  BF16: Uint16Array;
  FP32: Float32Array;
  FP64: Float64Array;
  BYTES: Uint8Array[];
}

export type TensorData = TensorDataMap[DataType];

export interface Tensor<D extends DataType = DataType> {
  name: string;
  datatype: D;
  shape: number[];
  data: TensorDataMap[D];
}

export type NumericType = Exclude<DataType, "BYTES">;

interface TypedArrayCtor {
  readonly BYTES_PER_ELEMENT: number;
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): ArrayBufferView & { length: number };
  new (length: number): ArrayBufferView & { length: number };
}

const CTORS: Record<NumericType, TypedArrayCtor> = {
  BOOL: Uint8Array,
  UINT8: Uint8Array,
  UINT16: Uint16Array,
  UINT32: Uint32Array,
  UINT64: BigUint64Array as unknown as TypedArrayCtor,
  INT8: Int8Array,
  INT16: Int16Array,
  INT32: Int32Array,
  INT64: BigInt64Array as unknown as TypedArrayCtor,
  FP16: Uint16Array,
  BF16: Uint16Array,
  FP32: Float32Array,
  FP64: Float64Array,
};

export function isDataType(s: string): s is DataType {
  return (DATATYPES as readonly string[]).includes(s);
}

/** Bytes per element; 0 for BYTES, whose elements vary in size. */
export function elementSize(datatype: DataType): number {
  return datatype === "BYTES" ? 0 : CTORS[datatype].BYTES_PER_ELEMENT;
}

/** Number of elements a shape holds. */
export function elementCount(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

export function formatShape(shape: readonly number[]): string {
  return `[${shape.join(",")}]`;
}

/**
 * A typed array of `datatype` over `bytes`: a view when the bytes are
 * aligned for the element size, else an aligned copy (typed arrays cannot
 * view misaligned memory, and protobuf gives no alignment guarantee).
 */
export function viewAs<D extends NumericType>(datatype: D, bytes: Uint8Array): TensorDataMap[D] {
  const Ctor = CTORS[datatype];
  const size = Ctor.BYTES_PER_ELEMENT;
  const length = bytes.byteLength / size;
  if (bytes.byteOffset % size === 0) {
    return new Ctor(bytes.buffer, bytes.byteOffset, length) as unknown as TensorDataMap[D];
  }
  const copy = new Uint8Array(bytes.byteLength);
  copy.set(bytes);
  return new Ctor(copy.buffer, 0, length) as unknown as TensorDataMap[D];
}

/** A zero-filled typed array of `length` elements of `datatype`. */
export function allocate<D extends NumericType>(datatype: D, length: number): TensorDataMap[D] {
  return new CTORS[datatype](length) as unknown as TensorDataMap[D];
}

/**
 * `count` random values of a numeric datatype, as Triton's random_data warmup and
 * perf_analyzer's random inputs: floats in [-1, 1), BOOL 0 or 1, FP16/BF16 all 0x3c00
 * (finite whatever the bits mean: 1.0 in FP16), integers random bytes.
 */
export function randomData<D extends NumericType>(datatype: D, count: number): TensorDataMap[D] {
  const data = allocate(datatype, count);
  if (data instanceof Float32Array || data instanceof Float64Array) {
    for (let i = 0; i < count; i++) data[i] = Math.random() * 2 - 1;
  } else if (datatype === "BOOL") {
    for (let i = 0; i < count; i++) (data as Uint8Array)[i] = Math.random() < 0.5 ? 1 : 0;
  } else if (datatype === "FP16" || datatype === "BF16") {
    (data as Uint16Array).fill(0x3c00);
  } else {
    randomFillSync(bytesOf(data as Exclude<TensorData, Uint8Array[]>));
  }
  return data;
}

/** The bytes under a numeric tensor's data, without copying. */
export function bytesOf(data: Exclude<TensorData, Uint8Array[]>): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/** Builds a tensor, checking that the data matches the shape. */
export function tensor<D extends DataType>(
  name: string,
  datatype: D,
  shape: number[],
  data: TensorDataMap[D],
): Tensor<D> {
  const expected = elementCount(shape);
  if (data.length !== expected) {
    throw new RangeError(
      `tensor ${name}: ${datatype} shape ${formatShape(shape)} needs ${expected} elements, got ${data.length}`,
    );
  }
  return { name, datatype, shape, data };
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A BYTES tensor from strings (UTF-8) or byte arrays. */
export function bytesTensor(name: string, shape: number[], items: ReadonlyArray<string | Uint8Array>): Tensor<"BYTES"> {
  return tensor(
    name,
    "BYTES",
    shape,
    items.map((s) => (typeof s === "string" ? encoder.encode(s) : s)),
  );
}

/** The elements of a BYTES tensor as UTF-8 strings. */
export function bytesToStrings(t: Tensor): string[] {
  if (t.datatype !== "BYTES") throw new TypeError(`tensor ${t.name} is ${t.datatype}, not BYTES`);
  return (t.data as Uint8Array[]).map((b) => decoder.decode(b));
}
