/**
 * The WebAssembly SIMD resize and the JS loops it replaces agree bit for bit (the README's
 * "Fidelity to the seed"). resize-simd.ts picks the JS loops where WebAssembly is missing, and
 * caches that choice per module instance, so this file loads the package twice: once with the
 * WebAssembly global hidden (every resize and normalisation on the JS path), once as it is (SIMD).
 */
import { fixturePhotos, readFixtureImage, readReferenceTensor } from "@trellis/testing";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { diff, preprocessOne } from "./helpers.js";

type ResizeModule = typeof import("../src/resize.js");
type SimdModule = typeof import("../src/resize-simd.js");
type IndexModule = typeof import("../src/index.js");

interface Instance {
  resize: ResizeModule;
  simd: SimdModule;
  index: IndexModule;
}

async function loadInstance(): Promise<Instance> {
  vi.resetModules();
  const simd = await import("../src/resize-simd.js");
  simd.simdResizer(); // decide (and cache) the path now, while the global is as the caller set it
  return { resize: await import("../src/resize.js"), simd, index: await import("../src/index.js") };
}

let js: Instance;
let wasm: Instance;

beforeAll(async () => {
  vi.stubGlobal("WebAssembly", undefined);
  try {
    js = await loadInstance();
  } finally {
    vi.unstubAllGlobals();
  }
  wasm = await loadInstance();
});

/** mulberry32: a small seeded generator, so a failing geometry can be run again. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe("the two resize paths", () => {
  it("are the ones meant: no SIMD kernels with WebAssembly hidden, the kernels otherwise", () => {
    expect(js.simd.simdResizer()).toBeUndefined();
    expect(wasm.simd.simdResizer()).toBeDefined();
  });

  it("agree bit for bit on 400 random geometries (3 channels, random pixels)", () => {
    const rand = random(20261202);
    const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
    const kernels = wasm.simd.simdResizer()!;
    const hpass = vi.spyOn(kernels, "hpass");
    let simdRuns = 0;
    for (let i = 0; i < 400; i++) {
      const srcW = int(2, 1400);
      const srcH = int(2, 1100);
      // Mostly downscales (the seed's short side to 256), some upscales and odd ratios.
      const dstW = int(1, Math.min(2 * srcW, 900));
      const dstH = int(1, Math.min(2 * srcH, 900));
      const outW = int(1, Math.min(dstW, 300));
      const outH = int(1, Math.min(dstH, 300));
      const left = int(0, dstW - outW);
      const top = int(0, dstH - outH);
      const src = new Uint8Array(srcW * srcH * 3);
      // Random pixels four at a time (xorshift32 seeded from the test's generator): drawing each
      // byte from it took most of this test's minute.
      const words = new Uint32Array(src.buffer, 0, src.length >> 2);
      let x = Math.floor(rand() * 0xffffffff) >>> 0 || 1;
      for (let j = 0; j < words.length; j++) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        words[j] = x >>> 0;
      }
      for (let j = words.length * 4; j < src.length; j++) src[j] = (rand() * 256) | 0;
      const geometry = `#${i}: ${srcW}x${srcH} -> ${dstW}x${dstH}, window ${outW}x${outH} at (${left},${top})`;
      const run = (m: ResizeModule) => {
        const xs = m.axisTable(srcW, dstW, left, outW);
        const ys = m.axisTable(srcH, dstH, top, outH);
        if (i % 2 === 0) return m.resizeWindow(src, srcW, 3, xs, ys);
        // Every other one from the sub-rectangle the window reads, as the decoder hands it over.
        const sx = m.sourceSpan(xs);
        const sy = m.sourceSpan(ys);
        const w = sx.end - sx.start;
        const region = new Uint8Array(w * (sy.end - sy.start) * 3);
        for (let y = sy.start; y < sy.end; y++)
          region.set(src.subarray((y * srcW + sx.start) * 3, (y * srcW + sx.end) * 3), (y - sy.start) * w * 3);
        return m.resizeWindow(region, w, 3, xs, ys, sx.start, sy.start);
      };
      const before = hpass.mock.calls.length;
      const a = run(js.resize);
      expect(hpass.mock.calls.length, geometry).toBe(before);
      const b = run(wasm.resize);
      if (hpass.mock.calls.length > before) simdRuns++;
      expect(b.length, geometry).toBe(outW * outH * 3);
      const first = a.findIndex((v, j) => v !== b[j]);
      expect(first, `${geometry}: first differing byte`).toBe(-1);
    }
    hpass.mockRestore();
    // The comparison means something only if the SIMD kernels ran (they skip what they cannot do).
    expect(simdRuns).toBeGreaterThanOrEqual(390);
  }, 120_000);

  it.each(fixturePhotos())("give the seed's reference tensor for %s on the JS path too", async (name) => {
    const image = readFixtureImage(name);
    const viaJs = await preprocessOne(js.index.createPreprocess(), image);
    const viaSimd = await preprocessOne(wasm.index.createPreprocess(), image);
    expect(diff(viaJs, readReferenceTensor(name)).max).toBe(0);
    expect(diff(viaJs, viaSimd).max).toBe(0);
  });
});
