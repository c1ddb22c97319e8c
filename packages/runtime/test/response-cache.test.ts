import type { InferRequest, InferResponse } from "@trellis/stage";
import { bytesTensor, tensor } from "@trellis/stage";
import { describe, expect, it } from "vitest";
import { ResponseCache, responseCacheKey } from "../src/response-cache.js";

const request = (values: number[], extra: Partial<InferRequest> = {}): InferRequest => ({
  inputs: [tensor("x", "FP32", [1, values.length], Float32Array.from(values))],
  ...extra,
});
const response = (values: number[]): InferResponse => ({
  modelName: "m",
  modelVersion: "1",
  outputs: [
    tensor("y", "FP32", [1, values.length], Float32Array.from(values)),
    bytesTensor("label", [1], [new TextEncoder().encode("cat")]),
  ],
});

describe("responseCacheKey", () => {
  it("is the same for the same model load and inputs, whatever the id or the inputs' order", () => {
    const a = {
      inputs: [tensor("a", "INT32", [2], Int32Array.from([1, 2])), tensor("b", "FP32", [1], Float32Array.from([3]))],
    };
    const b = { id: "other", inputs: [a.inputs[1], a.inputs[0]] } as InferRequest;
    expect(responseCacheKey("m 1 #1", b)).toBe(responseCacheKey("m 1 #1", a as InferRequest));
  });

  it("differs when anything that shapes the answer differs", () => {
    const base = responseCacheKey("m 1 #1", request([1, 2]));
    const variants = [
      responseCacheKey("m 1 #2", request([1, 2])), // another load of the model
      responseCacheKey("m 1 #1", request([1, 3])), // data
      responseCacheKey("m 1 #1", { inputs: [tensor("x", "FP32", [2, 1], Float32Array.from([1, 2]))] }), // shape
      responseCacheKey("m 1 #1", { inputs: [tensor("x", "INT32", [1, 2], Int32Array.from([1065353216, 1073741824]))] }), // datatype, same bytes
      responseCacheKey("m 1 #1", request([1, 2], { outputs: [{ name: "y", parameters: { classification: 2 } }] })),
      responseCacheKey("m 1 #1", request([1, 2], { parameters: { threshold: 0.5 } })),
    ];
    for (const v of variants) expect(v).not.toBe(base);
    expect(new Set(variants).size).toBe(variants.length);
  });

  it("tells a parameter's type apart: int64 5, double 5, string '5' and string '5n' are four keys", () => {
    const keyWith = (value: string | number | bigint | boolean) =>
      responseCacheKey("m 1 #1", request([1, 2], { parameters: { k: value } }));
    const keys = [keyWith(5n), keyWith(5), keyWith("5"), keyWith("5n"), keyWith(true), keyWith("true")];
    expect(new Set(keys).size).toBe(keys.length);
    const outputKey = (value: string | bigint) =>
      responseCacheKey("m 1 #1", request([1, 2], { outputs: [{ name: "y", parameters: { classification: value } }] }));
    expect(outputKey(2n)).not.toBe(outputKey("2n"));
    // Still one key for one request, however its parameters were built.
    expect(keyWith(5n)).toBe(keyWith(BigInt(5)));
  });
});

describe("ResponseCache", () => {
  it("answers a stored response with fresh copies of its tensors and the request's id", () => {
    const cache = new ResponseCache(1 << 20);
    const stored = response([1, 2, 3]);
    cache.insert("k", stored);
    (stored.outputs[0]?.data as Float32Array)[0] = 99; // the caller's arrays are not the cache's
    const hit = cache.lookup("k", { id: "req-7", inputs: [] });
    expect(hit?.id).toBe("req-7");
    expect([hit?.modelName, hit?.modelVersion]).toEqual(["m", "1"]);
    expect(Array.from(hit?.outputs[0]?.data as Float32Array)).toEqual([1, 2, 3]);
    const [label] = (hit?.outputs[1]?.data ?? []) as Uint8Array[];
    expect(new TextDecoder().decode(label)).toBe("cat");
    (hit?.outputs[0]?.data as Float32Array)[1] = 99;
    expect(Array.from(cache.lookup("k", { inputs: [] })?.outputs[0]?.data as Float32Array)).toEqual([1, 2, 3]);
    expect(cache.lookup("missing", { inputs: [] })).toBeUndefined();
  });

  it("evicts the least recently used entries to stay within its size, and skips one larger than the whole cache", () => {
    const one = 256 + 1 + 4000 + 7; // overhead + key + 1000 floats + "cat" framed
    const cache = new ResponseCache(3 * one);
    const big = (n: number) => response(Array.from({ length: 1000 }, () => n));
    cache.insert("a", big(1));
    cache.insert("b", big(2));
    cache.insert("c", big(3));
    expect(cache.stats()).toMatchObject({ entries: 3, bytes: 3 * one, evictions: 0 });
    cache.lookup("a", { inputs: [] }); // a is now the most recently used
    cache.insert("d", big(4));
    expect(cache.lookup("b", { inputs: [] })).toBeUndefined();
    expect(cache.lookup("a", { inputs: [] })).toBeDefined();
    expect(cache.stats()).toMatchObject({ entries: 3, evictions: 1 });
    cache.insert("huge", response(Array.from({ length: 10_000 }, () => 0)));
    expect(cache.lookup("huge", { inputs: [] })).toBeUndefined();
    expect(cache.stats().entries).toBe(3);
  });
});
