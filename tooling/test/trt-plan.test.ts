/**
 * `pnpm trt:plan` per TensorRT version. Each printed option was checked against the trtexec of
 * that version (NVIDIA/TensorRT, samples/common/sampleOptions.cpp, where trtexec parses its
 * arguments; an argument it does not parse ends in "Unknown option" in samples/trtexec/trtexec.cpp):
 * - TensorRT 8.5 (branch release/8.5; the 23.01 containers): --onnx, --minShapes/--optShapes/
 *   --maxShapes, --fp16, --saveEngine, --memPoolSize=workspace:<MiB> (--workspace still parsed but
 *   "deprecated by --memPoolSize"), --inputIOFormats/--outputIOFormats as type:fmt, e.g. fp16:chw.
 * - TensorRT 10.x (branches release/10.8 and release/10.16): same flags; --workspace and
 *   --explicitBatch are no longer parsed (so they are refused), --memPoolSize=workspace:<size>
 *   (MiB without a suffix). NVIDIA's "Migrating trtexec Usage from TensorRT 8.x to 10.x" says the same.
 * - TensorRT 11.x (branches release/11.0 and release/11.1): --fp16 is no longer parsed, and
 *   --inputIOFormats takes a layout only ("chw"), no type. NVIDIA's "Migrating trtexec Usage from
 *   TensorRT 10.x to 11.x" (docs.nvidia.com/deeplearning/tensorrt/11.4.1/api/migration/
 *   tensorrt-10x-to-11x-trtexec.html) replaces --fp16 with ModelOpt AutoCast before trtexec.
 *   AutoCast's CLI (NVIDIA/Model-Optimizer, modelopt/onnx/autocast/__main__.py): --onnx_path,
 *   --output_path, --low_precision_type fp16, --keep_io_types (store_true: without it the
 *   model's inputs and outputs become FP16).
 */
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

const SHAPES = "--minShapes=input:1x3x224x224 --optShapes=input:256x3x224x224 --maxShapes=input:512x3x224x224";
const ENGINE = "--saveEngine=models/gpu/triton/resnet50_trt/1/model.plan";
const FP16_ONNX = "models/gpu/triton/resnet50_trt/model.fp16.onnx";
const USER = `--user "$(id -u):$(id -g)"`;

describe("trt:plan", () => {
  it("prints the seed's trtexec command for 23.01 (TensorRT 8.5) by default, shapes derived from max_batch_size", async () => {
    const plan = await planTrt(base);
    expect(plan.release).toBe("23.01");
    expect(plan.tensorrt).toBe(8);
    expect(plan.command).toBe(`trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} --fp16 ${ENGINE}`);
    expect(plan.steps).toEqual([plan.command]);
    expect(plan.shapes).toEqual({ input: { min: [1, 3, 224, 224], opt: [256, 3, 224, 224], max: [512, 3, 224, 224] } });
    // In NVIDIA's container of the same release, as the caller's user (the plan is not root's).
    expect(plan.docker).toEqual([
      `docker run --gpus all --rm ${USER} -v "$PWD:/work" -w /work nvcr.io/nvidia/tensorrt:23.01-py3 ${plan.command}`,
    ]);
    // --memPoolSize=workspace:<MiB> is 8.5's own form too (--workspace is deprecated there).
    const ws = await planTrt({ ...base, workspaceMiB: 4096 });
    expect(ws.command).toBe(
      `trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} --memPoolSize=workspace:4096 --fp16 ${ENGINE}`,
    );
  });

  it("prints TensorRT 10's command for 25.01: --memPoolSize, never --workspace or --explicitBatch", async () => {
    const plan = await planTrt({ ...base, release: "25.01" });
    expect(plan.tensorrt).toBe(10);
    expect(plan.command).toBe(`trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} --fp16 ${ENGINE}`);
    const ws = await planTrt({ ...base, release: "25.01", workspaceMiB: 2048 });
    expect(ws.command).toBe(
      `trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} --memPoolSize=workspace:2048 --fp16 ${ENGINE}`,
    );
    expect(ws.command).not.toMatch(/--workspace=|--explicitBatch/);
    expect(ws.docker[0]).toContain("nvcr.io/nvidia/tensorrt:25.01-py3 trtexec ");
  });

  it("prints TensorRT 11's two steps: AutoCast to an FP16 ONNX keeping FP32 I/O, then trtexec without --fp16", async () => {
    const plan = await planTrt({ ...base, release: "26.07", tensorrt: 11 });
    expect(plan.tensorrt).toBe(11);
    expect(plan.steps).toEqual([
      `python -m modelopt.onnx.autocast --onnx_path models/resnet50_inference/1/model.onnx --output_path ${FP16_ONNX} --low_precision_type fp16 --keep_io_types`,
      `trtexec --onnx=${FP16_ONNX} ${SHAPES} ${ENGINE}`,
    ]);
    expect(plan.command).toBe(plan.steps[1]);
    expect(plan.steps.join(" ")).not.toContain("--fp16");
    // AutoCast runs where ModelOpt is installed; only trtexec goes in the TensorRT container.
    expect(plan.docker).toEqual([
      plan.steps[0],
      `docker run --gpus all --rm ${USER} -v "$PWD:/work" -w /work nvcr.io/nvidia/tensorrt:26.07-py3 ${plan.steps[1]}`,
    ]);
    // An FP32 engine on 11: no AutoCast, the seed's ONNX as is.
    const fp32 = await planTrt({ ...base, release: "26.07", tensorrt: 11, fp16: false });
    expect(fp32.steps).toEqual([`trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} ${ENGINE}`]);
  });

  it("refuses a release whose TensorRT it does not know, and versions it has not checked", async () => {
    await expect(planTrt({ ...base, release: "26.07" })).rejects.toThrow(
      /release 26\.07: trt:plan does not know its TensorRT version .*--tensorrt 8\|10\|11/,
    );
    await expect(planTrt({ ...base, release: "2501" })).rejects.toThrow(/release must be yy\.mm, e\.g\. 23\.01/);
    await expect(planTrt({ ...base, tensorrt: 9 })).rejects.toThrow(/TensorRT 9: trt:plan knows 8, 10 and 11/);
    await expect(planTrt({ ...base, workspaceMiB: 0 })).rejects.toThrow(/workspace must be a positive integer/);
    // An explicit --tensorrt wins over the table.
    expect((await planTrt({ ...base, release: "23.01", tensorrt: 10 })).tensorrt).toBe(10);
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
    // One instance on GPU 0, as the seed: without gpus Triton makes one per visible GPU.
    expect(trt.instanceGroup.map((g) => [g.kind, g.count, g.gpus])).toEqual([[ModelInstanceGroup_Kind.GPU, 1, [0]]]);
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

  it("--io-fp16 writes the FP16 I/O build flags, TYPE_FP16 in Triton and the bridge's conversion together", async () => {
    const ioFormats = "--inputIOFormats=fp16:chw --outputIOFormats=fp16:chw";
    for (const release of ["23.01", "25.01"]) {
      const plan = await planTrt({ ...base, release, ioFp16: true });
      expect(plan.command).toBe(
        `trtexec --onnx=models/resnet50_inference/1/model.onnx ${SHAPES} --fp16 ${ioFormats} ${ENGINE}`,
      );
    }
    // 11: AutoCast without --keep_io_types makes the ONNX's I/O FP16; 11's --inputIOFormats takes no type.
    const p11 = await planTrt({ ...base, release: "26.07", tensorrt: 11, ioFp16: true });
    expect(p11.steps).toEqual([
      `python -m modelopt.onnx.autocast --onnx_path models/resnet50_inference/1/model.onnx --output_path ${FP16_ONNX} --low_precision_type fp16`,
      `trtexec --onnx=${FP16_ONNX} ${SHAPES} ${ENGINE}`,
    ]);
    await expect(planTrt({ ...base, ioFp16: true, fp16: false })).rejects.toThrow(
      /--io-fp16 builds an FP16 engine; drop --no-fp16/,
    );

    const out = join(tmp, "io-fp16");
    const plan = await planTrt({ ...base, out, ioFp16: true });
    await writeTrtPlan(plan, out);
    const trt = await loadModelConfig(join(out, "triton", "resnet50_trt", "config.pbtxt"));
    expect([...trt.input, ...trt.output].map((t) => [t.name, t.dataType])).toEqual([
      ["input", DataType.TYPE_FP16],
      ["output", DataType.TYPE_FP16],
    ]);
    // Trellis's side keeps FP32 (what preprocess gives and postprocess takes); the bridge converts.
    const bridge = await loadModelConfig(join(out, "trellis", "resnet50_inference_trt", "config.pbtxt"));
    expect([...bridge.input, ...bridge.output].map((t) => t.dataType)).toEqual([
      DataType.TYPE_FP32,
      DataType.TYPE_FP32,
    ]);
    expect(bridge.parameters.fp16_conversion?.stringValue).toBe("true");
    const text = await readFile(join(out, "trellis", "resnet50_inference_trt", "config.pbtxt"), "utf8");
    expect(text).toContain('parameters {\n  key: "fp16_conversion"\n  value: { string_value: "true" }\n}');
    // Without --io-fp16 the engine's I/O stays FP32 and so do the configs (pinned by the next test too).
    expect(
      (await planTrt({ ...base, out })).files.find((f) => f.path.endsWith("resnet50_trt/config.pbtxt"))?.text,
    ).not.toContain("TYPE_FP16");
  });

  it("matches the GPU repositories committed under models/gpu/", async () => {
    const plan = await planTrt(base);
    for (const f of plan.files) {
      expect(await readFile(join(committed, f.path), "utf8"), f.path).toBe(f.text);
    }
  });
});
