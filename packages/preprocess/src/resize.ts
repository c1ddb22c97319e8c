/**
 * OpenCV's `cv::resize(..., INTER_LINEAR)` on 8-bit interleaved images,
 * reproduced in integer arithmetic, but only for the output window that the
 * center crop keeps: the seed resizes the whole image and throws most of it
 * away, we compute just the crop's pixels from the same coefficients.
 *
 * What OpenCV does (imgproc/src/resize.cpp, resizeGeneric with fixed point
 * for CV_8U): source coordinate `(float)((d + 0.5) * scale - 0.5)` with
 * `scale = 1 / (dst / src)` in double, weights `round((1 - f) * 2048)` and
 * `round(f * 2048)` (round half to even), clamped at the borders (no
 * antialiasing); a horizontal pass into int32 (sum of weights is 2048), then
 * the vertical pass as its SIMD kernel computes it:
 * `((hi16((a >> 4) * b0) + hi16((c >> 4) * b1)) + 2) >> 2`.
 */

import { type SimdResizer, simdResizer } from "./resize-simd.js";

const COEF_SCALE = 2048;

/** One axis: for each output index, the two source indices and their weights. */
export interface AxisTable {
  src0: Int32Array;
  src1: Int32Array;
  w0: Int16Array;
  w1: Int16Array;
}

/** Round half to even on a float32 value, as `saturate_cast<short>(float)` (cvRound) does. */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  // Math.round rounds .5 up; cvRound (lrint) rounds ties to even.
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * Coefficients for output indices [start, start + count) of a resize from
 * `srcSize` to `dstSize` along one axis.
 */
export function axisTable(srcSize: number, dstSize: number, start: number, count: number): AxisTable {
  const scale = 1 / (dstSize / srcSize);
  const t: AxisTable = {
    src0: new Int32Array(count),
    src1: new Int32Array(count),
    w0: new Int16Array(count),
    w1: new Int16Array(count),
  };
  for (let i = 0; i < count; i++) {
    const d = start + i;
    let f = Math.fround((d + 0.5) * scale - 0.5);
    let s = Math.floor(f);
    f = Math.fround(f - s);
    if (s < 0) {
      f = 0;
      s = 0;
    }
    if (s >= srcSize - 1) {
      f = 0;
      s = srcSize - 1;
    }
    t.src0[i] = s;
    t.src1[i] = Math.min(s + 1, srcSize - 1);
    t.w0[i] = roundHalfEven(Math.fround(Math.fround(1 - f) * COEF_SCALE));
    t.w1[i] = roundHalfEven(Math.fround(f * COEF_SCALE));
  }
  return t;
}

/** The source rows (or columns) a window's table reads: [start, end). */
export function sourceSpan(t: AxisTable): { start: number; end: number } {
  let start = Number.POSITIVE_INFINITY;
  let end = 0;
  for (let i = 0; i < t.src0.length; i++) {
    start = Math.min(start, t.src0[i] as number);
    end = Math.max(end, (t.src1[i] as number) + 1);
  }
  return { start, end };
}

/**
 * Receives one output row: `data[start .. start + width * channels)`. A sink that
 * only normalises RGB into float32 planes says so in `planar`, and the SIMD path
 * then does that arithmetic itself (bit-identical to the sink's lookup tables).
 */
export type RowSink = ((y: number, data: Uint8Array, start: number) => void) & { planar?: PlanarTarget };

/** Row y of colour k goes to `out[offset + channelOf[k] * plane + y * width ...]`, ((v / 255) - mean[k]) / std[k]. */
export interface PlanarTarget {
  out: Float32Array;
  offset: number;
  plane: number;
  width: number;
  channelOf: readonly [number, number, number];
  /** float32 values, listed R, G, B. */
  mean: readonly [number, number, number];
  std: readonly [number, number, number];
}

// Scratch rows, reused across calls (resizeRows is synchronous, so nothing else can hold them).
let scratch = { len: 0, p: new Int32Array(0), q: new Int32Array(0), out: new Uint8Array(0) };

/**
 * Resizes the window described by `xs`/`ys` out of `src` (`srcWidth` pixels
 * per row, `channels` interleaved, rows starting at source row `rowOffset`
 * and column `colOffset` — the decoded region may be a sub-rectangle) and
 * hands each of the `ys.length` output rows (`xs.length` x `channels` uint8)
 * to `sink` as soon as it is computed; the row's buffer is reused afterwards.
 */
export function resizeRows(
  src: Uint8Array,
  srcWidth: number,
  channels: number,
  xs: AxisTable,
  ys: AxisTable,
  colOffset: number,
  rowOffset: number,
  sink: RowSink,
): void {
  const simd = channels === 3 ? simdResizer() : undefined;
  if (simd && nextPixelPairs(xs)) {
    resizeRowsSimd(simd, src, srcWidth, xs, ys, colOffset, rowOffset, sink);
    return;
  }
  const outW = xs.src0.length;
  const outH = ys.src0.length;
  const rowLen = outW * channels;
  if (scratch.len !== rowLen) {
    scratch = { len: rowLen, p: new Int32Array(rowLen), q: new Int32Array(rowLen), out: new Uint8Array(rowLen) };
  }
  const out = scratch.out;
  // Per output column, packed in one array for locality: byte offsets of its two source
  // pixels within a row, and their weights.
  const cols = new Int32Array(outW * 4);
  for (let x = 0; x < outW; x++) {
    cols[4 * x] = ((xs.src0[x] as number) - colOffset) * channels;
    cols[4 * x + 1] = ((xs.src1[x] as number) - colOffset) * channels;
    cols[4 * x + 2] = xs.w0[x] as number;
    cols[4 * x + 3] = xs.w1[x] as number;
  }
  const horizontal = channels === 3 ? horizontal3 : horizontalN;
  // Horizontal-pass results for two source rows. The table's source rows only move forward,
  // so two slots are enough for each row's pass to run once (OpenCV keeps a ring of rows too).
  let rowP = scratch.p;
  let rowQ = scratch.q;
  let p = -1;
  let q = -1;
  const stride = srcWidth * channels;
  for (let y = 0; y < outH; y++) {
    const s0 = ys.src0[y] as number;
    const s1 = ys.src1[y] as number;
    if (p !== s0) {
      if (q === s0) {
        const t = rowP;
        rowP = rowQ;
        rowQ = t;
        q = p;
      } else horizontal(src, (s0 - rowOffset) * stride, cols, outW, channels, rowP);
      p = s0;
    }
    if (q !== s1) {
      if (s1 === s0) rowQ.set(rowP);
      else horizontal(src, (s1 - rowOffset) * stride, cols, outW, channels, rowQ);
      q = s1;
    }
    verticalRow(rowP, rowQ, ys.w0[y] as number, ys.w1[y] as number, out, rowLen);
    sink(y, out, 0);
  }
}

/** Every column's second source pixel is the next one, or carries no weight (what the SIMD pass assumes). */
function nextPixelPairs(xs: AxisTable): boolean {
  for (let x = 0; x < xs.src0.length; x++) {
    if (xs.src1[x] !== (xs.src0[x] as number) + 1 && xs.w1[x] !== 0) return false;
  }
  return true;
}

/** Sources up to this size are copied into the module memory whole; larger ones a row at a time. */
const BULK_COPY = 4 << 20;
const align16 = (n: number) => (n + 15) & ~15;

/** resizeRows for 3 channels with the WebAssembly SIMD kernels (same arithmetic, same results). */
function resizeRowsSimd(
  k: SimdResizer,
  src: Uint8Array,
  srcWidth: number,
  xs: AxisTable,
  ys: AxisTable,
  colOffset: number,
  rowOffset: number,
  sink: RowSink,
): void {
  const outW = xs.src0.length;
  const outH = ys.src0.length;
  const blocks = Math.ceil((outW * 3) / 16);
  const stride = srcWidth * 3;
  const bulk = src.length <= BULK_COPY;
  // Module memory: column offsets, column weights, two int32 rows, the uint8 output row, the source.
  const offs = 0;
  const weights = align16(offs + outW * 4);
  const rowA = align16(weights + outW * 16);
  const rowB = align16(rowA + blocks * 64 + 16);
  const out = align16(rowB + blocks * 64 + 16);
  const target = sink.planar;
  const pixelBlocks = Math.ceil(outW / 16);
  const planes = align16(out + Math.max(blocks * 16, pixelBlocks * 48) + 16);
  const planeBytes = pixelBlocks * 64;
  const srcAt = align16(planes + (target ? 3 * planeBytes : 0));
  const mem = k.memory(srcAt + (bulk ? src.length : stride) + 16);
  const planeAt: [number, number, number] = [planes, planes + planeBytes, planes + 2 * planeBytes];
  const planeViews = planeAt.map((at) => new Float32Array(mem.buffer, at, outW));
  const colOffs = new Int32Array(mem.buffer, offs, outW);
  const colWeights = new Int16Array(mem.buffer, weights, outW * 8);
  for (let x = 0; x < outW; x++) {
    colOffs[x] = ((xs.src0[x] as number) - colOffset) * 3;
    const w0 = xs.w0[x] as number;
    const w1 = xs.w1[x] as number;
    colWeights.set([w0, w1, w0, w1, w0, w1, 0, 0], x * 8);
  }
  if (bulk) mem.set(src, srcAt);
  const horizontal = (row: number, sy: number) => {
    const start = (sy - rowOffset) * stride;
    if (bulk) k.hpass(srcAt + start, offs, weights, outW, row);
    else {
      mem.set(src.subarray(start, start + stride), srcAt);
      k.hpass(srcAt, offs, weights, outW, row);
    }
  };
  // The same two-slot ring as resizeRows: P holds source row p, Q holds q; rows only move forward.
  let rowP = rowA;
  let rowQ = rowB;
  let p = -1;
  let q = -1;
  for (let y = 0; y < outH; y++) {
    const s0 = ys.src0[y] as number;
    const s1 = ys.src1[y] as number;
    if (p !== s0) {
      if (q === s0) {
        [rowP, rowQ] = [rowQ, rowP];
        q = p;
      } else horizontal(rowP, s0);
      p = s0;
    }
    if (s1 !== s0 && q !== s1) {
      horizontal(rowQ, s1);
      q = s1;
    }
    const r0 = rowP;
    const r1 = s1 === s0 ? rowP : rowQ;
    k.vpass(r0, r1, ys.w0[y] as number, ys.w1[y] as number, blocks, out);
    if (target) {
      k.planar(out, pixelBlocks, planeAt, target.mean, target.std);
      const o = target.offset + y * target.width;
      for (let c = 0; c < 3; c++) {
        target.out.set(planeViews[c] as Float32Array, o + (target.channelOf[c] as number) * target.plane);
      }
    } else sink(y, mem, out);
  }
}

/** resizeRows into a new `ys.length` x `xs.length` x `channels` uint8 buffer. */
export function resizeWindow(
  src: Uint8Array,
  srcWidth: number,
  channels: number,
  xs: AxisTable,
  ys: AxisTable,
  colOffset = 0,
  rowOffset = 0,
): Uint8Array {
  const rowLen = xs.src0.length * channels;
  const out = new Uint8Array(ys.src0.length * rowLen);
  resizeRows(src, srcWidth, channels, xs, ys, colOffset, rowOffset, (y, row, start) =>
    out.set(row.subarray(start, start + rowLen), y * rowLen),
  );
  return out;
}

/** The horizontal pass over one source row starting at byte `base`, for 3 channels (unrolled). */
function horizontal3(
  src: Uint8Array,
  base: number,
  cols: Int32Array,
  outW: number,
  _channels: number,
  row: Int32Array,
): void {
  for (let x = 0, o = 0, t = 0; x < outW; x++, o += 3, t += 4) {
    const a = base + (cols[t] as number);
    const b = base + (cols[t + 1] as number);
    const wa = cols[t + 2] as number;
    const wb = cols[t + 3] as number;
    row[o] = (src[a] as number) * wa + (src[b] as number) * wb;
    row[o + 1] = (src[a + 1] as number) * wa + (src[b + 1] as number) * wb;
    row[o + 2] = (src[a + 2] as number) * wa + (src[b + 2] as number) * wb;
  }
}

function horizontalN(
  src: Uint8Array,
  base: number,
  cols: Int32Array,
  outW: number,
  channels: number,
  row: Int32Array,
): void {
  for (let x = 0, o = 0, t = 0; x < outW; x++, t += 4) {
    const a = base + (cols[t] as number);
    const b = base + (cols[t + 1] as number);
    const wa = cols[t + 2] as number;
    const wb = cols[t + 3] as number;
    for (let c = 0; c < channels; c++, o++) row[o] = (src[a + c] as number) * wa + (src[b + c] as number) * wb;
  }
}

/** The vertical pass for one output row, as OpenCV's SSE2 kernel computes it. */
function verticalRow(r0: Int32Array, r1: Int32Array, b0: number, b1: number, out: Uint8Array, rowLen: number): void {
  for (let i = 0; i < rowLen; i++) {
    // pmulhw: signed high 16 bits of the 16x16-bit products, then a rounding shift by 2.
    // Weights are non-negative and sum to 2048, so the result is already within 0..255.
    out[i] = (((((r0[i] as number) >> 4) * b0) >> 16) + ((((r1[i] as number) >> 4) * b1) >> 16) + 2) >> 2;
  }
}
