import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DataType, loadModelConfig, ModelInstanceGroup_Kind } from "@trellis/protocol";
import { afterAll, describe, expect, it } from "vitest";
import { planTrt, TrtPlanError, writeTrtPlan } from "../src/trt-plan-recipe.js";

const root = join(import.meta.dirname, "..", "..");
const seed = join(root, "models");
const committed = join(root, "models/gpu");
const base = {
  onnx: "models/resnet50_inference/1/model.onnx",
  config: join(seed, "resnet50_inference", "config.pbtxt"),
  ensemble: join(seed, "resnet50_ensemble", "config.pbtxt"),
  out: "models/gpu",
};
const tmp = await mkdtemp(join(tmpdir(), "trt-plan-"));
afterAll(() => rm(tmp, { recursive: true, force: true }));

describe("trt:plan", () => {
  it("prints the seed's trtexec command, shapes derived from max_batch_size and the input dims", async () => {
    const plan = await planTrt(base);
    expect(plan.command).toBe(
      "trtexec --onnx=models/resnet50_inference/1/model.onnx --minShapes=input:1x3x224x224 --optShapes=input:256x3x224x224 --maxShapes=input:512x3x224x224 --fp16 --saveEngine=models/gpu/triton/resnet50_trt/1/model.plan",
    );
    expect(plan.shapes).toEqual({ input: { min: [1, 3, 224, 224], opt: [256, 3, 224, 224], max: [512, 3, 224, 224] } });
  });

  it("takes overrides, quotes paths for the shell, and refuses impossible profiles", async () => {
    const plan = await planTrt({ ...base, onnx: "my models/r50.onnx", optBatch: 64, maxBatch: 256, fp16: false });
    expect(plan.command).toBe(
      "trtexec '--onnx=my models/r50.onnx' --minShapes=input:1x3x224x224 --optShapes=input:64x3x224x224 --maxShapes=input:256x3x224x224 --saveEngine=models/gpu/triton/resnet50_trt/1/model.plan",
    );
    await expect(planTrt({ ...base, optBatch: 128, maxBatch: 128 })).rejects.toThrow(
      /max batch 128 is below max_batch_size 256/,
    );
    await expect(planTrt({ ...base, optBatch: 600 })).rejects.toThrow(/min <= opt <= max batch, got 1 \/ 600 \/ 512/);
    await expect(planTrt({ ...base, ensemble: base.config })).rejects.toThrow(TrtPlanError);
  });

  it("writes configs that our own loader parses, with the seed's tensors and the engine's Triton settings", async () => {
    const plan = await planTrt({ ...base, out: tmp, endpoint: "http://gpu-host:8101" });
    await writeTrtPlan(plan, tmp);
    const onnx = await loadModelConfig(base.config);

    const trt = await loadModelConfig(join(tmp, "triton", "resnet50_trt", "config.pbtxt"));
    expect(trt.name).toBe("resnet50_trt");
    expect(trt.platform).toBe("tensorrt_plan");
    expect(trt.backend).toBe("tensorrt");
    expect(trt.maxBatchSize).toBe(256);
    expect(trt.input).toEqual(onnx.input);
    expect(trt.output).toEqual(onnx.output);
    expect(trt.input[0]?.dims).toEqual([3n, 224n, 224n]);
    expect(trt.input[0]?.dataType).toBe(DataType.TYPE_FP32);
    expect(trt.schedulingChoice.case).toBe("dynamicBatching");
    expect(trt.schedulingChoice.value).toEqual(onnx.schedulingChoice.value);
    expect(trt.instanceGroup.map((g) => [g.kind, g.count])).toEqual([[ModelInstanceGroup_Kind.GPU, 1]]);
    expect(plan.enginePath).toBe(join(tmp, "triton", "resnet50_trt", "1", "model.plan"));

    const bridge = await loadModelConfig(join(tmp, "trellis", "resnet50_inference_trt", "config.pbtxt"));
    expect(bridge.backend).toBe("typescript");
    expect(bridge.maxBatchSize).toBe(256);
    expect(bridge.input).toEqual(onnx.input);
    expect(bridge.output).toEqual(onnx.output);
    const params = Object.fromEntries(Object.entries(bridge.parameters).map(([k, v]) => [k, v.stringValue]));
    expect(params).toEqual({
      module: "@trellis/inference-trt-bridge",
      endpoint: "http://gpu-host:8101",
      remote_model_name: "resnet50_trt",
      timeout_ms: "30000",
      ready_timeout_ms: "60000",
      fp16_conversion: "false",
    });

    const seedEnsemble = await loadModelConfig(base.ensemble);
    const ensemble = await loadModelConfig(join(tmp, "trellis", "resnet50_ensemble_trt", "config.pbtxt"));
    expect(ensemble.platform).toBe("ensemble");
    expect(ensemble.input).toEqual(seedEnsemble.input);
    expect(ensemble.output).toEqual(seedEnsemble.output);
    const steps = (c: typeof ensemble) =>
      c.schedulingChoice.case === "ensembleScheduling" ? c.schedulingChoice.value.step : [];
    expect(steps(ensemble).map((s) => s.modelName)).toEqual([
      "resnet50_preprocess",
      "resnet50_inference_trt",
      "resnet50_postprocess",
    ]);
    // Same wiring as the seed, only the inference model swapped.
    expect(steps(ensemble).map((s) => [s.inputMap, s.outputMap, s.modelVersion])).toEqual(
      steps(seedEnsemble).map((s) => [s.inputMap, s.outputMap, s.modelVersion]),
    );
  });

  it("matches the GPU repositories committed under models/gpu/", async () => {
    const plan = await planTrt(base);
    for (const f of plan.files) {
      expect(await readFile(join(committed, f.path), "utf8"), f.path).toBe(f.text);
    }
  });
});
