#!/usr/bin/env node
// CLI: pnpm trt:plan [--workflow trtexec|torch-trt|tf-trt] [--release yy.mm] [--tensorrt 8|10|11] [--io-fp16] [--onnx FILE] [--out DIR] ...
// Prints the commands that build the engine (for that release's TensorRT) and writes the GPU model repositories.
import { join, relative } from "node:path";
import { Command } from "commander";
import { scriptArgv } from "./argv.js";
import { DEFAULT_REPOSITORY } from "./paths.js";
import { DEFAULT_RELEASE, planTrt, TRT_RELEASES, TrtPlanError, writeTrtPlan } from "./trt-plan-recipe.js";
import { TRT_WORKFLOWS, type TrtWorkflow } from "./trt-plan-workflows.js";

// pnpm runs scripts in tooling/; paths on the command line mean the caller's directory.
if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);
const rel = (p: string) => relative(process.cwd(), p) || ".";
const int = (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n)) throw new Error(`expected an integer, got ${v}`);
  return n;
};

const program = new Command("trt:plan")
  .description(
    "print the commands that build the TensorRT engine, and write the GPU model repositories (Triton + Trellis bridge)",
  )
  .option(
    "--workflow <tool>",
    `what builds the optimised model: ${TRT_WORKFLOWS.join(" | ")} (tensorrt_plan, pytorch_libtorch, tensorflow_savedmodel in Triton)`,
    "trtexec",
  )
  .option(
    "--release <yy.mm>",
    `NVIDIA container release (Triton + TensorRT) to build and serve with; known: ${Object.entries(TRT_RELEASES)
      .map(([r, m]) => `${r} (TensorRT ${m})`)
      .join(", ")}`,
    DEFAULT_RELEASE,
  )
  .option("--tensorrt <major>", "TensorRT major version of that release: 8, 10 or 11 (needed for other releases)", int)
  .option(
    "--io-fp16",
    "FP16 engine inputs/outputs: build flags, TYPE_FP16 in Triton, fp16_conversion on the bridge",
    false,
  )
  .option("--workspace <MiB>", "builder workspace limit (--memPoolSize=workspace:N)", int)
  .option("--onnx <file>", "ONNX model", rel(join(DEFAULT_REPOSITORY, "resnet50_inference", "1", "model.onnx")))
  .option("--config <file>", "its config.pbtxt", rel(join(DEFAULT_REPOSITORY, "resnet50_inference", "config.pbtxt")))
  .option(
    "--ensemble <file>",
    "the ensemble to vary",
    rel(join(DEFAULT_REPOSITORY, "resnet50_ensemble", "config.pbtxt")),
  )
  .option(
    "--out <dir>",
    "GPU repositories root (writes <out>/triton and <out>/trellis)",
    rel(join(DEFAULT_REPOSITORY, "gpu")),
  )
  .option("--triton-model <name>", "model name in Triton (default resnet50_trt, resnet50_torchtrt or resnet50_tftrt)")
  .option("--endpoint <url>", "Triton's gRPC URL, as the bridge reaches it", "http://127.0.0.1:8101")
  .option("--min-batch <n>", "profile min batch (default 1)", int)
  .option("--opt-batch <n>", "profile opt batch (default max_batch_size)", int)
  .option("--max-batch <n>", "profile max batch (default 2 x max_batch_size)", int)
  .option("--instances <n>", "GPU instances in Triton", int, 1)
  .option("--no-fp16", "build an FP32 engine (no --fp16 / no AutoCast step)")
  .option("--dry-run", "print the command only, write nothing", false)
  .parse(scriptArgv());
const o = program.opts<{
  onnx: string;
  config: string;
  ensemble: string;
  out: string;
  tritonModel?: string;
  endpoint: string;
  minBatch?: number;
  optBatch?: number;
  maxBatch?: number;
  instances: number;
  fp16: boolean;
  release: string;
  tensorrt?: number;
  ioFp16: boolean;
  workspace?: number;
  dryRun: boolean;
  workflow: TrtWorkflow;
}>();

try {
  const plan = await planTrt({ ...o, workspaceMiB: o.workspace });
  if (!o.dryRun) {
    const written = await writeTrtPlan(plan, o.out);
    for (const p of written) console.error(`wrote ${rel(p)}`);
  }
  if (plan.script) {
    console.error(`build script (${rel(join(o.out, plan.script.path))}), run on the GPU machine:`);
    console.error(plan.script.text);
    for (const step of plan.steps) console.log(step);
    console.error(`or in NVIDIA's framework container of release ${plan.release}:`);
  } else {
    console.error(
      `build the engine on the GPU machine with TensorRT ${plan.tensorrt}.x (release ${plan.release}: the TensorRT of the Triton that serves it):`,
    );
    for (const step of plan.steps) console.log(step);
    console.error(`or in NVIDIA's TensorRT container of release ${plan.release}:`);
  }
  for (const step of plan.docker) console.error(step);
} catch (err) {
  if (err instanceof TrtPlanError || (err instanceof Error && err.name === "ModelConfigError")) {
    console.error(`trt:plan: ${err.message}`);
    process.exit(1);
  }
  throw err;
}
