import { describe, expect, it } from "vitest";
import { cFixed6, pyFloatRepr, pyJsonString } from "../src/format.js";
import { pairwiseSumF32, softmaxRowF32, topK } from "../src/softmax.js";

describe("pyFloatRepr", () => {
  // Expected strings are CPython's repr() of the same doubles.
  it.each([
    [0.0001, "0.0001"],
    [0.00001, "1e-05"],
    [0.000123, "0.000123"],
    [0.0000123, "1.23e-05"],
    [1, "1.0"],
    [0.5, "0.5"],
    [123.456, "123.456"],
    [1e15, "1000000000000000.0"],
    [1e16, "1e+16"],
    [1.5e300, "1.5e+300"],
    [2.5e-7, "2.5e-07"],
    [-0.25, "-0.25"],
    [0, "0.0"],
    [-0, "-0.0"],
    [Math.fround(0.1), "0.10000000149011612"],
    [Math.fround(0.6892078518867493), "0.6892078518867493"],
    [Math.fround(3.2e-8), "3.199999909497819e-08"],
  ])("%s -> %s", (x, want) => {
    expect(pyFloatRepr(x)).toBe(want);
  });
});

describe("pyJsonString", () => {
  it("escapes like json.dumps with ensure_ascii", () => {
    expect(pyJsonString('a"b\\c')).toBe('"a\\"b\\\\c"');
    expect(pyJsonString("tab\there\nnl\r\b\f")).toBe('"tab\\there\\nnl\\r\\b\\f"');
    expect(pyJsonString("\u0001\u007f")).toBe('"\\u0001\\u007f"');
    expect(pyJsonString("café")).toBe('"caf\\u00e9"');
    expect(pyJsonString("😀")).toBe('"\\ud83d\\ude00"');
    expect(pyJsonString("Egyptian cat")).toBe('"Egyptian cat"');
  });
});

describe("cFixed6", () => {
  it("formats like printf %f", () => {
    expect(cFixed6(Math.fround(0.6892078518867493))).toBe("0.689208");
    expect(cFixed6(1)).toBe("1.000000");
    expect(cFixed6(2.5e-9)).toBe("0.000000");
    expect(cFixed6(-2.5e-9)).toBe("-0.000000");
    expect(cFixed6(-12.3456789)).toBe("-12.345679");
  });
});

describe("softmax and top-k", () => {
  it("is stable for large logits and sums to 1", () => {
    const logits = new Float32Array([1000, 1001, 999, -1000, 88.7, 1001]);
    const p = new Float32Array(6);
    expect(softmaxRowF32(logits, 0, 6, p)).toBe(-1);
    for (const v of p) expect(Number.isFinite(v)).toBe(true);
    expect(p.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 6);
    expect(p[1]).toBe(p[5]);
    expect(p[1]! / p[0]!).toBeCloseTo(Math.E, 5);
  });

  it("reports the first non-finite logit", () => {
    const p = new Float32Array(3);
    expect(softmaxRowF32(new Float32Array([0, 1, 2, 0, Number.NaN, Number.POSITIVE_INFINITY]), 1, 3, p)).toBe(1);
    expect(softmaxRowF32(new Float32Array([Number.NEGATIVE_INFINITY, 0, 0]), 0, 3, p)).toBe(0);
  });

  it("orders top-k descending with ties by lower index", () => {
    const v = new Float32Array([0.1, 0.5, 0.2, 0.5, 0.05, 0.2, 0.9]);
    expect(topK(v, 5)).toEqual([6, 1, 3, 2, 5]);
    expect(topK(v, 1)).toEqual([6]);
    expect(topK(v, 7)).toEqual([6, 1, 3, 2, 5, 0, 4]);
  });

  it("pairwise sum rounds every partial sum to float32", () => {
    // 2^24 + 1 + 1 ... : a float32 accumulator loses each +1 on its own.
    const a = new Float32Array(300).fill(1);
    a[0] = 2 ** 24;
    const naive = Array.from(a).reduce((x, y) => x + y, 0);
    const sum = pairwiseSumF32(a, 0, a.length);
    expect(sum).toBe(Math.fround(sum));
    expect(naive).toBe(2 ** 24 + 299);
    expect(sum).toBeLessThan(naive);
    expect(pairwiseSumF32(new Float32Array([1, 2, 3]), 0, 3)).toBe(6);
  });
});
