/**
 * What Trellis reads off an .onnx file itself, by walking its protobuf fields with positioned
 * reads: only the small messages asked for are read, so a (possibly gigabyte) graph's weights are
 * skipped, never loaded. ModelProto: graph = 7, metadata_props = 14. GraphProto: initializer = 5,
 * input = 11. TensorProto: dims = 1, data_type = 2, name = 8. ValueInfoProto: name = 1.
 */
import { type FileHandle, open } from "node:fs/promises";
import type { ModelTensorInfo } from "./protocol.js";

/** A length-delimited field of a message: its number and where its bytes lie in the file. */
interface Field {
  field: number;
  start: number;
  length: number;
}

/** TensorProto.data_type → onnxruntime-node's type name (ONNX's DataType enum). */
const ONNX_ELEMENT_TYPES: Record<number, string> = {
  1: "float32",
  2: "uint8",
  3: "int8",
  4: "uint16",
  5: "int16",
  6: "int32",
  7: "int64",
  8: "string",
  9: "bool",
  10: "float16",
  11: "float64",
  12: "uint32",
  13: "uint64",
};

/** A varint at `i` of `buf`: its value and the index after it. */
function varint(buf: Uint8Array, i: number): [number, number] {
  let value = 0;
  let mul = 1;
  for (;;) {
    const b = buf[i];
    if (b === undefined) throw new Error("truncated varint");
    value += (b & 0x7f) * mul;
    i++;
    if (b < 0x80) return [value, i];
    mul *= 128;
  }
}

async function readAt(file: FileHandle, length: number, at: number): Promise<Buffer> {
  const buf = Buffer.alloc(length);
  const { bytesRead } = await file.read(buf, 0, length, at);
  return buf.subarray(0, bytesRead);
}

/** One field of a message in the file: a varint's value, or where a length-delimited one's bytes lie. */
type FileField = { field: number; wire: 0; value: number } | { field: number; wire: 2; start: number; length: number };

/** The varint and length-delimited fields of the message in [start, end) of the file, in order (fixed-size ones skipped). */
async function* walkFields(file: FileHandle, start: number, end: number): AsyncGenerator<FileField> {
  let pos = start;
  while (pos < end) {
    const head = await readAt(file, 20, pos);
    const [tag, afterTag] = varint(head, 0);
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire === 0) {
      const [value, after] = varint(head, afterTag);
      yield { field, wire, value };
      pos += after;
    } else if (wire === 2) {
      const [length, afterLength] = varint(head, afterTag);
      yield { field, wire, start: pos + afterLength, length };
      pos += afterLength + length;
    } else if (wire === 1) pos += afterTag + 8;
    else if (wire === 5) pos += afterTag + 4;
    else throw new Error(`unexpected wire type ${wire} at byte ${pos}`);
  }
}

/** The length-delimited fields of the message in [start, end) of the file whose number is in `wanted`. */
async function fieldsOf(file: FileHandle, start: number, end: number, wanted: Set<number>): Promise<Field[]> {
  const found: Field[] = [];
  for await (const f of walkFields(file, start, end)) {
    if (f.wire === 2 && wanted.has(f.field)) found.push({ field: f.field, start: f.start, length: f.length });
  }
  return found;
}

/** The fields of a small message held in memory: varints by number (repeated ones in order), and byte fields. */
function decodeSmall(buf: Uint8Array): { ints: Map<number, number[]>; bytes: Map<number, Uint8Array[]> } {
  const ints = new Map<number, number[]>();
  const bytes = new Map<number, Uint8Array[]>();
  const push = <T>(m: Map<number, T[]>, k: number, v: T) => m.set(k, [...(m.get(k) ?? []), v]);
  let i = 0;
  while (i < buf.length) {
    const [tag, afterTag] = varint(buf, i);
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire === 0) {
      const [value, after] = varint(buf, afterTag);
      push(ints, field, value);
      i = after;
    } else if (wire === 2) {
      const [length, afterLength] = varint(buf, afterTag);
      push(bytes, field, buf.subarray(afterLength, afterLength + length));
      i = afterLength + length;
    } else if (wire === 1) i = afterTag + 8;
    else if (wire === 5) i = afterTag + 4;
    else throw new Error(`unexpected wire type ${wire}`);
  }
  return { ints, bytes };
}

const text = (b: Uint8Array | undefined) => (b ? new TextDecoder().decode(b) : "");

async function withFile<T>(path: string, read: (file: FileHandle, size: number) => Promise<T>): Promise<T> {
  const file = await open(path, "r");
  try {
    return await read(file, (await file.stat()).size);
  } finally {
    await file.close();
  }
}

/** The ONNX ModelProto's metadata_props (key = 1, value = 2), the graph skipped, not decoded. */
export function readOnnxMetadataProps(path: string): Promise<Record<string, string>> {
  return withFile(path, async (file, size) => {
    const props: Record<string, string> = {};
    for (const entry of await fieldsOf(file, 0, size, new Set([14]))) {
      const { bytes } = decodeSmall(await readAt(file, entry.length, entry.start));
      props[text(bytes.get(1)?.[0])] = text(bytes.get(2)?.[0]);
    }
    return props;
  });
}

/**
 * The graph inputs that have an initializer of the same name (ONNX IR 4 on): inputs a request may
 * leave out, the initializer's value standing in, or give to override it. onnxruntime does not
 * list them among a session's inputs (onnxruntime-node has no call for them), yet takes them as
 * feeds. Type and shape are the initializer's.
 */
export function readOverridableInitializers(path: string): Promise<ModelTensorInfo[]> {
  return withFile(path, async (file, size) => {
    const graph = (await fieldsOf(file, 0, size, new Set([7])))[0];
    if (!graph) return [];
    const parts = await fieldsOf(file, graph.start, graph.start + graph.length, new Set([5, 11]));
    const inputNames = new Set<string>();
    for (const input of parts.filter((p) => p.field === 11)) {
      inputNames.add(text(decodeSmall(await readAt(file, input.length, input.start)).bytes.get(1)?.[0]));
    }
    const found: ModelTensorInfo[] = [];
    for (const initializer of parts.filter((p) => p.field === 5)) {
      const { name, dims, dataType } = await tensorHead(
        file,
        initializer.start,
        initializer.start + initializer.length,
      );
      if (!inputNames.has(name)) continue;
      found.push({ name, type: ONNX_ELEMENT_TYPES[dataType] ?? `onnx type ${dataType}`, shape: dims });
    }
    return found;
  });
}

/**
 * A TensorProto's name (field 8), dims (field 1, packed or not) and data_type (field 2): only
 * those are read, its values (raw_data and the typed lists) skipped.
 */
async function tensorHead(
  file: FileHandle,
  start: number,
  end: number,
): Promise<{ name: string; dims: number[]; dataType: number }> {
  let name = "";
  const dims: number[] = [];
  let dataType = 0;
  for await (const f of walkFields(file, start, end)) {
    if (f.wire === 0) {
      if (f.field === 1) dims.push(f.value);
      if (f.field === 2) dataType = f.value;
    } else if (f.field === 8) {
      name = text(await readAt(file, f.length, f.start));
    } else if (f.field === 1) {
      const packed = await readAt(file, f.length, f.start);
      for (let i = 0; i < packed.length; ) {
        const [value, after] = varint(packed, i);
        dims.push(value);
        i = after;
      }
    }
  }
  return { name, dims, dataType };
}
