import { describe, expect, it } from "vitest";
import {
  float16ArrayToFloat32,
  float16BitsToFloat32,
  float32ArrayToFloat16,
  float32ToFloat16Bits,
} from "../src/backend.js";

const isNaNBits = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;

describe("FP32 <-> FP16", () => {
  it("converts landmark values exactly", () => {
    const cases: [number, number][] = [
      [0, 0x0000],
      [-0, 0x8000],
      [1, 0x3c00],
      [-2, 0xc000],
      [0.5, 0x3800],
      [65504, 0x7bff], // largest finite half
      [65519.99, 0x7bff], // just below the midpoint to infinity
      [65520, 0x7c00], // the midpoint: ties to even = infinity
      [2 ** -14, 0x0400], // smallest normal
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // half of it: tie to even = 0
      [1.5 * 2 ** -25, 0x0001], // above the tie
      [3 * 2 ** -25, 0x0002], // 1.5 * smallest subnormal: tie between 1 and 2, even = 2
      [1023 * 2 ** -24, 0x03ff], // largest subnormal
      [1 + 2 ** -11, 0x3c00], // tie between 1 and 1+2^-10: even = 1
      [1 + 3 * 2 ** -11, 0x3c02], // tie between 0x3c01 and 0x3c02: even = 0x3c02
      [1 + 2 ** -11 + 2 ** -20, 0x3c01], // just above the tie
      [Number.POSITIVE_INFINITY, 0x7c00],
      [Number.NEGATIVE_INFINITY, 0xfc00],
      [1e-10, 0x0000],
      [-1e-10, 0x8000],
      [1e10, 0x7c00],
    ];
    for (const [x, h] of cases) {
      expect(float32ToFloat16Bits(x), `${x}`).toBe(h);
    }
    expect(isNaNBits(float32ToFloat16Bits(Number.NaN))).toBe(true);
    expect(float16BitsToFloat32(0x7bff)).toBe(65504);
    expect(float16BitsToFloat32(0x0001)).toBe(2 ** -24);
    expect(float16BitsToFloat32(0xfc00)).toBe(Number.NEGATIVE_INFINITY);
    expect(Object.is(float16BitsToFloat32(0x8000), -0)).toBe(true);
    expect(float16BitsToFloat32(0x7e00)).toBeNaN();
  });

  it("round-trips every FP16 bit pattern", () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const back = float32ArrayToFloat16(float16ArrayToFloat32(all));
    for (let h = 0; h < 65536; h++) {
      if (isNaNBits(h)) expect(isNaNBits(back[h] as number)).toBe(true);
      else if (back[h] !== h) expect.fail(`0x${h.toString(16)} came back as 0x${(back[h] as number).toString(16)}`);
    }
  });

  it("picks the nearest FP16 (ties to even) for random FP32 bit patterns", () => {
    // Independent check: compare against both neighbours in FP64 arithmetic.
    let seed = 12345;
    const next = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed;
    };
    const bits = new Uint32Array(100_000).map(() => next() ^ (next() << 16));
    // Bias half the samples into FP16's range, where rounding actually matters.
    for (let i = 0; i < bits.length; i += 2)
      bits[i] = ((bits[i] as number) & 0x83ffffff) | 0x30000000 | (next() & 0x0c000000);
    const xs = new Float32Array(bits.buffer);
    const hs = float32ArrayToFloat16(xs);
    for (let i = 0; i < xs.length; i++) {
      const x = xs[i] as number;
      const h = hs[i] as number;
      if (Number.isNaN(x)) {
        expect(isNaNBits(h)).toBe(true);
        continue;
      }
      const v = float16BitsToFloat32(h);
      const mag = Math.abs(x);
      if (mag >= 65520) {
        expect(v).toBe(Math.sign(x) * Number.POSITIVE_INFINITY);
        continue;
      }
      expect(Math.sign(v) === Math.sign(x) || v === 0).toBe(true);
      const hm = h & 0x7fff;
      const err = Math.abs(mag - Math.abs(v));
      const up = hm < 0x7bff ? Math.abs(float16BitsToFloat32(hm + 1) - mag) : Number.POSITIVE_INFINITY;
      const down = hm > 0 ? Math.abs(float16BitsToFloat32(hm - 1) - mag) : Number.POSITIVE_INFINITY;
      if (err > up || err > down || ((err === up || err === down) && hm & 1)) {
        expect.fail(`${x}: got 0x${h.toString(16)} (${v})`);
      }
    }
  });
});

describe("float32ArrayToFloat16 (the fast loop)", () => {
  it("gives float32ToFloat16Bits' bits for every exponent, sign, NaN payload and rounding case", () => {
    let seed = 777;
    const next = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed;
    };
    // Every exponent with random mantissas, plus the boundaries of each branch.
    const bits: number[] = [];
    for (let e = 0; e < 256; e++) {
      for (let k = 0; k < 2000; k++)
        bits.push(((next() & 1) << 31) | (e << 23) | ((next() ^ (next() << 9)) & 0x7fffff));
    }
    for (const b of [
      0, 0x38800000, 0x387fffff, 0x47800000, 0x477fffff, 0x477fe000, 0x477ff000, 0x7f800000, 0x7f800001, 0x7fc00000,
      0x7fffffff,
    ]) {
      bits.push(b, (b | 0x80000000) >>> 0);
    }
    const xs = new Float32Array(Uint32Array.from(bits, (b) => b >>> 0).buffer);
    const fast = float32ArrayToFloat16(xs);
    for (let i = 0; i < xs.length; i++) {
      const want = float32ToFloat16Bits(xs[i] as number);
      if (fast[i] !== want) {
        expect.fail(
          `0x${((bits[i] as number) >>> 0).toString(16)}: 0x${(fast[i] as number).toString(16)}, want 0x${want.toString(16)}`,
        );
      }
    }
  });
});
