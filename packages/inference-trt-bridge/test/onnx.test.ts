// Acceptance: the bridge against a real KServe v2 gRPC server hosting the
// real MobileNetV2 ONNX model (the stand-in for Triton + TensorRT on machines
// without a GPU), loaded from the committed models/gpu/ bridge config.
import { readFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { ConnectError } from "@connectrpc/connect";
import { createOnnxModel, type OnnxModel } from "@trellis/inference-onnx";
import { loadModelConfig, parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, type Stage, tensor } from "@trellis/stage";
import { MOBILENET_PATH, modelsDir, readReferenceTensor, STABLE_TOP1 } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createStage } from "../src/index.js";
import { type Child, spawnServer } from "./helpers.js";

const IMAGES = ["chelsea.jpg", "coffee.jpg", "camera.jpg", "rocket.jpg"];

/** The seed's inference config, renamed to the Triton model and pointed at MobileNetV2. */
async function standInConfigText(): Promise<string> {
  const seed = await readFile(join(modelsDir, "resnet50_inference", "config.pbtxt"), "utf8");
  return `${seed.replace('name: "resnet50_inference"', 'name: "resnet50_trt"').replace(/max_queue_delay_microseconds: \d+/, "max_queue_delay_microseconds: 1000")}\ndefault_model_filename: "${basename(MOBILENET_PATH)}"\n`;
}

let server: Child;
let direct: OnnxModel;
let bridge: Stage;
let env: Record<string, string>;
let batch: ReturnType<typeof tensor<"FP32">>;
let expectedTop1: number[];

const argmaxes = (logits: Float32Array, n: number) =>
  Array.from({ length: n }, (_, i) => {
    const row = logits.subarray(i * 1000, (i + 1) * 1000);
    return row.indexOf(Math.max(...row));
  });

beforeAll(async () => {
  const text = await standInConfigText();
  env = { ONNX_CONFIG: text };
  server = await spawnServer("onnx", 0, [MOBILENET_PATH], env);
  direct = await createOnnxModel({
    config: parseModelConfig(text),
    modelDir: dirname(dirname(MOBILENET_PATH)),
    versionDir: dirname(MOBILENET_PATH),
  });
  const config = await loadModelConfig(join(modelsDir, "gpu", "trellis", "resnet50_inference_trt", "config.pbtxt"));
  const endpoint = config.parameters.endpoint;
  if (!endpoint) throw new Error("committed bridge config has no endpoint parameter");
  endpoint.stringValue = `http://127.0.0.1:${server.port}`;
  bridge = defineStage(await createStage({ config, modelDir: ".", version: "1", versionDir: "1" }));
  const data = new Float32Array(IMAGES.length * 3 * 224 * 224);
  for (const [i, image] of IMAGES.entries()) {
    data.set(readReferenceTensor(image), i * 3 * 224 * 224);
  }
  batch = tensor("input", "FP32", [IMAGES.length, 3, 224, 224], data);
  // ONNX Runtime run directly on this CPU, on the same batch of 4: int8 kernels differ between CPUs
  // and between batch sizes (rocket.jpg's top-1 at batch 4 differs from batch 1 on some CPUs).
  const request = { inputs: [batch] };
  const context = { batchSize: IMAGES.length, requests: [request], instance: 0, ownsInputs: false };
  const direct4 = await direct.backend.computeBatch!(request, context);
  expectedTop1 = argmaxes(direct4.outputs[0]?.data as Float32Array, IMAGES.length);
}, 60_000);

afterAll(async () => {
  await server?.kill();
  await direct?.backend.close();
  await bridge?.close();
});

describe("bridge to a real ONNX model over gRPC", () => {
  it("gives exactly the direct stage's logits for a batch of real photos", async () => {
    // The ONNX backend's own answer for the batch (one run on its instance 0).
    const request = { inputs: [batch] };
    const context = { batchSize: IMAGES.length, requests: [request], instance: 0, ownsInputs: false };
    const want = await direct.backend.computeBatch!(request, context);
    const got = await bridge.infer({ inputs: [batch] });
    expect(got.modelName).toBe("resnet50_inference_trt");
    const w = want.outputs[0];
    const g = got.outputs[0];
    expect([g?.name, g?.datatype, g?.shape]).toEqual(["output", "FP32", [4, 1000]]);
    const bytes = (t: typeof g) => {
      const d = t?.data as Float32Array;
      return Buffer.from(d.buffer, d.byteOffset, d.byteLength);
    };
    expect(bytes(g).equals(bytes(w))).toBe(true);
    expect(argmaxes(g?.data as Float32Array, 4)).toEqual(expectedTop1);
    // chelsea, coffee, camera: the README's top-1s, which hold on any CPU (rocket.jpg's does not).
    expect(expectedTop1.slice(0, 3)).toEqual(IMAGES.slice(0, 3).map((image) => STABLE_TOP1[image]?.index));
    const stats = await bridge.statistics();
    expect(stats.inferenceCount).toBeGreaterThanOrEqual(4n);
  });

  it("fails UNAVAILABLE naming the remote while the server is gone, and recovers when it is back on the same port", async () => {
    const port = server.port;
    await server.kill();
    const err = await bridge.infer({ inputs: [batch] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.Unavailable);
    expect((err as ConnectError).message).toContain(`remote model resnet50_trt at http://127.0.0.1:${port}`);
    server = await spawnServer("onnx", port, [MOBILENET_PATH], env);
    const again = await bridge.infer({ inputs: [batch] });
    expect(argmaxes(again.outputs[0]?.data as Float32Array, 4)).toEqual(expectedTop1);
  });
});
