/**
 * Trellis as a library, in process: each stage package's friendly factory gives a Stage served
 * by the model runtime (checks, batching), createPipeline chains them, loadModel loads a
 * repository model in one call. Classifies the shared photos with the shared MobileNetV2, and
 * bad calls fail alone, with their code and stage, while good ones are in flight beside them.
 */
import { join } from "node:path";
import { createPipeline } from "@trellis/ensemble-runner";
import { createOnnxStage, createStage as onnxDefinition } from "@trellis/inference-onnx";
import { classify, createPostprocess } from "@trellis/postprocess";
import { createPreprocess, createStage as preprocessDefinition } from "@trellis/preprocess";
import { parseModelConfig } from "@trellis/protocol";
import { serveDefinition } from "@trellis/runtime";
import { bytesTensor, Code, type Stage, StageError, tensor } from "@trellis/stage";
import {
  fixturePhotos,
  LABELS_PATH,
  MOBILENET_PATH,
  makeSeedRepository,
  readFixtureImage,
  readReferenceTensor,
  referenceTop5OnThisCpu,
  removeDir,
  STABLE_TOP1,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { loadModel } from "../src/index.js";

vi.setConfig({ testTimeout: 120_000 });

const reference = await referenceTop5OnThisCpu();
const photos = fixturePhotos().filter((p) => p.endsWith(".jpg"));

let pipeline: Stage;
let repo: string;

beforeAll(async () => {
  pipeline = await createPipeline([
    await createPreprocess({ mode: "seed" }),
    await createOnnxStage({ modelPath: MOBILENET_PATH }),
    await createPostprocess({ labelsFile: LABELS_PATH }),
  ]);
  repo = await makeSeedRepository({ prefix: "trellis-library-" });
});

afterAll(async () => {
  await pipeline?.close();
  if (repo) await removeDir(repo);
});

describe("a pipeline of the friendly factories", () => {
  it("classifies every shared photo as ONNX Runtime does on this CPU", async () => {
    for (const photo of photos) {
      const { labels } = await classify(pipeline, readFixtureImage(photo));
      expect(labels, photo).toEqual(reference[photo]!.top5_labels);
    }
    const { labels, probs } = await classify(pipeline, readFixtureImage("chelsea.jpg"));
    expect(labels[0]).toBe(STABLE_TOP1["chelsea.jpg"]!.label);
    expect(probs[0]).toBeGreaterThan(0.5);
  });

  it("fails each bad call alone, with its code and step, while good calls are in flight beside it", async () => {
    const good = photos
      .flatMap((p) => [p, p])
      .map((p) => ({ photo: p, call: classify(pipeline, readFixtureImage(p)) }));
    const bad = [
      pipeline.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [readFixtureImage(TRUNCATED_PHOTO)])] }),
      pipeline.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [new TextEncoder().encode("no image here")])] }),
      pipeline.infer({ inputs: [tensor("RAW_IMAGE", "FP32", [1, 1], new Float32Array(1))] }),
      pipeline.infer({ inputs: [bytesTensor("IMAGE", [1, 1], [readFixtureImage("coffee.jpg")])] }),
    ];
    const [goodSettled, badSettled] = await Promise.all([
      Promise.allSettled(good.map((g) => g.call)),
      Promise.allSettled(bad),
    ]);
    goodSettled.forEach((s, i) => {
      expect(s.status, good[i]!.photo).toBe("fulfilled");
      if (s.status === "fulfilled") expect(s.value.labels).toEqual(reference[good[i]!.photo]!.top5_labels);
    });
    const errors = badSettled.map((s) => (s.status === "rejected" ? (s.reason as StageError) : undefined));
    for (const err of errors) {
      expect(err).toBeInstanceOf(StageError);
      expect(err!.code).toBe(Code.InvalidArgument);
    }
    // The image problems name the step that found them; the request checks name the pipeline's input.
    expect(errors[0]!.message).toMatch(/step 0 preprocess.*RAW_IMAGE element 0: truncated or corrupt jpeg/);
    expect(errors[1]!.message).toMatch(/step 0 preprocess.*element 0: not an image/);
    expect(errors[2]!.message).toContain("data-type is 'FP32', but model 'pipeline' expects 'BYTES'");
    expect(errors[3]!.message).toContain("unexpected inference input 'IMAGE' for model 'pipeline'");
  });

  it("maps tensors by name, and builds the same pipeline from an ensemble config", async () => {
    const pre = await createPreprocess({ name: "pre" });
    const onnx = await createOnnxStage({ modelPath: MOBILENET_PATH, config: 'name: "net"' });
    const post = await createPostprocess({ labelsFile: LABELS_PATH, topK: 3 });
    const mapped = await createPipeline(
      [
        { stage: pre, inputs: { RAW_IMAGE: "jpeg" }, outputs: { PREPROCESSED_IMAGE: "pixels" } },
        { stage: onnx, inputs: { input: "pixels" }, outputs: { output: "logits" } },
        { stage: post, inputs: { LOGITS: "logits" }, outputs: { OUTPUT_RESULTS: "top3" } },
      ],
      { name: "mapped", closeSteps: false },
    );
    const meta = await mapped.metadata();
    expect(meta.inputs.map((t) => t.name)).toEqual(["jpeg"]);
    expect(meta.outputs.map((t) => t.name)).toEqual(["top3"]);
    const { labels } = await classify(mapped, readFixtureImage("coffee.jpg"));
    expect(labels).toEqual(reference["coffee.jpg"]!.top5_labels.slice(0, 3));
    await mapped.close();

    const fromConfig = await createPipeline({
      name: "from_config",
      config: `platform: "ensemble"
max_batch_size: 4
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TOP" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "RAW_IMAGE" value: "IMAGE" } output_map { key: "PREPROCESSED_IMAGE" value: "px" } },
  { model_name: "net" model_version: -1 input_map { key: "input" value: "px" } output_map { key: "output" value: "lg" } },
  { model_name: "postprocess" model_version: -1 input_map { key: "LOGITS" value: "lg" } output_map { key: "OUTPUT_RESULTS" value: "TOP" } }
] }`,
      stages: { pre, net: onnx, postprocess: post },
    });
    expect((await classify(fromConfig, readFixtureImage("camera.jpg"))).labels).toEqual(
      reference["camera.jpg"]!.top5_labels.slice(0, 3),
    );
    await fromConfig.close();
    // closeSteps (the default) closed the stages with the pipeline.
    expect(await onnx.isReady()).toBe(false);
  });
});

describe("the runtime behind a friendly factory", () => {
  it("batches concurrent calls as the config's dynamic_batching says, each answered with its own rows", async () => {
    const onnx = await createOnnxStage({
      modelPath: MOBILENET_PATH,
      config: `max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }`,
    });
    try {
      const pixels = photos.map((p) => tensor("input", "FP32", [1, 3, 224, 224], readReferenceTensor(p)));
      const answers = await Promise.all(pixels.map((t) => onnx.infer({ inputs: [t] })));
      answers.forEach((a, i) => {
        expect(Array.from(a.outputs[0]!.data as Float32Array)).toEqual(Array.from(reference[photos[i]!]!.logits));
      });
      const stats = await onnx.statistics();
      expect(stats.inferenceCount).toBe(BigInt(photos.length));
      // Merged: fewer executions than requests.
      expect(stats.executionCount).toBeLessThan(BigInt(photos.length));
      // Checked against the config before anything runs, in Triton's words.
      const err = await onnx
        .infer({ inputs: [tensor("input", "FP32", [9, 3, 224, 224], new Float32Array(9 * 3 * 224 * 224))] })
        .catch((e) => e);
      expect(err).toBeInstanceOf(StageError);
      expect((err as StageError).message).toContain("inference request batch-size must be <= 8");
    } finally {
      await onnx.close();
    }
  });

  it("serves a package's createStage definition with serveDefinition, as the loader does", async () => {
    const config = parseModelConfig(`name: "pre"
max_batch_size: 8
input [ { name: "RAW_IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PREPROCESSED_IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]`);
    const definition = await preprocessDefinition({ config, modelDir: ".", version: "1", versionDir: "." });
    const stage = await serveDefinition(definition);
    const res = await stage.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [readFixtureImage("chelsea.jpg")])] });
    expect(res.outputs[0]!.shape).toEqual([1, 3, 224, 224]);
    await stage.close();
    const modelDir = join(repo, "resnet50_inference");
    const onnx = await onnxDefinition({
      config: parseModelConfig(""),
      modelDir,
      version: "1",
      versionDir: join(modelDir, "1"),
    });
    // An empty config names no instance_group: Triton's default for onnxruntime, two CPU instances.
    expect(onnx.instances).toBe(2);
    expect(onnx.config.input.map((t) => t.name)).toEqual(["input"]);
    await onnx.close?.();
  });
});

describe("loadModel", () => {
  it("loads the seed ensemble from a repository in one call and classifies as the pipeline does", async () => {
    const model = await loadModel(repo, "resnet50_ensemble");
    try {
      for (const photo of ["chelsea.jpg", "coffee.jpg"]) {
        expect((await classify(model, readFixtureImage(photo))).labels).toEqual(reference[photo]!.top5_labels);
      }
    } finally {
      await model.close();
    }
  });

  it("names what is missing: an unknown model, a version folder that is not there", async () => {
    const unknown = await loadModel(repo, "resnet50").catch((e) => e);
    expect(unknown).toBeInstanceOf(StageError);
    expect((unknown as StageError).code).toBe(Code.NotFound);
    expect((unknown as StageError).message).toContain('no model "resnet50" in the repository');
    const version = await loadModel(repo, "resnet50_postprocess", { version: "7" }).catch((e) => e);
    expect((version as StageError).code).toBe(Code.NotFound);
    expect((version as StageError).message).toContain('no version folder "7"');
  });
});
