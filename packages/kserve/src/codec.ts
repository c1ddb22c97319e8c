/**
 * Conversion between our Tensor and the KServe v2 wire forms: the raw_*
 * byte strings (little-endian, row-major, BYTES framed as 4-byte LE length +
 * bytes) and the typed InferTensorContents.
 */
import { create } from "@bufbuild/protobuf";
import { type InferTensorContents, InferTensorContentsSchema } from "@trellis/protocol";
import { Code, type DataType, elementCount, formatShape, StageError, type Tensor } from "@trellis/stage";
import {
  allocate,
  bytesOf,
  countFramedElements,
  elementSize,
  framedElements,
  frameElements,
  isDataType,
  requestRefusal,
  type TensorDataMap,
  tritonMessages,
  viewAs,
} from "@trellis/stage/backend";

/** Which side a tensor is on; it opens every codec error message. */
export type TensorRole = "input" | "output";

/** Everything about a tensor but its data. */
export interface TensorHeader {
  name: string;
  datatype: string;
  shape: readonly (number | bigint)[];
}

function fail(role: TensorRole, name: string, message: string, stage = ""): StageError {
  return new StageError(Code.InvalidArgument, stage, `${role} ${name}: ${message}`);
}

/** Checks datatype and shape of a wire header, returning them typed. */
export function checkHeader(
  role: TensorRole,
  header: TensorHeader,
  stage = "",
): { datatype: DataType; shape: number[] } {
  if (!isDataType(header.datatype)) {
    throw fail(role, header.name, `unknown datatype "${header.datatype}"`, stage);
  }
  const shape = header.shape.map(Number);
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) {
      throw fail(role, header.name, `invalid shape ${formatShape(shape)}`, stage);
    }
  }
  return { datatype: header.datatype, shape };
}

/**
 * Reads a tensor from its raw bytes; numeric data is a view where aligned. An input of the wrong
 * byte size for a known model (`stage`) is refused in Triton's words, with the request's id.
 */
export function tensorFromRaw(
  role: TensorRole,
  header: TensorHeader,
  raw: Uint8Array,
  stage = "",
  requestId?: string,
): Tensor {
  const { datatype, shape } = checkHeader(role, header, stage);
  const { name } = header;
  const count = elementCount(shape);
  if (datatype === "BYTES") {
    return { name, datatype, shape, data: unframeBytes(role, name, shape, count, raw, stage, requestId) };
  }
  const needed = count * elementSize(datatype);
  if (raw.byteLength !== needed && role === "input" && stage) {
    throw requestRefusal(tritonMessages.byteSize(requestId, stage, name, needed, raw.byteLength));
  }
  if (raw.byteLength !== needed) {
    throw fail(
      role,
      name,
      `${datatype} shape ${formatShape(shape)} needs ${needed} bytes, got ${raw.byteLength}`,
      stage,
    );
  }
  return { name, datatype, shape, data: viewAs(datatype, raw) } as Tensor;
}

/**
 * BYTES elements as views into `raw`, packed (one buffer, not one object per element:
 * ten million short strings stay the buffer they arrived in).
 */
function unframeBytes(
  role: TensorRole,
  name: string,
  shape: number[],
  count: number,
  raw: Uint8Array,
  stage: string,
  requestId?: string,
): Uint8Array[] {
  const found = countFramedElements(raw);
  // A request's input is refused in Triton's words (core's string input checks).
  const triton = role === "input" && stage !== "";
  if (typeof found !== "number") {
    if (triton && found.kind === "prefix") {
      throw requestRefusal(tritonMessages.stringLengthIndicator(requestId, stage, name, found.remaining));
    }
    if (triton && found.index >= count) {
      throw requestRefusal(tritonMessages.stringCountOver(requestId, stage, name, count));
    }
    throw fail(role, name, found.message, stage);
  }
  if (found !== count) {
    if (triton) {
      throw requestRefusal(
        found > count
          ? tritonMessages.stringCountOver(requestId, stage, name, count)
          : tritonMessages.stringCount(requestId, stage, name, count, found),
      );
    }
    throw fail(role, name, `BYTES shape ${formatShape(shape)} needs ${count} elements, got ${found}`, stage);
  }
  return framedElements(raw, count);
}

/** A tensor's raw bytes; numeric tensors return a view of their data. */
export function tensorToRaw(t: Tensor): Uint8Array {
  if (t.datatype === "BYTES") return frameBytes(t.data as Uint8Array[]);
  return bytesOf(t.data as Exclude<TensorDataMap[DataType], Uint8Array[]>);
}

/** Frames BYTES elements as 4-byte little-endian length + bytes (a new buffer, unless they are packed already). */
export function frameBytes(items: readonly Uint8Array[]): Uint8Array {
  return frameElements(items);
}

/** The InferTensorContents field that carries each datatype. */
const CONTENTS_FIELD = {
  BOOL: "boolContents",
  UINT8: "uintContents",
  UINT16: "uintContents",
  UINT32: "uintContents",
  UINT64: "uint64Contents",
  INT8: "intContents",
  INT16: "intContents",
  INT32: "intContents",
  INT64: "int64Contents",
  FP32: "fp32Contents",
  FP64: "fp64Contents",
  BYTES: "bytesContents",
} as const satisfies Partial<Record<DataType, keyof InferTensorContents>>;

/** The InferTensorContents field that carries `datatype`; undefined for FP16/BF16 (raw only). */
export function contentsFieldOf(datatype: DataType): keyof InferTensorContents | undefined {
  return datatype === "FP16" || datatype === "BF16" ? undefined : CONTENTS_FIELD[datatype];
}

/** Reads a tensor from typed contents. FP16/BF16 have no typed field. */
export function tensorFromContents(
  role: TensorRole,
  header: TensorHeader,
  contents: InferTensorContents,
  stage = "",
): Tensor {
  const { datatype, shape } = checkHeader(role, header, stage);
  const { name } = header;
  if (datatype === "FP16" || datatype === "BF16") {
    throw fail(role, name, `${datatype} data must be sent as raw contents`, stage);
  }
  const field = CONTENTS_FIELD[datatype];
  const values = contents[field] as ArrayLike<unknown>;
  const count = elementCount(shape);
  if (values.length !== count) {
    throw fail(
      role,
      name,
      `${datatype} shape ${formatShape(shape)} needs ${count} elements in ${field}, got ${values.length}`,
      stage,
    );
  }
  if (datatype === "BYTES") {
    return { name, datatype, shape, data: [...(values as Uint8Array[])] };
  }
  const data = allocate(datatype, count);
  if (datatype === "BOOL") {
    const bools = values as boolean[];
    for (let i = 0; i < count; i++) data[i] = bools[i] ? 1 : 0;
  } else if (datatype === "INT64" || datatype === "UINT64") {
    const big = data as BigInt64Array | BigUint64Array;
    const src = values as bigint[];
    for (let i = 0; i < count; i++) big[i] = BigInt(src[i] as bigint);
  } else {
    (data as Float64Array).set(values as number[]);
  }
  return { name, datatype, shape, data } as Tensor;
}

/** A tensor as typed contents (raw bytes are the faster path; this is for JSON and old clients). */
export function tensorToContents(t: Tensor): InferTensorContents {
  if (t.datatype === "FP16" || t.datatype === "BF16") {
    throw new StageError(Code.InvalidArgument, "", `tensor ${t.name}: ${t.datatype} has no typed contents field`);
  }
  const field = CONTENTS_FIELD[t.datatype];
  const contents = create(InferTensorContentsSchema);
  if (t.datatype === "BOOL") {
    contents.boolContents = Array.from(t.data as Uint8Array, (v) => v !== 0);
  } else if (t.datatype === "BYTES") {
    contents.bytesContents = [...(t.data as Uint8Array[])];
  } else {
    (contents[field] as unknown[]) = Array.from(t.data as ArrayLike<number | bigint>);
  }
  return contents;
}
