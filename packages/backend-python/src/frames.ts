/**
 * The stub's wire format: [u32 header length][u32 body length][header JSON][body], little-endian.
 * The header is small metadata; tensor bytes travel raw in the body (BYTES elements framed as
 * Triton frames them: a u32 length before each).
 */
import type { DataType, Tensor } from "@trellis/stage";
import { framedElements, frameElements, viewAs } from "@trellis/stage/backend";

export interface TensorMeta {
  name: string;
  datatype: DataType;
  shape: number[];
  offset: number;
  length: number;
}

export interface Frame {
  header: Record<string, unknown>;
  body: Uint8Array;
}

export function encodeFrame(header: object, parts: readonly Uint8Array[] = []): Buffer {
  const json = Buffer.from(JSON.stringify(header));
  const bodyLength = parts.reduce((n, p) => n + p.byteLength, 0);
  const prefix = Buffer.alloc(8);
  prefix.writeUInt32LE(json.byteLength, 0);
  prefix.writeUInt32LE(bodyLength, 4);
  return Buffer.concat([prefix, json, ...parts]);
}

/** Adds each tensor's bytes to `parts` and gives its metadata, offsets counted from `offset`. */
export function encodeTensors(tensors: readonly Tensor[], parts: Uint8Array[], offset = 0): TensorMeta[] {
  const metas: TensorMeta[] = [];
  let at = offset;
  for (const t of tensors) {
    const bytes =
      t.datatype === "BYTES"
        ? frameElements(t.data as Uint8Array[])
        : new Uint8Array(
            (t.data as ArrayBufferView).buffer,
            (t.data as ArrayBufferView).byteOffset,
            (t.data as ArrayBufferView).byteLength,
          );
    parts.push(bytes);
    metas.push({ name: t.name, datatype: t.datatype, shape: [...t.shape], offset: at, length: bytes.byteLength });
    at += bytes.byteLength;
  }
  return metas;
}

export function decodeTensor(meta: TensorMeta, body: Uint8Array): Tensor {
  const raw = body.subarray(meta.offset, meta.offset + meta.length);
  const count = meta.shape.reduce((n, d) => n * d, 1);
  if (meta.datatype === "BYTES") {
    return { name: meta.name, datatype: "BYTES", shape: meta.shape, data: framedElements(raw, count) };
  }
  // A copy, aligned for its typed array, owned by the tensor.
  const copy = new Uint8Array(raw.byteLength);
  copy.set(raw);
  return { name: meta.name, datatype: meta.datatype, shape: meta.shape, data: viewAs(meta.datatype, copy) } as Tensor;
}

/** Splits a byte stream into frames, refusing any frame over `maxFrameBytes`. */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;

  constructor(private readonly maxFrameBytes: number) {}

  push(chunk: Buffer): Frame[] {
    this.chunks.push(chunk);
    this.buffered += chunk.byteLength;
    const frames: Frame[] = [];
    for (;;) {
      if (this.buffered < 8) return frames;
      const all = this.chunks.length === 1 ? (this.chunks[0] as Buffer) : Buffer.concat(this.chunks);
      this.chunks = [all];
      const headerLength = all.readUInt32LE(0);
      const bodyLength = all.readUInt32LE(4);
      const total = 8 + headerLength + bodyLength;
      if (total > this.maxFrameBytes)
        throw new Error(`the stub sent a ${total}-byte frame, over the ${this.maxFrameBytes}-byte bound`);
      if (this.buffered < total) return frames;
      const header = JSON.parse(all.subarray(8, 8 + headerLength).toString()) as Record<string, unknown>;
      const body = all.subarray(8 + headerLength, total);
      frames.push({ header, body });
      const rest = all.subarray(total);
      this.chunks = rest.byteLength ? [rest] : [];
      this.buffered = rest.byteLength;
    }
  }
}
