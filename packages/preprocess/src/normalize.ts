/**
 * RGB uint8 crop -> (x / 255 - mean) / std in the configured channel order,
 * layout and float width, written straight into the batch's output array.
 */
import type { ChannelOrder, Layout } from "./options.js";

export interface NormalizeSettings {
  mean: readonly [number, number, number];
  std: readonly [number, number, number];
  channelOrder: ChannelOrder;
  layout: Layout;
}

/** A 256-entry lookup per output channel: every uint8 maps to one float. */
export function lookupTables(s: NormalizeSettings): Float32Array[] {
  const colours = s.channelOrder === "RGB" ? [0, 1, 2] : [2, 1, 0];
  return colours.map((c) => {
    const t = new Float32Array(256);
    const mean = Math.fround(s.mean[c] as number);
    const std = Math.fround(s.std[c] as number);
    // The seed's NumPy arithmetic, all in float32: x / 255, minus mean, over std (bit-equal to its tensors).
    for (let v = 0; v < 256; v++) t[v] = Math.fround(Math.fround(Math.fround(v / 255) - mean) / std);
    return t;
  });
}

/** Writes one crop (pixels x 3, RGB interleaved) at element offset `offset` of `out`. */
export function writeNormalized(
  rgb: Uint8Array,
  pixels: number,
  tables: Float32Array[],
  layout: Layout,
  channelOrder: ChannelOrder,
  out: Float32Array | Uint16Array,
  offset: number,
): void {
  const half = out instanceof Uint16Array;
  const src = channelOrder === "RGB" ? [0, 1, 2] : [2, 1, 0];
  for (let c = 0; c < 3; c++) {
    const t = tables[c] as Float32Array;
    const sc = src[c] as number;
    if (layout === "NCHW") {
      const base = offset + c * pixels;
      if (half) for (let p = 0; p < pixels; p++) out[base + p] = toHalf(t[rgb[p * 3 + sc] as number] as number);
      else for (let p = 0; p < pixels; p++) out[base + p] = t[rgb[p * 3 + sc] as number] as number;
    } else {
      if (half)
        for (let p = 0; p < pixels; p++) out[offset + p * 3 + c] = toHalf(t[rgb[p * 3 + sc] as number] as number);
      else for (let p = 0; p < pixels; p++) out[offset + p * 3 + c] = t[rgb[p * 3 + sc] as number] as number;
    }
  }
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** IEEE 754 binary16 bits of a float, rounding to nearest even (as numpy's astype(float16)). */
export function toHalf(value: number): number {
  f32[0] = value;
  const x = u32[0] as number;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let h = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rem > halfway || (rem === halfway && h & 1)) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++;
  return sign | h;
}

/** A binary16 bit pattern as a number (for tests and clients). */
export function fromHalf(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}
