import { join } from "node:path";
import { type ListeningServer, listenStage } from "@trellis/frontends";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { loadModelConfig, parseModelConfig } from "@trellis/protocol";
import { CpuGate } from "@trellis/runtime";
import { Code, defineStage, type Stage, StageError } from "@trellis/stage";
import { float16BitsToFloat32 } from "@trellis/stage/backend";
import { modelsDir, readFixtureImage, readReferenceTensor } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPreprocess, createStage } from "../src/index.js";
import { diff, rawImageRequest } from "./helpers.js";

describe("served over KServe v2 gRPC", () => {
  let local: Stage;
  let server: ListeningServer;
  let remote: Stage;

  beforeAll(async () => {
    const dir = join(modelsDir, "resnet50_preprocess");
    local = defineStage(
      await createStage({
        config: await loadModelConfig(join(dir, "config.pbtxt")),
        modelDir: dir,
        version: "1",
        versionDir: join(dir, "1"),
      }),
    );
    server = await listenStage(local, { host: "127.0.0.1", port: 0 });
    remote = await connectStage(grpcTransport(server.url), "resnet50_preprocess");
  });
  afterAll(async () => {
    await server?.close();
    await local?.close();
  });

  it("loads from the seed's config.pbtxt with its names and shapes", async () => {
    expect(local.name).toBe("resnet50_preprocess");
    const md = await remote.metadata();
    expect(md.inputs).toEqual([{ name: "RAW_IMAGE", datatype: "BYTES", shape: [-1, 1] }]);
    expect(md.outputs).toEqual([{ name: "PREPROCESSED_IMAGE", datatype: "FP32", shape: [-1, 3, 224, 224] }]);
  });

  it("gives bit-identical output to the in-process stage", async () => {
    const names = ["chelsea.jpg", "coffee.png", "rocket.jpg"];
    const req = rawImageRequest(names.map(readFixtureImage));
    const [a, b] = await Promise.all([local.infer(req), remote.infer(req)]);
    const ta = a.outputs[0]!;
    const tb = b.outputs[0]!;
    expect(tb.name).toBe("PREPROCESSED_IMAGE");
    expect(tb.datatype).toBe("FP32");
    expect(tb.shape).toEqual([3, 3, 224, 224]);
    expect(
      Buffer.from(
        new Uint8Array(
          (tb.data as Float32Array).buffer,
          (tb.data as Float32Array).byteOffset,
          (tb.data as Float32Array).byteLength,
        ),
      ).equals(
        Buffer.from(
          new Uint8Array(
            (ta.data as Float32Array).buffer,
            (ta.data as Float32Array).byteOffset,
            (ta.data as Float32Array).byteLength,
          ),
        ),
      ),
    ).toBe(true);
    const plane = 3 * 224 * 224;
    names.forEach((n, i) => {
      expect(diff((tb.data as Float32Array).subarray(i * plane, (i + 1) * plane), readReferenceTensor(n)).max).toBe(0);
    });
  });

  it("returns INVALID_ARGUMENT over the wire for a bad element", async () => {
    const err = await remote
      .infer(rawImageRequest([readFixtureImage("chelsea.jpg"), readFixtureImage("truncated.jpg")]))
      .catch((e) => e);
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.InvalidArgument);
    expect((err as StageError).rawMessage).toMatch(/element 1: truncated or corrupt jpeg: /);
  });

  it("reports statistics through the wire", async () => {
    const stats = await remote.statistics();
    expect(stats.name).toBe("resnet50_preprocess");
    expect(stats.inferenceCount).toBeGreaterThanOrEqual(6n);
    expect(stats.inferenceStats?.fail?.count).toBeGreaterThanOrEqual(1n);
  });
});

/** A config.pbtxt for the preprocess model with extra parameters and output. */
function configWith(params: Record<string, string>, output = "data_type: TYPE_FP32, dims: [ 3, 224, 224 ]") {
  const p = Object.entries(params)
    .map(([k, v]) => `parameters { key: "${k}" value: { string_value: "${v}" } }`)
    .join("\n");
  return parseModelConfig(`name: "pre"
backend: "typescript"
max_batch_size: 8
input [ { name: "IMG", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUT", ${output} } ]
${p}`);
}

describe("parameters from config.pbtxt", () => {
  const chelsea = readFixtureImage("chelsea.jpg");
  const reference = readReferenceTensor("chelsea.jpg");
  const plane = 224 * 224;

  it("uses the config's input and output names", async () => {
    const s = createPreprocess({ config: configWith({}) });
    const res = await s.infer({ inputs: [{ ...rawImageRequest([chelsea]).inputs[0]!, name: "IMG" }] });
    expect(res.outputs[0]!.name).toBe("OUT");
    expect(diff(res.outputs[0]!.data as Float32Array, reference).max).toBe(0);
  });

  it("layout NHWC, channel order BGR and FP16 output", async () => {
    const s = createPreprocess({
      config: configWith(
        { layout: "NHWC", channel_order: "BGR", output_datatype: "FP16" },
        "data_type: TYPE_FP16, dims: [ 224, 224, 3 ]",
      ),
    });
    const res = await s.infer({ inputs: [{ ...rawImageRequest([chelsea]).inputs[0]!, name: "IMG" }] });
    const out = res.outputs[0]!;
    expect(out.datatype).toBe("FP16");
    expect(out.shape).toEqual([1, 224, 224, 3]);
    const half = out.data as Uint16Array;
    let max = 0;
    for (let p = 0; p < plane; p++)
      for (let c = 0; c < 3; c++) {
        // BGR: output channel 0 is blue, the reference's plane 2.
        const want = reference[(2 - c) * plane + p] as number;
        max = Math.max(max, Math.abs(float16BitsToFloat32(half[p * 3 + c] as number) - want));
      }
    expect(max).toBeLessThan(2e-3); // binary16 has 11 bits of precision
  });

  it("resize_size, crop_size, mean and std", async () => {
    const s = createPreprocess({
      config: configWith(
        { resize_size: "160", crop_size: "128", mean: "0,0,0", std: "1 1 1", mode: "fast" },
        "data_type: TYPE_FP32, dims: [ 3, 128, 128 ]",
      ),
    });
    const res = await s.infer({ inputs: [{ ...rawImageRequest([chelsea]).inputs[0]!, name: "IMG" }] });
    const data = res.outputs[0]!.data as Float32Array;
    expect(res.outputs[0]!.shape).toEqual([1, 3, 128, 128]);
    expect(Math.min(...data)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...data)).toBeLessThanOrEqual(1);
    // Every value is k / 255 for an integer k: plain /255 scaling, nothing else.
    for (const v of data.subarray(0, 500)) expect(Math.abs(v * 255 - Math.round(v * 255))).toBeLessThan(1e-4);
  });

  it("explicit factory options win over the config", async () => {
    const s = createPreprocess({ config: configWith({ mode: "seed" }), mode: "fast", name: "ignored" });
    expect(s.name).toBe("pre");
    const res = await s.infer({ inputs: [{ ...rawImageRequest([chelsea]).inputs[0]!, name: "IMG" }] });
    // fast mode's resampler differs from the seed's, so the output does too.
    expect(diff(res.outputs[0]!.data as Float32Array, reference).mean).toBeGreaterThan(1e-3);
  });

  it.each([
    [{ layout: "NCWH" }, undefined, /parameter layout = "NCWH": expected one of NCHW, NHWC/],
    [{ mean: "0.5,0.5" }, undefined, /parameter mean = "0.5,0.5": expected three numbers/],
    [
      { crop_size: "300" },
      "data_type: TYPE_FP32, dims: [ 3, 300, 300 ]",
      /crop_size = 300 is larger than resize_size = 256/,
    ],
    [{ max_pixels: "-5" }, undefined, /parameter max_pixels = "-5": expected a positive integer/],
    [{ layout: "NHWC" }, undefined, /dims \[3,224,224\] do not match layout NHWC with crop_size 224 \(\[224,224,3\]\)/],
    [{ output_datatype: "FP16" }, undefined, /config output OUT is FP32 but output_datatype is FP16/],
  ])("refuses a bad configuration: %j", (params, output, message) => {
    let err: unknown;
    try {
      createPreprocess({ config: configWith(params, output) });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.InvalidArgument);
    expect((err as StageError).rawMessage).toMatch(message);
  });
});

describe("pending requests", () => {
  it("counts the requests waiting for a decode slot, not the ones decoding", async () => {
    const s = await createPreprocess({ concurrency: 1 });
    const chelsea = readFixtureImage("chelsea.jpg");
    expect(s.pendingRequests?.()).toBe(0);
    const first = s.infer(rawImageRequest([chelsea, chelsea]));
    const second = s.infer(rawImageRequest([chelsea]));
    const third = s.infer(rawImageRequest([chelsea]));
    // One slot: the first request is decoding; the other two wait.
    expect(s.pendingRequests?.()).toBe(2);
    await first;
    await Promise.all([second, third]);
    expect(s.pendingRequests?.()).toBe(0);
    // A request that fails still leaves the count.
    await s.infer(rawImageRequest(["not an image"])).catch(() => undefined);
    expect(s.pendingRequests?.()).toBe(0);
  });

  it("counts the requests waiting while an inference run holds the CPU gate, and decodes them once it ends", async () => {
    const cpuGate = new CpuGate();
    const s = createPreprocess({ cpuGate });
    const run = await cpuGate.acquireExclusive();
    let answered = false;
    const waiting = s.infer(rawImageRequest([readFixtureImage("chelsea.jpg")])).then((r) => {
      answered = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(answered).toBe(false);
    expect(s.pendingRequests?.()).toBe(1);
    run();
    expect((await waiting).outputs[0]?.shape).toEqual([1, 3, 224, 224]);
    expect(s.pendingRequests?.()).toBe(0);
    expect(cpuGate.sharedHolders).toBe(0);
  });
});
