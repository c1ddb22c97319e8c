/**
 * Small helpers over our ONNX protobuf subset (proto/onnx.proto): building
 * tensors, value infos and nodes, and reading a model file's metadata.
 */
import { open } from "node:fs/promises";
import { create } from "@bufbuild/protobuf";
import {
  type AttributeProto,
  AttributeProto_AttributeType,
  AttributeProtoSchema,
  type NodeProto,
  NodeProtoSchema,
  type TensorProto,
  TensorProto_DataType,
  TensorProtoSchema,
  TensorShapeProto_DimensionSchema,
  TensorShapeProtoSchema,
  type TypeProto_Tensor,
  TypeProto_TensorSchema,
  TypeProtoSchema,
  type ValueInfoProto,
  ValueInfoProtoSchema,
} from "./gen/onnx_pb.js";

export * from "./gen/onnx_pb.js";

/** metadata_props key set to "true" on models written by `models:synth`. */
export const SYNTHETIC_METADATA_KEY = "trellis.synthetic";

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A FLOAT initializer whose raw_data is a view over `data` (ONNX wants little-endian). */
export function floatTensor(name: string, dims: number[], data: Float32Array): TensorProto {
  if (!LITTLE_ENDIAN) throw new Error("writing ONNX raw_data needs a little-endian host");
  return create(TensorProtoSchema, {
    name,
    dims: dims.map(BigInt),
    dataType: TensorProto_DataType.FLOAT,
    rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  });
}

/** A FLOAT tensor value info; string dims are symbolic (dim_param). */
export function floatValueInfo(name: string, dims: (number | string)[]): ValueInfoProto {
  const shape = create(TensorShapeProtoSchema, {
    dim: dims.map((d) =>
      create(TensorShapeProto_DimensionSchema, {
        value: typeof d === "string" ? { case: "dimParam", value: d } : { case: "dimValue", value: BigInt(d) },
      }),
    ),
  });
  const tensorType: TypeProto_Tensor = create(TypeProto_TensorSchema, {
    elemType: TensorProto_DataType.FLOAT,
    shape,
  });
  return create(ValueInfoProtoSchema, {
    name,
    type: create(TypeProtoSchema, { value: { case: "tensorType", value: tensorType } }),
  });
}

export type AttrValue = number | number[] | string;

function attribute(name: string, value: AttrValue, float: boolean): AttributeProto {
  if (typeof value === "string") {
    return create(AttributeProtoSchema, {
      name,
      type: AttributeProto_AttributeType.STRING,
      s: new TextEncoder().encode(value),
    });
  }
  if (Array.isArray(value)) {
    return create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.INTS, ints: value.map(BigInt) });
  }
  return float
    ? create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.FLOAT, f: value })
    : create(AttributeProtoSchema, { name, type: AttributeProto_AttributeType.INT, i: BigInt(value) });
}

/** A node; attributes named in `floats` are FLOAT, other numbers INT, arrays INTS. */
export function node(
  opType: string,
  name: string,
  inputs: string[],
  outputs: string[],
  attrs: Record<string, AttrValue> = {},
  floats: string[] = [],
): NodeProto {
  return create(NodeProtoSchema, {
    opType,
    name,
    input: inputs,
    output: outputs,
    attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v, floats.includes(k))),
  });
}

export interface OnnxFileMetadata {
  docString: string;
  producerName: string;
  metadata: Record<string, string>;
}

/**
 * Reads a model file's doc_string, producer_name and metadata_props without
 * decoding the graph: walks the top-level ModelProto fields and skips the
 * (large) graph by its length. Cheap enough to call on every model load.
 */
export async function readOnnxMetadata(path: string): Promise<OnnxFileMetadata> {
  const fh = await open(path, "r");
  try {
    const { size } = await fh.stat();
    const head = Buffer.alloc(10);
    let pos = 0;
    const varint = async (): Promise<number> => {
      const { bytesRead } = await fh.read(head, 0, 10, pos);
      let result = 0;
      let mul = 1;
      for (let i = 0; i < bytesRead; i++) {
        const b = head[i]!;
        result += (b & 0x7f) * mul;
        mul *= 128;
        if (b < 0x80) {
          pos += i + 1;
          return result;
        }
      }
      throw new Error(`${path}: malformed varint at byte ${pos}`);
    };
    const readBytes = async (len: number): Promise<Buffer> => {
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, pos);
      pos += len;
      return buf;
    };
    const out: OnnxFileMetadata = { docString: "", producerName: "", metadata: {} };
    while (pos < size) {
      const tag = await varint();
      const field = Math.floor(tag / 8);
      const wire = tag & 7;
      if (wire === 0) await varint();
      else if (wire === 1) pos += 8;
      else if (wire === 5) pos += 4;
      else if (wire === 2) {
        const len = await varint();
        if (field === 6 || field === 2) {
          const text = (await readBytes(len)).toString("utf8");
          if (field === 6) out.docString = text;
          else out.producerName = text;
        } else if (field === 14) {
          const { key, value } = decodeEntry(await readBytes(len));
          out.metadata[key] = value;
        } else {
          pos += len;
        }
      } else {
        throw new Error(`${path}: not an ONNX model (wire type ${wire} at byte ${pos})`);
      }
      if (pos > size) throw new Error(`${path}: truncated ONNX model`);
    }
    return out;
  } finally {
    await fh.close();
  }
}

/** Decodes a StringStringEntryProto (key = 1, value = 2). */
function decodeEntry(buf: Buffer): { key: string; value: string } {
  let p = 0;
  const entry = { key: "", value: "" };
  const varint = () => {
    let r = 0;
    let mul = 1;
    for (;;) {
      const b = buf[p++]!;
      r += (b & 0x7f) * mul;
      mul *= 128;
      if (b < 0x80) return r;
    }
  };
  while (p < buf.length) {
    const tag = varint();
    if ((tag & 7) !== 2) throw new Error("malformed metadata_props entry");
    const len = varint();
    const s = buf.subarray(p, p + len).toString("utf8");
    p += len;
    if (tag >> 3 === 1) entry.key = s;
    else if (tag >> 3 === 2) entry.value = s;
  }
  return entry;
}

/** True when the model file carries metadata_props `trellis.synthetic` = "true". */
export async function isSyntheticModel(path: string): Promise<boolean> {
  return (await readOnnxMetadata(path)).metadata[SYNTHETIC_METADATA_KEY] === "true";
}
