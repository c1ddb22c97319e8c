/**
 * TensorRT plan recipe: from the ONNX model and its config.pbtxt, the exact
 * `trtexec` command that builds the engine, a Triton model repository for
 * the engine (the real Triton serves it), and a Trellis repository whose
 * ensemble reaches it through @trellis/inference-trt-bridge.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import {
  DataType,
  loadModelConfig,
  type ModelConfig,
  type ModelEnsembling_Step,
  type ModelInput,
} from "@trellis/protocol";

export interface TrtPlanOptions {
  /** The ONNX model, as trtexec will see it (the path is used as given). */
  onnx: string;
  /** Its config.pbtxt (names, datatypes, dims, max_batch_size, dynamic batching). */
  config: string;
  /** The seed's ensemble config.pbtxt, whose inference step the variant replaces. */
  ensemble: string;
  /** GPU repositories root: writes `<out>/triton` and `<out>/trellis`. */
  out: string;
  /** Engine's model name in Triton (default "resnet50_trt"). */
  tritonModel?: string;
  /** Batch sizes for trtexec's optimisation profile; default 1, max_batch_size, 2 x max_batch_size (the seed's 1/256/512). */
  minBatch?: number;
  optBatch?: number;
  maxBatch?: number;
  /** --fp16 (default true, as the seed built it). */
  fp16?: boolean;
  /** Triton's gRPC endpoint, as the bridge will reach it (default "http://127.0.0.1:8101"). */
  endpoint?: string;
  /** GPU instances of the engine in Triton (default 1). */
  instances?: number;
}

export interface TrtPlanFile {
  /** Path relative to `out`. */
  path: string;
  text: string;
}

export interface TrtPlan {
  /** The trtexec command line, shell-quoted. */
  command: string;
  /** Its argv (without "trtexec"). */
  args: string[];
  /** Where trtexec writes the engine: the Triton model's version folder. */
  enginePath: string;
  files: TrtPlanFile[];
  /** Shapes per input, e.g. { input: { min: [1,3,224,224], ... } }. */
  shapes: Record<string, { min: number[]; opt: number[]; max: number[] }>;
}

export class TrtPlanError extends Error {
  override name = "TrtPlanError";
}

const DEFAULT_ENDPOINT = "http://127.0.0.1:8101";
/** Names in the generated repositories. */
export const TRT_NAMES = {
  tritonModel: "resnet50_trt",
  bridgeSuffix: "_trt",
  tritonDir: "triton",
  trellisDir: "trellis",
} as const;

/** POSIX shell quoting, only where needed. */
function shellQuote(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
}

const typeName = (t: DataType) => DataType[t];
const dims = (d: readonly bigint[]) => `[ ${d.join(", ")} ]`;

function tensors(kind: "input" | "output", list: readonly { name: string; dataType: DataType; dims: bigint[] }[]) {
  const items = list.map(
    (t) => `  {\n    name: "${t.name}"\n    data_type: ${typeName(t.dataType)}\n    dims: ${dims(t.dims)}\n  }`,
  );
  return `${kind} [\n${items.join(",\n")}\n]`;
}

function dynamicBatching(config: ModelConfig): string {
  const db = config.schedulingChoice.case === "dynamicBatching" ? config.schedulingChoice.value : undefined;
  const preferred = db?.preferredBatchSize.length ? db.preferredBatchSize : [config.maxBatchSize];
  const delay = db?.maxQueueDelayMicroseconds ?? 100000n;
  return `dynamic_batching {\n  preferred_batch_size: [ ${preferred.join(", ")} ]\n  max_queue_delay_microseconds: ${delay}\n}`;
}

const param = (key: string, value: string) =>
  `parameters {\n  key: "${key}"\n  value: { string_value: "${value.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}" }\n}`;

function ensembleSteps(steps: readonly ModelEnsembling_Step[]): string {
  const map = (key: string, m: Record<string, string>) =>
    Object.entries(m)
      .map(([k, v]) => `      ${key} {\n        key: "${k}"\n        value: "${v}"\n      }`)
      .join("\n");
  const items = steps.map(
    (s) =>
      `    {\n      model_name: "${s.modelName}"\n      model_version: ${s.modelVersion}\n${map("input_map", s.inputMap)}\n${map("output_map", s.outputMap)}\n    }`,
  );
  return `ensemble_scheduling {\n  step [\n${items.join(",\n")}\n  ]\n}`;
}

/** trtexec's NxCxHxW for one input at `batch`. */
function shapeOf(input: ModelInput, batch: number, configPath: string): number[] {
  const d = input.dims.map(Number);
  if (d.some((x) => x < 0)) {
    throw new TrtPlanError(
      `${configPath}: input ${input.name} has a variable dim ${dims(input.dims)}; trtexec needs fixed non-batch dims for its profile`,
    );
  }
  return [batch, ...d];
}

/** Computes the command and the files; writes nothing. */
export async function planTrt(options: TrtPlanOptions): Promise<TrtPlan> {
  const config = await loadModelConfig(options.config);
  const ensemble = await loadModelConfig(options.ensemble);
  const mbs = config.maxBatchSize;
  if (mbs <= 0) {
    throw new TrtPlanError(
      `${options.config}: max_batch_size is ${mbs}; the engine's batch profile is derived from it`,
    );
  }
  const min = options.minBatch ?? 1;
  const opt = options.optBatch ?? mbs;
  const max = options.maxBatch ?? 2 * mbs;
  for (const [flag, v] of Object.entries({ "min batch": min, "opt batch": opt, "max batch": max })) {
    if (!Number.isInteger(v) || v < 1) throw new TrtPlanError(`${flag} must be a positive integer, got ${v}`);
  }
  if (!(min <= opt && opt <= max)) throw new TrtPlanError(`need min <= opt <= max batch, got ${min} / ${opt} / ${max}`);
  if (max < mbs) {
    throw new TrtPlanError(
      `max batch ${max} is below max_batch_size ${mbs}: Triton would send batches the engine rejects`,
    );
  }
  const step = ensemble.schedulingChoice.case === "ensembleScheduling" ? ensemble.schedulingChoice.value.step : [];
  if (!step.some((s) => s.modelName === config.name)) {
    throw new TrtPlanError(
      `${options.ensemble}: no ensemble step runs ${config.name} (steps: ${step.map((s) => s.modelName).join(", ") || "none"})`,
    );
  }

  const tritonModel = options.tritonModel ?? TRT_NAMES.tritonModel;
  const bridgeModel = `${config.name}${TRT_NAMES.bridgeSuffix}`;
  const ensembleModel = `${ensemble.name}${TRT_NAMES.bridgeSuffix}`;
  const versionDir = join(options.out, TRT_NAMES.tritonDir, tritonModel, "1");
  const enginePath = join(versionDir, "model.plan");

  const shapes: TrtPlan["shapes"] = {};
  for (const input of config.input) {
    shapes[input.name] = {
      min: shapeOf(input, min, options.config),
      opt: shapeOf(input, opt, options.config),
      max: shapeOf(input, max, options.config),
    };
  }
  const profile = (which: "min" | "opt" | "max") =>
    Object.entries(shapes)
      .map(([name, s]) => `${name}:${s[which].join("x")}`)
      .join(",");
  const args = [
    `--onnx=${options.onnx}`,
    `--minShapes=${profile("min")}`,
    `--optShapes=${profile("opt")}`,
    `--maxShapes=${profile("max")}`,
    ...(options.fp16 === false ? [] : ["--fp16"]),
    `--saveEngine=${enginePath}`,
  ];
  const command = ["trtexec", ...args].map(shellQuote).join(" ");
  const onnxName = basename(options.onnx);
  const header = "# Generated by `pnpm trt:plan` (tooling/src/trt-plan-recipe.ts); see models/gpu/README.md.";

  const tritonConfig = `${header}
# The TensorRT engine built by trtexec from ${onnxName} (profile batch ${min}/${opt}/${max}${options.fp16 === false ? "" : ", --fp16"}),
# served by a real Triton: tritonserver --model-repository=<this folder's parent> --grpc-port 8101.
# The engine goes in 1/model.plan (not committed; build it with the same TensorRT as that Triton).
name: "${tritonModel}"
platform: "tensorrt_plan"
backend: "tensorrt"
max_batch_size: ${mbs}
${tensors("input", config.input)}
${tensors("output", config.output)}
${dynamicBatching(config)}
instance_group [
  {
    count: ${options.instances ?? 1}
    kind: KIND_GPU
  }
]
`;

  const bridgeConfig = `${header}
# The ensemble's inference step, run by TensorRT in a real Triton: the bridge
# forwards each batch whole over KServe v2 gRPC to "${tritonModel}" at the endpoint.
# Change "endpoint" to where that Triton's gRPC port is.
name: "${bridgeModel}"
backend: "typescript"
max_batch_size: ${mbs}
${tensors("input", config.input)}
${tensors("output", config.output)}
${param("module", "@trellis/inference-trt-bridge")}
${param("endpoint", options.endpoint ?? DEFAULT_ENDPOINT)}
${param("remote_model_name", tritonModel)}
${param("timeout_ms", "30000")}
${param("ready_timeout_ms", "60000")}
${param("fp16_conversion", "false")}
`;

  const steps = step.map((s) => (s.modelName === config.name ? { ...s, modelName: bridgeModel } : s));
  const ensembleConfig = `${header}
# ${ensemble.name} with its inference step on TensorRT: TypeScript preprocess and
# postprocess here, ${config.name} replaced by ${bridgeModel} (the bridge to Triton).
# The other steps load from the default repository: serve both (see models/gpu/README.md).
name: "${ensembleModel}"
platform: "ensemble"
max_batch_size: ${ensemble.maxBatchSize}
${tensors("input", ensemble.input)}
${tensors("output", ensemble.output)}
${ensembleSteps(steps)}
`;

  return {
    command,
    args,
    enginePath,
    shapes,
    files: [
      { path: join(TRT_NAMES.tritonDir, tritonModel, "config.pbtxt"), text: tritonConfig },
      { path: join(TRT_NAMES.tritonDir, tritonModel, "1", ".gitkeep"), text: "" },
      { path: join(TRT_NAMES.trellisDir, bridgeModel, "config.pbtxt"), text: bridgeConfig },
      { path: join(TRT_NAMES.trellisDir, bridgeModel, "1", ".gitkeep"), text: "" },
      { path: join(TRT_NAMES.trellisDir, ensembleModel, "config.pbtxt"), text: ensembleConfig },
      { path: join(TRT_NAMES.trellisDir, ensembleModel, "1", ".gitkeep"), text: "" },
    ],
  };
}

/** Writes the plan's files under `out`; returns their paths. */
export async function writeTrtPlan(plan: TrtPlan, out: string): Promise<string[]> {
  const written: string[] = [];
  for (const f of plan.files) {
    const path = join(out, f.path);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, f.text);
    written.push(path);
  }
  return written;
}
