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
 * Resizes the window described by `xs`/`ys` out of `src` (`srcWidth` pixels
 * per row, `channels` interleaved, rows starting at source row `rowOffset`
 * and column `colOffset` — the decoded region may be a sub-rectangle) into a
 * new `ys.length` x `xs.length` x `channels` uint8 buffer.
 */
export function resizeWindow(
  src: Uint8Array,
  srcWidth: number,
  channels: number,
  xs: AxisTable,
  ys: AxisTable,
  colOffset = 0,
  rowOffset = 0,
): Uint8Array {
  const outW = xs.src0.length;
  const outH = ys.src0.length;
  const rowLen = outW * channels;
  const out = new Uint8Array(outH * rowLen);
  // Per output column: byte offsets of its two source pixels within a row, and weights.
  const offA = new Int32Array(outW);
  const offB = new Int32Array(outW);
  for (let x = 0; x < outW; x++) {
    offA[x] = ((xs.src0[x] as number) - colOffset) * channels;
    offB[x] = ((xs.src1[x] as number) - colOffset) * channels;
  }
  const { w0, w1 } = xs;
  // Horizontal pass per source row, computed once: consecutive output rows share source rows.
  const firstRow = ys.src0[0] ?? 0;
  const rows: (Int32Array | undefined)[] = [];
  const hrow = (sy: number): Int32Array => {
    const cached = rows[sy - firstRow];
    if (cached) return cached;
    const row = new Int32Array(rowLen);
    const base = (sy - rowOffset) * srcWidth * channels;
    for (let x = 0, o = 0; x < outW; x++) {
      const a = base + (offA[x] as number);
      const b = base + (offB[x] as number);
      const wa = w0[x] as number;
      const wb = w1[x] as number;
      for (let c = 0; c < channels; c++, o++) row[o] = (src[a + c] as number) * wa + (src[b + c] as number) * wb;
    }
    rows[sy - firstRow] = row;
    return row;
  };
  for (let y = 0; y < outH; y++) {
    const r0 = hrow(ys.src0[y] as number);
    const r1 = hrow(ys.src1[y] as number);
    const b0 = ys.w0[y] as number;
    const b1 = ys.w1[y] as number;
    const o = y * rowLen;
    for (let i = 0; i < rowLen; i++) {
      // SSE2's pmulhw: signed high 16 bits of the 16x16-bit products, then a rounding shift by 2.
      // Weights are non-negative and sum to 2048, so the result is already within 0..255.
      out[o + i] = (((((r0[i] as number) >> 4) * b0) >> 16) + ((((r1[i] as number) >> 4) * b1) >> 16) + 2) >> 2;
    }
  }
  return out;
}
