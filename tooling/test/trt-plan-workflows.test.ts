/**
 * `pnpm trt:plan --workflow trtexec|torch-trt|tf-trt`: each generated folder checked against
 * what its Triton platform needs (Triton's backends' rules: tensorrt_plan loads 1/model.plan;
 * pytorch_libtorch loads 1/model.pt and names tensors <name>__<index>, TorchScript keeping none;
 * tensorflow_savedmodel loads the 1/model.savedmodel/ folder, tensors named by the signature),
 * the bridge and the ensemble variant agreeing with it, and trtexec's output unchanged.
 */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import {
  DataType,
  loadModelConfig,
  type ModelConfig,
  ModelInstanceGroup_Kind,
  parseModelConfig,
} from "@trellis/protocol";
import { describe, expect, it } from "vitest";
import { planTrt, type TrtPlan } from "../src/trt-plan-recipe.js";
import type { TrtWorkflow } from "../src/trt-plan-workflows.js";

const root = join(import.meta.dirname, "..", "..");
const seed = join(root, "models");
const committed = join(root, "models/gpu");
const base = {
  onnx: "models/resnet50_inference/1/model.onnx",
  config: join(seed, "resnet50_inference", "config.pbtxt"),
  ensemble: join(seed, "resnet50_ensemble", "config.pbtxt"),
  out: "models/gpu",
};

const fileText = (plan: TrtPlan, suffix: string) => {
  const f = plan.files.find((x) => x.path.endsWith(suffix));
  if (!f) throw new Error(`no generated ${suffix} in ${plan.files.map((x) => x.path).join(", ")}`);
  return f.text;
};
const configOf = (plan: TrtPlan, dir: string) => parseModelConfig(fileText(plan, join(dir, "config.pbtxt")));
const param = (c: ModelConfig, key: string) => c.parameters[key]?.stringValue;
const dimsOf = (t: { dims: bigint[] }) => t.dims.map(Number);

interface Rules {
  workflow: TrtWorkflow;
  tritonModel: string;
  platform: string;
  backend: string;
  modelFile: string;
  inputs: string[];
  outputs: string[];
  suffix: string;
}

const RULES: Rules[] = [
  {
    workflow: "trtexec",
    tritonModel: "resnet50_trt",
    platform: "tensorrt_plan",
    backend: "tensorrt",
    modelFile: "model.plan",
    inputs: ["input"],
    outputs: ["output"],
    suffix: "_trt",
  },
  {
    workflow: "torch-trt",
    tritonModel: "resnet50_torchtrt",
    platform: "pytorch_libtorch",
    backend: "pytorch",
    modelFile: "model.pt",
    inputs: ["input__0"],
    outputs: ["output__0"],
    suffix: "_torchtrt",
  },
  {
    workflow: "tf-trt",
    tritonModel: "resnet50_tftrt",
    platform: "tensorflow_savedmodel",
    backend: "tensorflow",
    modelFile: "model.savedmodel",
    inputs: ["input_1"],
    outputs: ["predictions"],
    suffix: "_tftrt",
  },
];

describe("trt:plan --workflow", () => {
  it("trtexec, the default: the same plan as without --workflow, and the committed files unchanged", async () => {
    const implicit = await planTrt(base);
    const explicit = await planTrt({ ...base, workflow: "trtexec" });
    expect(explicit).toEqual(implicit);
    expect(explicit.script).toBeUndefined();
    expect(explicit.files.map((f) => f.path)).toEqual([
      "triton/resnet50_trt/config.pbtxt",
      "triton/resnet50_trt/1/.gitkeep",
      "trellis/resnet50_inference_trt/config.pbtxt",
      "trellis/resnet50_inference_trt/1/.gitkeep",
      "trellis/resnet50_ensemble_trt/config.pbtxt",
      "trellis/resnet50_ensemble_trt/1/.gitkeep",
    ]);
    for (const f of explicit.files) expect(await readFile(join(committed, f.path), "utf8"), f.path).toBe(f.text);
  });

  for (const r of RULES) {
    it(`${r.workflow}: Triton's ${r.platform} repository, the bridge and the ensemble variant agree`, async () => {
      const plan = await planTrt({ ...base, workflow: r.workflow });
      const seedConfig = await loadModelConfig(base.config);
      const seedEnsemble = await loadModelConfig(base.ensemble);
      expect(plan.workflow).toBe(r.workflow);
      // Triton's side: platform, backend, the names the platform gives, the seed's dims and batching.
      const triton = configOf(plan, `triton/${r.tritonModel}`);
      expect(triton.name).toBe(r.tritonModel);
      expect(triton.platform).toBe(r.platform);
      expect(triton.backend).toBe(r.backend);
      expect(triton.maxBatchSize).toBe(seedConfig.maxBatchSize);
      expect(triton.input.map((t) => t.name)).toEqual(r.inputs);
      expect(triton.output.map((t) => t.name)).toEqual(r.outputs);
      expect(triton.input.map(dimsOf)).toEqual(seedConfig.input.map(dimsOf));
      expect(triton.output.map(dimsOf)).toEqual(seedConfig.output.map(dimsOf));
      expect(triton.schedulingChoice).toEqual(seedConfig.schedulingChoice);
      expect(triton.instanceGroup.map((g) => g.kind)).toEqual([ModelInstanceGroup_Kind.GPU]);
      // The version folder, and the file (or SavedModel folder) Triton loads from it.
      expect(plan.files.map((f) => f.path)).toContain(`triton/${r.tritonModel}/1/.gitkeep`);
      expect(plan.enginePath).toBe(`models/gpu/triton/${r.tritonModel}/1/${r.modelFile}`);
      // The bridge: the remote's own tensor names and dims, pointed at the Triton model.
      const bridge = configOf(plan, `trellis/resnet50_inference${r.suffix}`);
      expect(bridge.input.map((t) => t.name)).toEqual(r.inputs);
      expect(bridge.output.map((t) => t.name)).toEqual(r.outputs);
      expect(bridge.input.map(dimsOf)).toEqual(triton.input.map(dimsOf));
      expect(bridge.maxBatchSize).toBe(triton.maxBatchSize);
      expect(param(bridge, "module")).toBe("@trellis/inference-trt-bridge");
      expect(param(bridge, "remote_model_name")).toBe(r.tritonModel);
      // The ensemble: the inference step runs the bridge, its maps keyed by the bridge's tensor
      // names, carrying the same ensemble tensors as the seed's step; the other steps as the seed's.
      const ensemble = configOf(plan, `trellis/resnet50_ensemble${r.suffix}`);
      const steps = ensemble.schedulingChoice.case === "ensembleScheduling" ? ensemble.schedulingChoice.value.step : [];
      const seedSteps =
        seedEnsemble.schedulingChoice.case === "ensembleScheduling" ? seedEnsemble.schedulingChoice.value.step : [];
      expect(steps.map((s) => s.modelName)).toEqual(
        seedSteps.map((s) => (s.modelName === seedConfig.name ? `resnet50_inference${r.suffix}` : s.modelName)),
      );
      const i = seedSteps.findIndex((s) => s.modelName === seedConfig.name);
      expect(Object.keys(steps[i]!.inputMap)).toEqual(r.inputs);
      expect(Object.values(steps[i]!.inputMap)).toEqual(Object.values(seedSteps[i]!.inputMap));
      expect(Object.keys(steps[i]!.outputMap)).toEqual(r.outputs);
      expect(Object.values(steps[i]!.outputMap)).toEqual(Object.values(seedSteps[i]!.outputMap));
      for (const [k, s] of steps.entries()) {
        if (k !== i) expect(s).toEqual(seedSteps[k]);
      }
    });
  }

  it("torch-trt: the script compiles for the profile, saves TorchScript to 1/model.pt, in the PyTorch container", async () => {
    const plan = await planTrt({ ...base, workflow: "torch-trt" });
    const script = plan.script!;
    expect(script.path).toBe("recipes/resnet50_torchtrt.py");
    expect(script.text).toContain("torch_tensorrt.compile(");
    expect(script.text).toContain('ir="ts"');
    expect(script.text).toContain("min_shape=(1, 3, 224, 224)");
    expect(script.text).toContain("opt_shape=(256, 3, 224, 224)");
    expect(script.text).toContain("max_shape=(512, 3, 224, 224)");
    expect(script.text).toContain("enabled_precisions={torch.half}");
    expect(script.text).toContain('torch.jit.save(compiled, "models/gpu/triton/resnet50_torchtrt/1/model.pt")');
    expect(plan.steps).toEqual(["python models/gpu/recipes/resnet50_torchtrt.py"]);
    expect(plan.docker[0]).toContain("nvcr.io/nvidia/pytorch:23.01-py3 python models/gpu/recipes/resnet50_torchtrt.py");
    // FP16 choices as trtexec's: --no-fp16 builds FP32; --io-fp16 makes the I/O FP16 on both sides.
    const fp32 = await planTrt({ ...base, workflow: "torch-trt", fp16: false });
    expect(fp32.script!.text).toContain("enabled_precisions={torch.float32}");
    const io = await planTrt({ ...base, workflow: "torch-trt", ioFp16: true });
    expect(io.script!.text).toContain("dtype=torch.half");
    expect(configOf(io, "triton/resnet50_torchtrt").input[0]!.dataType).toBe(DataType.TYPE_FP16);
    expect(configOf(io, "triton/resnet50_torchtrt").output[0]!.dataType).toBe(DataType.TYPE_FP16);
    expect(param(configOf(io, "trellis/resnet50_inference_torchtrt"), "fp16_conversion")).toBe("true");
  });

  it("tf-trt: the signature's names are the configs' names; TrtGraphConverterV2 saves 1/model.savedmodel", async () => {
    const plan = await planTrt({ ...base, workflow: "tf-trt" });
    const text = plan.script!.text;
    expect(text).toContain('tf.TensorSpec([None, 3, 224, 224], tf.float32, name="input_1")');
    expect(text).toContain('return {"predictions": ');
    expect(text).toContain("trt.TrtGraphConverterV2(");
    expect(text).toContain("precision_mode=trt.TrtPrecisionMode.FP16");
    expect(text).toContain('converter.save("models/gpu/triton/resnet50_tftrt/1/model.savedmodel")');
    expect(plan.docker[0]).toContain(
      "nvcr.io/nvidia/tensorflow:23.01-tf2-py3 python models/gpu/recipes/resnet50_tftrt.py",
    );
    const fp32 = await planTrt({ ...base, workflow: "tf-trt", fp16: false });
    expect(fp32.script!.text).toContain("precision_mode=trt.TrtPrecisionMode.FP32");
    await expect(planTrt({ ...base, workflow: "tf-trt", ioFp16: true })).rejects.toThrow(
      /--io-fp16: the tf-trt recipe's signature is FP32/,
    );
    await expect(planTrt({ ...base, workflow: "onnx-magic" as TrtWorkflow })).rejects.toThrow(
      "workflow must be one of trtexec, torch-trt, tf-trt, got onnx-magic",
    );
  });

  it("matches the repositories committed under models/gpu/ for every workflow", async () => {
    for (const r of RULES) {
      const plan = await planTrt({ ...base, workflow: r.workflow });
      for (const f of plan.files) expect(await readFile(join(committed, f.path), "utf8"), f.path).toBe(f.text);
    }
  });

  it("the CLI takes --workflow, prints the script and the container command, and refuses an unknown one", async () => {
    const run = promisify(execFile);
    const cli = join(import.meta.dirname, "..", "dist", "trt-plan.js");
    const env = { ...process.env, INIT_CWD: root };
    const ok = await run(process.execPath, [cli, "--workflow", "tf-trt", "--dry-run"], { env });
    expect(ok.stdout.trim()).toBe("python models/gpu/recipes/resnet50_tftrt.py");
    expect(ok.stderr).toContain("trt.TrtGraphConverterV2(");
    expect(ok.stderr).toContain("nvcr.io/nvidia/tensorflow:23.01-tf2-py3");
    expect(ok.stderr).not.toMatch(/^wrote /m);
    const bad = await run(process.execPath, [cli, "--workflow", "onnx-magic", "--dry-run"], { env }).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((bad as { code: number }).code).toBe(1);
    expect((bad as { stderr: string }).stderr).toContain(
      "trt:plan: workflow must be one of trtexec, torch-trt, tf-trt",
    );
  });
});

describe("the container commands keep what they write", () => {
  /** Host folder → container folder for each `-v`, and the working folder, with the shell's words evaluated in `cwd`. */
  function mountsOf(docker: string, cwd: string): { mounts: [string, string][]; workdir: string } {
    const evaluated = docker
      .replace(/\$\(realpath -m ('[^']*'|\S+?)\)/g, (_, p: string) => resolve(cwd, p.replace(/^'|'$/g, "")))
      .replace(/\$PWD/g, cwd);
    const mounts = [...evaluated.matchAll(/-v "([^"]+)"/g)].map((m) => {
      const [host, inside] = (m[1] as string).split(":") as [string, string];
      return [host, inside] as [string, string];
    });
    const workdir = /-w "?([^"\s]+)"?/.exec(evaluated)?.[1] ?? "";
    return { mounts, workdir };
  }
  /** Where `path` (as the command names it) lands on the host, or undefined when no mount holds it. */
  function landsOnHost(path: string, docker: string, cwd: string): string | undefined {
    const { mounts, workdir } = mountsOf(docker, cwd);
    const inside = resolve(workdir, path);
    for (const [host, folder] of mounts) {
      if (inside === folder || inside.startsWith(`${folder}/`)) return join(host, inside.slice(folder.length));
    }
    return undefined;
  }

  const cwd = "/home/user/trellis";
  for (const workflow of ["trtexec", "torch-trt", "tf-trt"] as TrtWorkflow[]) {
    for (const out of ["models/gpu", "/data/gpu-repos", "../elsewhere/gpu"]) {
      it(`${workflow}, --out ${out}: the engine is written under a mounted folder, where the host expects it`, async () => {
        const plan = await planTrt({ ...base, out, workflow });
        const docker = plan.docker.at(-1) as string;
        // What the command writes: the engine path for trtexec; the recipe's folder, as its script names it.
        const written =
          workflow === "trtexec"
            ? plan.enginePath
            : (/(?:torch\.jit\.save\(compiled, |converter\.save\()"([^"]+)\/model\.(?:pt|savedmodel)"/.exec(
                plan.script!.text,
              )?.[1] as string);
        expect(written, plan.script?.text).toBeTruthy();
        expect(landsOnHost(written, docker, cwd), docker).toBe(resolve(cwd, written));
        // And what it reads: the ONNX model for trtexec, the script for the recipes.
        const read = workflow === "trtexec" ? base.onnx : (plan.args[0] as string);
        expect(landsOnHost(read, docker, cwd), docker).toBe(resolve(cwd, read));
      });
    }
  }
});
