/**
 * IEEE 754 binary16 <-> binary32, for FP16 tensors (FP16 engines behind an
 * FP32 ensemble, FP16 preprocessing output). FP32 -> FP16 rounds to nearest, ties to even (as CUDA's
 * __float2half_rn and NumPy do); subnormals, infinities and NaNs are kept.
 */

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The binary16 bit pattern nearest to `x` (ties to even). */
export function float32ToFloat16Bits(x: number): number {
  f32[0] = x;
  return bitsToHalf(u32[0] as number);
}

function bitsToHalf(b: number): number {
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  const mant = b & 0x7fffff;
  if (exp === 0xff) {
    // Keep NaN a (quiet) NaN whatever payload bits survive the narrowing.
    return mant ? sign | 0x7e00 | (mant >>> 13) : sign | 0x7c00;
  }
  const e = exp - 112; // rebias 127 -> 15
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Half subnormal: value = m * 2^-24 with m = full >> (14 - e).
    if (e < -10) return sign; // below half the smallest subnormal: rounds to zero
    const full = mant | 0x800000;
    const shift = 14 - e;
    let m = full >>> shift;
    const rem = full & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && m & 1)) m++; // may carry into the smallest normal, which is right
    return sign | m;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++; // a carry into the exponent may reach infinity, as it should
  return sign | h;
}

/** The float value of a binary16 bit pattern. */
export function float16BitsToFloat32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 0x1f) return m ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

let table: Float32Array | undefined;

/** FP32 array -> FP16 bit patterns. */
export function float32ArrayToFloat16(src: Float32Array): Uint16Array {
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  const out = new Uint16Array(src.length);
  for (let i = 0; i < bits.length; i++) out[i] = bitsToHalf(bits[i] as number);
  return out;
}

/** FP16 bit patterns -> FP32 array (through a 65,536-entry table: 256 KiB, built once). */
export function float16ArrayToFloat32(src: Uint16Array): Float32Array {
  if (!table) {
    table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) table[h] = float16BitsToFloat32(h);
  }
  const t = table;
  const out = new Float32Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = t[src[i] as number] as number;
  return out;
}
