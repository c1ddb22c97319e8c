/**
 * RGB uint8 crop rows -> (x / 255 - mean) / std in the configured channel order,
 * layout and float width, written straight into the batch's output array as the
 * resize produces them (no intermediate crop image).
 */
import { float32ToFloat16Bits } from "@trellis/stage/backend";
import type { ChannelOrder, Layout } from "./options.js";
import type { RowSink } from "./resize.js";

export interface NormalizeSettings {
  mean: readonly [number, number, number];
  std: readonly [number, number, number];
  channelOrder: ChannelOrder;
  layout: Layout;
}

/** Per output channel, every uint8 value's normalised float (and its FP16 bits). */
export interface NormalizeTables {
  f32: Float32Array[];
  f16: Uint16Array[];
  /** The float32 mean and std the tables use, listed R, G, B. */
  mean: [number, number, number];
  std: [number, number, number];
}

/** A 256-entry lookup per output channel: every uint8 maps to one float. */
export function lookupTables(s: NormalizeSettings): NormalizeTables {
  const colours = s.channelOrder === "RGB" ? [0, 1, 2] : [2, 1, 0];
  const f32 = colours.map((c) => {
    const t = new Float32Array(256);
    const mean = Math.fround(s.mean[c] as number);
    const std = Math.fround(s.std[c] as number);
    // The seed's NumPy arithmetic, all in float32: x / 255, minus mean, over std (bit-equal to its tensors).
    for (let v = 0; v < 256; v++) t[v] = Math.fround(Math.fround(Math.fround(v / 255) - mean) / std);
    return t;
  });
  const f16 = f32.map((t) => Uint16Array.from(t, (v) => float32ToFloat16Bits(v)));
  const mean = s.mean.map((m) => Math.fround(m)) as [number, number, number];
  const std = s.std.map((d) => Math.fround(d)) as [number, number, number];
  return { f32, f16, mean, std };
}

/**
 * A RowSink writing one image's crop (rows of `width` RGB pixels, `height` rows) at
 * element `offset` of `out`, normalised, in the configured channel order and layout.
 */
export function rowWriter(
  tables: NormalizeTables,
  layout: Layout,
  channelOrder: ChannelOrder,
  width: number,
  height: number,
  out: Float32Array | Uint16Array,
  offset: number,
): RowSink {
  // Output channel c reads source channel src[c] through table c.
  const [s0, s1, s2] = channelOrder === "RGB" ? [0, 1, 2] : [2, 1, 0];
  const t = out instanceof Uint16Array ? tables.f16 : tables.f32;
  const channels = [t[0]!, t[1]!, t[2]!, s0!, s1!, s2!] as const;
  // NHWC: a pixel's three channels are adjacent; NCHW: each channel is its own plane.
  if (layout === "NHWC") return stridedWriter(out, offset, width, width * 3, 3, 1, ...channels);
  const sink: RowSink = stridedWriter(out, offset, width, width, 1, width * height, ...channels);
  if (out instanceof Float32Array) {
    // Colour k lands in output channel s_k (the order is its own inverse).
    sink.planar = {
      out,
      offset,
      plane: width * height,
      width,
      channelOf: [s0!, s1!, s2!],
      mean: tables.mean,
      std: tables.std,
    };
  }
  return sink;
}

type Table = Float32Array | Uint16Array;

/**
 * Writes row y's `width` pixels at offset + y * rowStride + x * pixelStride,
 * channel c a further c * channelStride along: one loop for both layouts.
 */
function stridedWriter(
  out: Table,
  offset: number,
  width: number,
  rowStride: number,
  pixelStride: number,
  channelStride: number,
  t0: Table,
  t1: Table,
  t2: Table,
  s0: number,
  s1: number,
  s2: number,
): RowSink {
  return (y, data, start) => {
    let o = offset + y * rowStride;
    for (let x = 0, i = start; x < width; x++, i += 3, o += pixelStride) {
      out[o] = t0[data[i + s0] as number] as number;
      out[o + channelStride] = t1[data[i + s1] as number] as number;
      out[o + 2 * channelStride] = t2[data[i + s2] as number] as number;
    }
  };
}
