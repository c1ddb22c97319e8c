import {
  fixturePhotos,
  MOBILENET_PATH,
  numpyTop5,
  readFixtureImage,
  referenceTop5OnThisCpu,
  STABLE_TOP1,
} from "@trellis/testing";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPreprocess } from "../src/index.js";
import { rawImageRequest } from "./helpers.js";

const fixtureNames = fixturePhotos();

/**
 * What onnxruntime-node gives on the seed's reference tensors on this CPU: the model is int8 and its
 * kernels differ between CPUs, so the same ONNX Runtime on the same CPU is the baseline, not a JSON
 * made on another machine. Preprocessing that matches the seed's must classify exactly like it.
 */
const expected = await referenceTop5OnThisCpu();

describe("MobileNetV2 (onnxruntime-node) on the preprocessed photos", () => {
  let session: ort.InferenceSession;
  beforeAll(async () => {
    session = await ort.InferenceSession.create(MOBILENET_PATH);
  });
  afterAll(async () => {
    await session?.release();
  });

  /** Top-5 per fixture for one preprocessing mode, one batched request. */
  async function classify(mode: "seed" | "fast", names: string[]) {
    const stage = createPreprocess({ mode });
    const res = await stage.infer(rawImageRequest(names.map(readFixtureImage)));
    const out = res.outputs[0]!;
    const feeds = { input: new ort.Tensor("float32", out.data as Float32Array, out.shape) };
    const logits = (await session.run(feeds)).output!.data as Float32Array;
    // The seed's top-5 of these logits, by NumPy as postprocess.py computes it (ties in its order).
    return numpyTop5(names.map((_, i) => logits.subarray(i * 1000, (i + 1) * 1000)));
  }

  it("seed mode: every photo's top-5 matches the reference (indices in order, probabilities within 1e-3)", async () => {
    const got = await classify("seed", fixtureNames);
    fixtureNames.forEach((name, i) => {
      const want = expected[name]!;
      const g = got[i]!;
      // The seed's tensors give the seed's logits, so the same top-5, in order, tied classes included.
      expect(g.index, name).toEqual(want.top5_index);
      for (const [k, p] of g.probs.entries()) {
        expect(Math.abs(p - want.top5_probs[k]!), `${name} rank ${k}`).toBeLessThan(1e-3);
      }
    });
    // Real classes, whatever the CPU: the README's photos whose top-1 no CPU changes.
    for (const [name, { index }] of Object.entries(STABLE_TOP1)) {
      expect(got[fixtureNames.indexOf(name)]!.index[0], name).toBe(index);
    }
  });

  it("fast mode: same top-1 on chelsea, coffee, camera and motorcycle_left (agreement printed)", async () => {
    const got = await classify("fast", fixtureNames);
    const lines: string[] = [];
    let top1 = 0;
    let top5overlap = 0;
    fixtureNames.forEach((name, i) => {
      const want = expected[name]!;
      const g = got[i]!;
      const same = g.index[0] === want.top5_index[0];
      const overlap = g.index.filter((x) => want.top5_index.includes(x)).length;
      top1 += same ? 1 : 0;
      top5overlap += overlap;
      lines.push(
        `${name.padEnd(20)} top-1 ${same ? "same" : `DIFFERS (${g.index[0]} vs ${want.top5_index[0]})`}, top-5 overlap ${overlap}/5`,
      );
    });
    console.log(
      `fast mode vs seed-tensor top-5 (ONNX Runtime on this CPU):\n${lines.join("\n")}\ntop-1 agreement ${top1}/${fixtureNames.length}, top-5 overlap ${top5overlap}/${5 * fixtureNames.length}`,
    );
    for (const name of ["chelsea.jpg", "coffee.jpg", "camera.jpg", "motorcycle_left.jpg"]) {
      const i = fixtureNames.indexOf(name);
      expect(got[i]!.index[0], name).toBe(expected[name]!.top5_index[0]);
    }
  });
});
