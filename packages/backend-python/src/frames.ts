/**
 * The stub's wire format: [u32 header length][u32 body length][header JSON][body], little-endian.
 * The header is small metadata; tensor bytes travel raw in the body (BYTES elements framed as
 * Triton frames them: a u32 length before each).
 */
import type { DataType, Tensor } from "@trellis/stage";
import { framedElements, frameElements, viewAs } from "@trellis/stage/backend";

/**
 * Bytes copied to read stub answers, all readers and tensors together (tests check it stays
 * linear), and of them the bodies read from stubs' answer files (stub-process.ts).
 */
export const frameCopyStats = { bytesCopied: 0, fromAnswerFiles: 0 };

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
  /** The frame was over the bound: its body (this many bytes with its prefix and header) was dropped. */
  droppedBytes?: number;
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
  // A view of the frame (already a copy of its own, or a pipe chunk no one else holds): copying
  // it again cost as much as the pipe itself, since fresh memory's first touch is what is slow.
  // viewAs copies only when the offset does not suit the element size.
  const data = viewAs(meta.datatype, raw);
  if (data.buffer !== raw.buffer) frameCopyStats.bytesCopied += raw.byteLength;
  return { name: meta.name, datatype: meta.datatype, shape: meta.shape, data } as Tensor;
}

/** Bodies from this size on are copied into their buffer chunk by chunk as they arrive. */
const FILL_AS_IT_ARRIVES = 1 << 20;

/** Largest header an over-bound frame may have to be read and named; past it the frame cannot be skipped. */
const MAX_SKIPPED_HEADER_BYTES = 1 << 20;

/**
 * Splits a byte stream into frames, refusing any frame over `maxFrameBytes` from its length
 * prefix, before its body is buffered: its (small) header is read, its body skipped as it
 * arrives, and the frame is handed on with `droppedBytes` set, so the one answer fails and the
 * process keeps running. Chunks are kept in a list and each frame is copied out
 * once when all its bytes are here (a frame inside one chunk is a view of it, no copy): linear in
 * the stream, where concatenating everything buffered on every chunk was quadratic.
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  /** Index of the first chunk still unread, and how far into it. */
  private head = 0;
  private offset = 0;
  private buffered = 0;
  /** The current frame's header and body lengths, once its prefix is read. */
  private lengths: [number, number] | undefined;
  /** Bytes this reader has copied to assemble frames (tests check it stays linear). */
  bytesCopied = 0;
  /** Body bytes of an over-bound frame still to skip as they arrive. */
  private skipping = 0;
  /** The current frame is over the bound: its header is read, its body skipped. */
  private oversize: number | undefined;
  /** A large frame's body being copied into its buffer as its chunks arrive (see startFilling). */
  private filling: { header: Record<string, unknown>; body: Buffer; at: number } | undefined;

  constructor(private readonly maxFrameBytes: number) {}

  push(chunk: Buffer): Frame[] {
    if (this.skipping > 0) {
      const skipped = Math.min(this.skipping, chunk.byteLength);
      this.skipping -= skipped;
      chunk = chunk.subarray(skipped);
    }
    const frames: Frame[] = [];
    if (this.filling) {
      const { header, body } = this.filling;
      const n = Math.min(body.byteLength - this.filling.at, chunk.byteLength);
      chunk.copy(body, this.filling.at, 0, n);
      this.filling.at += n;
      this.counted(n);
      chunk = chunk.subarray(n);
      if (this.filling.at < body.byteLength) return frames;
      frames.push({ header, body });
      this.filling = undefined;
    }
    if (chunk.byteLength === 0) return frames;
    this.chunks.push(chunk);
    this.buffered += chunk.byteLength;
    for (;;) {
      if (this.lengths === undefined) {
        if (this.buffered < 8) break;
        const prefix = this.take(8);
        const headerLength = prefix.readUInt32LE(0);
        const bodyLength = prefix.readUInt32LE(4);
        const total = 8 + headerLength + bodyLength;
        if (total > this.maxFrameBytes) {
          if (headerLength > Math.min(MAX_SKIPPED_HEADER_BYTES, this.maxFrameBytes))
            throw new Error(`its Python process sent a ${total}-byte frame, over the ${this.maxFrameBytes}-byte bound`);
          this.oversize = total;
        }
        this.lengths = [headerLength, bodyLength];
      }
      const [headerLength, bodyLength] = this.lengths;
      if (this.oversize !== undefined) {
        if (this.buffered < headerLength) break;
        const header = JSON.parse(this.take(headerLength).toString()) as Record<string, unknown>;
        // Its body is dropped: what is buffered now, the rest as it arrives.
        const buffered = Math.min(this.buffered, bodyLength);
        this.discard(buffered);
        this.skipping = bodyLength - buffered;
        frames.push({ header, body: EMPTY, droppedBytes: this.oversize });
        this.lengths = undefined;
        this.oversize = undefined;
        if (this.skipping > 0) break;
        continue;
      }
      if (this.buffered < headerLength + bodyLength) {
        if (bodyLength >= FILL_AS_IT_ARRIVES && this.buffered >= headerLength)
          this.startFilling(headerLength, bodyLength);
        break;
      }
      this.lengths = undefined;
      const header = JSON.parse(this.take(headerLength).toString()) as Record<string, unknown>;
      frames.push({ header, body: this.take(bodyLength) });
    }
    if (this.head > 32) {
      // Drop the chunks already read, now and then, so the list stays short.
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
    return frames;
  }

  /**
   * A large frame whose header is here but not all its body: the body gets its buffer now, and
   * each chunk is copied into it as it arrives, while the chunk is fresh in the CPU's cache (copying
   * hundreds of cold 64 KiB chunks at the end ran at a third of the speed), and the chunks go.
   */
  private startFilling(headerLength: number, bodyLength: number): void {
    const header = JSON.parse(this.take(headerLength).toString()) as Record<string, unknown>;
    const body = Buffer.allocUnsafe(bodyLength);
    // Everything buffered now is this body's start: the frame is not complete.
    const at = this.buffered;
    this.copyInto(body, at);
    this.counted(at);
    this.filling = { header, body, at };
    this.lengths = undefined;
  }

  private counted(n: number): void {
    this.bytesCopied += n;
    frameCopyStats.bytesCopied += n;
  }

  /** The next `n` buffered bytes: a view when they lie in one chunk, else one copy. */
  private take(n: number): Buffer {
    const first = this.chunks[this.head] as Buffer | undefined;
    if (first && this.offset + n <= first.byteLength) {
      this.buffered -= n;
      const view = first.subarray(this.offset, this.offset + n);
      this.advance(first, n);
      return view;
    }
    const out = Buffer.allocUnsafe(n);
    this.copyInto(out, n);
    this.counted(n);
    return out;
  }

  /** Moves the next `n` buffered bytes into the start of `out`. */
  private copyInto(out: Buffer, n: number): void {
    this.buffered -= n;
    let at = 0;
    while (at < n) {
      const chunk = this.chunks[this.head] as Buffer;
      const count = Math.min(n - at, chunk.byteLength - this.offset);
      chunk.copy(out, at, this.offset, this.offset + count);
      at += count;
      this.advance(chunk, count);
    }
  }

  /** Drops the next `n` buffered bytes without copying them. */
  private discard(n: number): void {
    this.buffered -= n;
    while (n > 0) {
      const chunk = this.chunks[this.head] as Buffer;
      const count = Math.min(n, chunk.byteLength - this.offset);
      this.advance(chunk, count);
      n -= count;
    }
  }

  private advance(chunk: Buffer, n: number): void {
    this.offset += n;
    if (this.offset === chunk.byteLength) {
      this.chunks[this.head] = EMPTY;
      this.head += 1;
      this.offset = 0;
    }
  }
}

const EMPTY = Buffer.alloc(0);
