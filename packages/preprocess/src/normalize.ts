/**
 * RGB uint8 crop -> (x / 255 - mean) / std in the configured channel order,
 * layout and float width, written straight into the batch's output array.
 */
import { float32ToFloat16Bits } from "@trellis/stage";
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
      if (half)
        for (let p = 0; p < pixels; p++) out[base + p] = float32ToFloat16Bits(t[rgb[p * 3 + sc] as number] as number);
      else for (let p = 0; p < pixels; p++) out[base + p] = t[rgb[p * 3 + sc] as number] as number;
    } else {
      if (half)
        for (let p = 0; p < pixels; p++)
          out[offset + p * 3 + c] = float32ToFloat16Bits(t[rgb[p * 3 + sc] as number] as number);
      else for (let p = 0; p < pixels; p++) out[offset + p * 3 + c] = t[rgb[p * 3 + sc] as number] as number;
    }
  }
}
