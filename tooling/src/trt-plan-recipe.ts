/**
 * TensorRT plan recipe: from the ONNX model and its config.pbtxt, the exact
 * `trtexec` command that builds the engine, a Triton model repository for
 * the engine (the real Triton serves it), and a Trellis repository whose
 * ensemble reaches it through @trellis/inference-trt-bridge.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, normalize, sep } from "node:path";
import {
  DataType,
  loadModelConfig,
  type ModelConfig,
  type ModelEnsembling_Step,
  type ModelInput,
} from "@trellis/protocol";
import {
  remoteTensorNames,
  TRT_WORKFLOWS,
  type TrtWorkflow,
  tfTrtScript,
  torchTrtScript,
  WORKFLOW_RULES,
} from "./trt-plan-workflows.js";

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
  /** FP16 kernels (default true, as the seed built it): --fp16 up to TensorRT 10, an AutoCast step from 11. */
  fp16?: boolean;
  /** FP16 engine inputs and outputs: the build flags, TYPE_FP16 in Triton's config and the bridge's conversion. */
  ioFp16?: boolean;
  /** NVIDIA container release (yy.mm) the engine is built and served with (default "23.01", the seed's). */
  release?: string;
  /** TensorRT major version in that release (8, 10 or 11); needed for a release not in TRT_RELEASES. */
  tensorrt?: number;
  /** Builder workspace limit in MiB (--memPoolSize=workspace:N); default: TensorRT's own. */
  workspaceMiB?: number;
  /** Triton's gRPC endpoint, as the bridge will reach it (default "http://127.0.0.1:8101"). */
  endpoint?: string;
  /** GPU instances of the engine in Triton (default 1). */
  instances?: number;
  /** What builds the optimised model (default "trtexec"): see trt-plan-workflows.ts. */
  workflow?: TrtWorkflow;
}

export interface TrtPlanFile {
  /** Path relative to `out`. */
  path: string;
  text: string;
}

export interface TrtPlan {
  workflow: TrtWorkflow;
  /** Torch-TensorRT and TF-TRT: the Python build script, written at `path` (relative to `out`). */
  script?: TrtPlanFile;
  /** The container release and its TensorRT major version the commands are for. */
  release: string;
  tensorrt: TensorRtMajor;
  /** The trtexec command line, shell-quoted. */
  command: string;
  /** Its argv (without "trtexec"). */
  args: string[];
  /** Every command, in order: from TensorRT 11 the ModelOpt AutoCast step, then trtexec. */
  steps: string[];
  /** The same steps with trtexec in NVIDIA's TensorRT container of the release, run as the caller's user. */
  docker: string[];
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

/** TensorRT major versions whose trtexec options trt:plan was checked against. */
export type TensorRtMajor = 8 | 10 | 11;
const MAJORS: readonly number[] = [8, 10, 11];
/** The seed's release: Triton and TensorRT containers 23.01 (TensorRT 8.5). */
export const DEFAULT_RELEASE = "23.01";
/**
 * Container releases whose TensorRT version trt:plan knows (see tooling/README.md for sources);
 * any other release needs `tensorrt` stated.
 */
export const TRT_RELEASES: Readonly<Record<string, TensorRtMajor>> = { "23.01": 8, "25.01": 10 };
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

/**
 * The `docker run` volume and working-folder flags for a command that reads and writes `paths`
 * (relative to where it runs, or absolute). When each is inside the current folder, that folder
 * is mounted at /work, as NVIDIA's container docs do. When one is not (`--out /data/gpu`, `--out
 * ../gpu`), a mount at /work would lose what the command writes there when the container exits,
 * so the current folder and each outside folder are mounted at their own absolute paths, and the
 * command runs in the current folder's: its paths then mean inside what they mean outside.
 */
export function containerMounts(paths: { path: string; dir: boolean }[]): string {
  const outside = paths.filter(({ path }) => isAbsolute(path) || normalize(path).split(sep)[0] === "..");
  if (outside.length === 0) return `-v "$PWD:/work" -w /work`;
  const folders = [...new Set(outside.map(({ path, dir }) => (dir ? path : dirname(path))))];
  const mounts = folders.map((f) => {
    const host = `$(realpath -m ${shellQuote(f)})`;
    return `-v "${host}:${host}"`;
  });
  return [`-v "$PWD:$PWD"`, ...mounts, `-w "$PWD"`].join(" ");
}

const typeName = (t: DataType) => DataType[t];
const dims = (d: readonly bigint[]) => `[ ${d.join(", ")} ]`;

function tensors(
  kind: "input" | "output",
  list: readonly { name: string; dataType: DataType; dims: bigint[] }[],
  as?: DataType,
) {
  const items = list.map(
    (t) => `  {\n    name: "${t.name}"\n    data_type: ${typeName(as ?? t.dataType)}\n    dims: ${dims(t.dims)}\n  }`,
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

/** The container release and its TensorRT major version, checked. */
function tensorRtOf(options: TrtPlanOptions): { release: string; tensorrt: TensorRtMajor } {
  const release = options.release ?? DEFAULT_RELEASE;
  if (!/^\d\d\.\d\d$/.test(release)) throw new TrtPlanError(`release must be yy.mm, e.g. 23.01, got ${release}`);
  const major = options.tensorrt ?? TRT_RELEASES[release];
  if (major === undefined) {
    const known = Object.entries(TRT_RELEASES)
      .map(([r, m]) => `${r} → ${m}`)
      .join(", ");
    throw new TrtPlanError(
      `release ${release}: trt:plan does not know its TensorRT version (it knows ${known}); ` +
        "look it up in that container's release notes and pass --tensorrt 8|10|11",
    );
  }
  if (!MAJORS.includes(major)) {
    throw new TrtPlanError(`TensorRT ${major}: trt:plan knows 8, 10 and 11 (their trtexec options differ)`);
  }
  return { release, tensorrt: major as TensorRtMajor };
}

/** The optimisation profile's batch sizes, checked against the model's max_batch_size `mbs`. */
function batchProfile(options: TrtPlanOptions, mbs: number): { min: number; opt: number; max: number } {
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
  return { min, opt, max };
}

interface BuildInputs {
  options: TrtPlanOptions;
  release: string;
  tensorrt: TensorRtMajor;
  fp16: boolean;
  ioFp16: boolean;
  tritonModel: string;
  enginePath: string;
  shapes: TrtPlan["shapes"];
}

/** The build's command lines: trtexec (after ModelOpt AutoCast from TensorRT 11), bare and in NVIDIA's container. */
function buildCommands(b: BuildInputs): Pick<TrtPlan, "command" | "args" | "steps" | "docker"> {
  const { options, tensorrt, fp16, ioFp16 } = b;
  const ws = options.workspaceMiB;
  const profile = (which: "min" | "opt" | "max") =>
    Object.entries(b.shapes)
      .map(([name, s]) => `${name}:${s[which].join("x")}`)
      .join(",");
  // TensorRT 8.5 and 10: --fp16 lets the builder pick FP16 kernels; FP16 I/O is asked with
  // --inputIOFormats/--outputIOFormats (type:format). TensorRT 11 has no --fp16 (every network is
  // strongly typed): ModelOpt AutoCast writes an FP16 ONNX first, whose I/O types the engine keeps.
  const autocastOnnx = join(options.out, TRT_NAMES.tritonDir, b.tritonModel, "model.fp16.onnx");
  const autocast =
    tensorrt >= 11 && fp16
      ? [
          "python",
          "-m",
          "modelopt.onnx.autocast",
          "--onnx_path",
          options.onnx,
          "--output_path",
          autocastOnnx,
          "--low_precision_type",
          "fp16",
          ...(ioFp16 ? [] : ["--keep_io_types"]),
        ]
      : undefined;
  const args = [
    `--onnx=${autocast ? autocastOnnx : options.onnx}`,
    `--minShapes=${profile("min")}`,
    `--optShapes=${profile("opt")}`,
    `--maxShapes=${profile("max")}`,
    ...(ws === undefined ? [] : [`--memPoolSize=workspace:${ws}`]),
    ...(tensorrt < 11 && fp16 ? ["--fp16"] : []),
    ...(tensorrt < 11 && ioFp16 ? ["--inputIOFormats=fp16:chw", "--outputIOFormats=fp16:chw"] : []),
    `--saveEngine=${b.enginePath}`,
  ];
  const quote = (argv: string[]) => argv.map(shellQuote).join(" ");
  const command = quote(["trtexec", ...args]);
  const image = `nvcr.io/nvidia/tensorrt:${b.release}-py3`;
  // The output root, not the engine's version folder: it exists (the configs are written there first).
  const mounts = containerMounts([
    { path: options.onnx, dir: false },
    { path: options.out, dir: true },
  ]);
  const inContainer = `docker run --gpus all --rm --user "$(id -u):$(id -g)" ${mounts} ${image} ${command}`;
  return {
    command,
    args,
    steps: autocast ? [quote(autocast), command] : [command],
    docker: autocast ? [quote(autocast), inContainer] : [inContainer],
  };
}

const HEADER = "# Generated by `pnpm trt:plan` (tooling/src/trt-plan-recipe.ts); see models/gpu/README.md.";

/** Triton's config.pbtxt for the engine. */
function tritonConfigText(b: BuildInputs, config: ModelConfig, batch: { min: number; opt: number; max: number }) {
  const { release, tensorrt, fp16, ioFp16 } = b;
  const ioType = ioFp16 ? DataType.TYPE_FP16 : undefined;
  const precision = !fp16 ? "" : tensorrt >= 11 ? ", FP16 by ModelOpt AutoCast" : ", --fp16";
  return `${HEADER}
# The TensorRT engine built by trtexec from ${basename(b.options.onnx)} (profile batch ${batch.min}/${batch.opt}/${batch.max}${precision}${ioFp16 ? ", FP16 I/O" : ""}),
# served by a real Triton: tritonserver --model-repository=<this folder's parent> --grpc-port 8101.
# The engine goes in 1/model.plan (not committed; build it with the same TensorRT as that Triton:
# release ${release}, TensorRT ${tensorrt}.x, e.g. nvcr.io/nvidia/tensorrt:${release}-py3 and tritonserver:${release}-py3).
name: "${b.tritonModel}"
platform: "tensorrt_plan"
backend: "tensorrt"
max_batch_size: ${config.maxBatchSize}
${tensors("input", config.input, ioType)}
${tensors("output", config.output, ioType)}
${dynamicBatching(config)}
instance_group [
  {
    count: ${b.options.instances ?? 1}
    kind: KIND_GPU
    gpus: [ 0 ]
  }
]
`;
}

/** The bridge model's config.pbtxt: the ensemble's inference step, forwarded to the engine in Triton. */
function bridgeConfigText(b: BuildInputs, config: ModelConfig, bridgeModel: string) {
  const { tritonModel, ioFp16 } = b;
  return `${HEADER}
# The ensemble's inference step, run by TensorRT in a real Triton: the bridge
# forwards each batch whole over KServe v2 gRPC to "${tritonModel}" at the endpoint.
# Change "endpoint" to where that Triton's gRPC port is.${ioFp16 ? "\n# The engine's inputs and outputs are FP16: the bridge converts FP32 <-> FP16 (fp16_conversion)." : ""}
name: "${bridgeModel}"
backend: "typescript"
max_batch_size: ${config.maxBatchSize}
${tensors("input", config.input)}
${tensors("output", config.output)}
${param("module", "@trellis/inference-trt-bridge")}
${param("endpoint", b.options.endpoint ?? DEFAULT_ENDPOINT)}
${param("remote_model_name", tritonModel)}
${param("timeout_ms", "30000")}
${param("ready_timeout_ms", "60000")}
${param("fp16_conversion", String(ioFp16))}
`;
}

/** The ensemble's config.pbtxt with its inference step replaced by the bridge. */
function ensembleConfigText(
  ensemble: ModelConfig,
  ensembleModel: string,
  config: ModelConfig,
  bridgeModel: string,
  step: readonly ModelEnsembling_Step[],
  rename: (name: string) => string = (name) => name,
) {
  const renameKeys = (m: Record<string, string>) =>
    Object.fromEntries(Object.entries(m).map(([k, v]) => [rename(k), v]));
  // The bridge's tensors carry the remote's names (input__0...), so the step's maps' keys follow them.
  const steps = step.map((s) =>
    s.modelName === config.name
      ? { ...s, modelName: bridgeModel, inputMap: renameKeys(s.inputMap), outputMap: renameKeys(s.outputMap) }
      : s,
  );
  return `${HEADER}
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
}

/** Triton's config.pbtxt for a Torch-TensorRT or TF-TRT model: its platform, its tensor names, its file. */
function frameworkTritonConfigText(
  b: BuildInputs & { workflow: Exclude<TrtWorkflow, "trtexec"> },
  remote: ModelConfig,
  batch: { min: number; opt: number; max: number },
) {
  const rules = WORKFLOW_RULES[b.workflow];
  const tool = b.workflow === "torch-trt" ? "Torch-TensorRT (torch_tensorrt.compile)" : "TF-TRT (TrtGraphConverterV2)";
  const naming =
    b.workflow === "torch-trt"
      ? "# TorchScript keeps no tensor names: Triton's PyTorch backend names them <name>__<index>, in forward()'s order."
      : "# The tensors carry the SavedModel's serving_default signature names.";
  const ioType = b.ioFp16 ? DataType.TYPE_FP16 : undefined;
  return `${HEADER}
# ResNet-50 optimised by ${tool} (batch ${batch.min}/${batch.opt}/${batch.max}${b.fp16 ? ", FP16" : ", FP32"}${b.ioFp16 ? ", FP16 I/O" : ""}),
# served by a real Triton: tritonserver --model-repository=<this folder's parent> --grpc-port 8101.
${naming}
# Triton loads 1/${rules.modelFile} (not committed; the build script writes it, in the
# ${rules.container(b.release)} container, served by tritonserver:${b.release}-py3: same release).
name: "${b.tritonModel}"
platform: "${rules.platform}"
backend: "${rules.backend}"
max_batch_size: ${remote.maxBatchSize}
${tensors("input", remote.input, ioType)}
${tensors("output", remote.output, ioType)}
${dynamicBatching(remote)}
instance_group [
  {
    count: ${b.options.instances ?? 1}
    kind: KIND_GPU
    gpus: [ 0 ]
  }
]
`;
}

/** The Torch-TensorRT or TF-TRT build: the script and how to run it, bare and in the framework container. */
function frameworkBuild(
  b: BuildInputs & { workflow: Exclude<TrtWorkflow, "trtexec"> },
  config: ModelConfig,
  batch: { min: number; opt: number; max: number },
) {
  const versionDir = dirname(b.enginePath);
  const scriptInputs = {
    versionDir,
    itemDims: config.input[0]!.dims.map(Number),
    batch,
    fp16: b.fp16,
    ioFp16: b.ioFp16,
  };
  const text = b.workflow === "torch-trt" ? torchTrtScript(scriptInputs) : tfTrtScript(scriptInputs);
  const path = join("recipes", `${b.tritonModel}.py`);
  const scriptPath = join(b.options.out, path);
  const command = ["python", scriptPath].map(shellQuote).join(" ");
  const image = WORKFLOW_RULES[b.workflow].container(b.release);
  // HOME=/tmp: as the caller's user the container has no writable home for the weights' download cache.
  // The script and what it writes are both under the output root.
  const mounts = containerMounts([{ path: b.options.out, dir: true }]);
  const inContainer = `docker run --gpus all --rm --user "$(id -u):$(id -g)" -e HOME=/tmp ${mounts} ${image} ${command}`;
  return { script: { path, text }, command, args: [scriptPath], steps: [command], docker: [inContainer] };
}

/** The workflow, checked, and the names Triton gives the model's tensors under it. */
function workflowOf(options: TrtPlanOptions, config: ModelConfig, ioFp16: boolean) {
  const workflow = options.workflow ?? "trtexec";
  if (!TRT_WORKFLOWS.includes(workflow)) {
    throw new TrtPlanError(`workflow must be one of ${TRT_WORKFLOWS.join(", ")}, got ${workflow}`);
  }
  if (workflow === "trtexec") return { workflow, remote: config };
  if (workflow === "tf-trt" && ioFp16) {
    throw new TrtPlanError("--io-fp16: the tf-trt recipe's signature is FP32 (TF-TRT keeps it); drop --io-fp16");
  }
  if (config.input.length !== 1 || config.input[0]!.dims.length !== 3) {
    throw new TrtPlanError(
      `${options.config}: the ${workflow} recipe builds ResNet-50 from one CHW image input, got ${config.input.length} input(s)`,
    );
  }
  const names = remoteTensorNames(
    workflow,
    config.input.map((t) => t.name),
    config.output.map((t) => t.name),
  );
  if (!names) {
    throw new TrtPlanError(`${options.config}: the ${workflow} recipe's signature has one input and one output`);
  }
  const remote: ModelConfig = {
    ...config,
    input: config.input.map((t, i) => ({ ...t, name: names.inputs[i]! })),
    output: config.output.map((t, i) => ({ ...t, name: names.outputs[i]! })),
  };
  return { workflow, remote };
}

/** Computes the command and the files; writes nothing. */
export async function planTrt(options: TrtPlanOptions): Promise<TrtPlan> {
  const { release, tensorrt } = tensorRtOf(options);
  const fp16 = options.fp16 !== false;
  const ioFp16 = options.ioFp16 === true;
  if (ioFp16 && !fp16) throw new TrtPlanError("--io-fp16 builds an FP16 engine; drop --no-fp16");
  const ws = options.workspaceMiB;
  if (ws !== undefined && (!Number.isInteger(ws) || ws < 1)) {
    throw new TrtPlanError(`workspace must be a positive integer (MiB), got ${ws}`);
  }
  const config = await loadModelConfig(options.config);
  const ensemble = await loadModelConfig(options.ensemble);
  const batch = batchProfile(options, config.maxBatchSize);
  const step = ensemble.schedulingChoice.case === "ensembleScheduling" ? ensemble.schedulingChoice.value.step : [];
  if (!step.some((s) => s.modelName === config.name)) {
    throw new TrtPlanError(
      `${options.ensemble}: no ensemble step runs ${config.name} (steps: ${step.map((s) => s.modelName).join(", ") || "none"})`,
    );
  }
  const { workflow, remote } = workflowOf(options, config, ioFp16);
  const rules = WORKFLOW_RULES[workflow];

  const tritonModel = options.tritonModel ?? TRT_NAMES.tritonModel.replace(/_trt$/, rules.suffix);
  const bridgeModel = `${config.name}${rules.suffix}`;
  const ensembleModel = `${ensemble.name}${rules.suffix}`;
  const enginePath = join(options.out, TRT_NAMES.tritonDir, tritonModel, "1", rules.modelFile);

  const shapes: TrtPlan["shapes"] = {};
  for (const input of config.input) {
    shapes[input.name] = {
      min: shapeOf(input, batch.min, options.config),
      opt: shapeOf(input, batch.opt, options.config),
      max: shapeOf(input, batch.max, options.config),
    };
  }
  const inputs: BuildInputs = { options, release, tensorrt, fp16, ioFp16, tritonModel, enginePath, shapes };
  const framework = workflow === "trtexec" ? undefined : { ...inputs, workflow };
  const tritonConfig = framework
    ? frameworkTritonConfigText(framework, remote, batch)
    : tritonConfigText(inputs, config, batch);
  const bridgeConfig = bridgeConfigText(inputs, remote, bridgeModel);
  const localToRemote = new Map(
    [...config.input, ...config.output].map((t, i) => [t.name, [...remote.input, ...remote.output][i]!.name]),
  );
  const ensembleConfig = ensembleConfigText(
    ensemble,
    ensembleModel,
    config,
    bridgeModel,
    step,
    (name) => localToRemote.get(name) ?? name,
  );
  const frameworkSteps = framework ? frameworkBuild(framework, config, batch) : undefined;
  const build = frameworkSteps ?? buildCommands(inputs);

  return {
    workflow,
    release,
    tensorrt,
    ...build,
    enginePath,
    shapes,
    files: [
      { path: join(TRT_NAMES.tritonDir, tritonModel, "config.pbtxt"), text: tritonConfig },
      { path: join(TRT_NAMES.tritonDir, tritonModel, "1", ".gitkeep"), text: "" },
      { path: join(TRT_NAMES.trellisDir, bridgeModel, "config.pbtxt"), text: bridgeConfig },
      { path: join(TRT_NAMES.trellisDir, bridgeModel, "1", ".gitkeep"), text: "" },
      { path: join(TRT_NAMES.trellisDir, ensembleModel, "config.pbtxt"), text: ensembleConfig },
      { path: join(TRT_NAMES.trellisDir, ensembleModel, "1", ".gitkeep"), text: "" },
      ...(frameworkSteps ? [frameworkSteps.script] : []),
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
