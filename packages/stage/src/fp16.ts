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

// 0.5 (2^-1): added to a value below 2^-14, it leaves that value's FP16 subnormal mantissa in
// the low bits of its own, rounded to nearest even by the FPU.
const SUBNORMAL_MAGIC_BITS = (127 - 15 + (23 - 10) + 1) << 23;
u32[0] = SUBNORMAL_MAGIC_BITS;
const SUBNORMAL_MAGIC = f32[0] as number;

/**
 * FP32 array -> FP16 bit patterns, the same as float32ToFloat16Bits element by element, about
 * three times faster (a batch of images goes through here on its way to an FP16 engine): no
 * call per element, and the normal range rounds with one add (F. Giesen's float_to_half_fast3_rtne).
 */
export function float32ArrayToFloat16(src: Float32Array): Uint16Array {
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  const out = new Uint16Array(src.length);
  for (let i = 0; i < bits.length; i++) {
    const b = bits[i] as number;
    const sign = (b >>> 16) & 0x8000;
    const u = b & 0x7fffffff;
    let h: number;
    if (u >= 0x47800000) {
      // 65536 and up, infinity: infinity. NaN: a quiet NaN keeping what payload bits fit.
      h = u > 0x7f800000 ? 0x7e00 | ((u & 0x7fffff) >>> 13) : 0x7c00;
    } else if (u < 0x38800000) {
      // Below the smallest normal half (2^-14): the FPU's own rounding picks the subnormal.
      u32[0] = u;
      f32[0] = (f32[0] as number) + SUBNORMAL_MAGIC;
      h = (u32[0] as number) - SUBNORMAL_MAGIC_BITS;
    } else {
      // Rebias the exponent and round the 13 dropped bits to nearest, ties to even; a carry
      // into the exponent (up to infinity) is right. >>> wraps the sum to 32 bits.
      h = (u + 0xc8000fff + ((u >>> 13) & 1)) >>> 13;
    }
    out[i] = sign | h;
  }
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
