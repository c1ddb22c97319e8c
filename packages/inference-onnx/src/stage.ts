/**
 * The onnxruntime backend: Triton's onnxruntime backend for the Trellis model
 * runtime. One session per instance, each in its own worker thread; it only
 * computes the batches the runtime forms (the repository loader serves it:
 * checks, batching, instances and statistics are the runtime's).
 */
import { existsSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";
import type { ModelConfig } from "@trellis/protocol";
import {
  type BatchingStrategy,
  configBatchingStrategy,
  definitionBackend,
  type ModelBackend,
  type ModelRuntime,
  serveDefinition,
} from "@trellis/runtime";
import {
  Code,
  type CpuGate,
  type DataType,
  datatypeFromConfig,
  elementCount,
  formatShape,
  metadataFromConfig,
  nowNs,
  type Stage,
  type StageDefinition,
  StageError,
  type StageFactoryOptions,
  type StageLogger,
  type StageMetadata,
  type Tensor,
  type TensorData,
} from "@trellis/stage";
import {
  allocate,
  bytesOf,
  elementSize,
  framedElements,
  frameElements,
  type ModelConfigSource,
  modelConfigOf,
  modelFilePath,
  randomData,
  resourceExhausted,
  viewAs,
} from "@trellis/stage/backend";
import { autoCompleteConfig, checkConfigAgainstModel, datatypeFromOrt, ortTypeOf } from "./model.js";
import { readOnnxMetadataProps, readOverridableInitializers } from "./onnx-file.js";
import { exclusiveCpu, exclusiveCpuMaxWaitMs, planInstances, sessionOptions } from "./options.js";
import type { WireTensor } from "./protocol.js";
import { SessionWorker } from "./session-worker.js";

export interface OnnxStageOptions {
  /**
   * The model's config.pbtxt, parsed or as text; default empty. Sections it leaves out are
   * completed from the model unless strictModelConfig is true.
   */
  config?: ModelConfigSource;
  /** `<repository>/<model>`, holding `<version>/model.onnx` (or the config's default_model_filename). */
  modelDir?: string;
  /** The .onnx file itself, instead of modelDir's layout. */
  modelPath?: string;
  /** Version being served; default "1". */
  version?: string;
  /** Folder holding the model file; default `<modelDir>/<version>`. */
  versionDir?: string;
  logger?: StageLogger;
  /**
   * Triton's --strict-model-config. False (the default, as the seed's Triton
   * ran) fills a config's missing input/output sections from the model.
   */
  strictModelConfig?: boolean;
  /** max_batch_size auto-complete gives a batchable model whose config has none (Triton: 4). */
  defaultMaxBatchSize?: number;
  /** The server's CPU gate: with exclusive_cpu, each run holds it alone; absent: runs are not gated. */
  cpuGate?: CpuGate;
}

/** A loaded ONNX model: what the model runtime serves it with. @deprecated Use createStage (a StageDefinition) or createOnnxStage (a ready Stage). */
export interface OnnxModel {
  /** The config served: as given, or completed from the model (strictModelConfig false). */
  readonly config: ModelConfig;
  readonly version: string;
  /** The model carries Trellis's synthetic marker: its weights are random and its predictions meaningless. */
  readonly synthetic: boolean;
  /** The ONNX file loaded. */
  readonly modelPath: string;
  /** Its sessions as the runtime's backend: one instance a worker, computing merged batches. */
  readonly backend: ModelBackend;
  /** How the runtime's dynamic batcher forms its batches (parameter batching_strategy). */
  readonly strategy: BatchingStrategy;
}

/** What an ONNX model computes, for the model runtime: one session per instance, each in a worker thread. */
export interface OnnxDefinition extends StageDefinition {
  /** The config served: as given, or completed from the model (strictModelConfig false). */
  readonly config: ModelConfig;
  readonly version: string;
  /** One per session started. */
  readonly instances: number;
  /** The model carries Trellis's synthetic marker: its weights are random and its predictions meaningless. */
  readonly synthetic: boolean;
  /** The ONNX file loaded. */
  readonly modelPath: string;
}

/** An ONNX model served in process by the model runtime (request checks, dynamic batching, instances). */
export interface OnnxStage extends Stage {
  /** The model carries Trellis's synthetic marker: its weights are random and its predictions meaningless. */
  readonly synthetic: boolean;
  /** The ONNX file loaded. */
  readonly modelPath: string;
  /** Requests in the dynamic batcher's queue (executing ones not counted). */
  pendingRequests(): number;
}

/** ONNX metadata_props key (or version-folder file) that marks a synthetic model (`pnpm models:synth`). */
export const SYNTHETIC_METADATA_KEY = "trellis.synthetic";
export const SYNTHETIC_MARKER_FILE = "SYNTHETIC";

async function resolveModelPath(stage: string, versionDir: string, filename: string): Promise<string> {
  let path = modelFilePath(versionDir, filename, "default_model_filename", stage);
  let info = await stat(path).catch(() => undefined);
  // Triton also accepts a directory holding model.onnx (models with external data).
  if (info?.isDirectory()) {
    path = join(path, "model.onnx");
    info = await stat(path).catch(() => undefined);
  }
  if (!info?.isFile()) {
    throw new StageError(
      Code.NotFound,
      stage,
      `no model file ${filename} in version ${basename(versionDir)} (default_model_filename); run pnpm models:fetch or pnpm models:synth`,
    );
  }
  return path;
}

/**
 * String elements ONNX Runtime may hold at once, over every ONNX model of this process.
 * Its string tensors are string[] (one JS string, then one std::string, per element,
 * ~100 bytes each, input and output), so ten million short strings cost about a
 * gigabyte in the session's thread: an execution past this budget is refused
 * (RESOURCE_EXHAUSTED) rather than let run the process out of memory. It admits
 * any one request the default 64 MiB message limit lets in (at most 2^24 elements
 * of 4 bytes each).
 */
const MAX_STRING_ELEMENTS_IN_FLIGHT = 2 ** 24;
let stringElementsInFlight = 0;

/** Takes `count` string elements from the budget, or refuses; the returned function gives them back. */
function takeStringBudget(stage: string, count: number): () => void {
  if (count === 0) return () => {};
  if (stringElementsInFlight + count > MAX_STRING_ELEMENTS_IN_FLIGHT) {
    throw resourceExhausted(
      stage,
      `string inputs of ${count} elements do not fit: ${stringElementsInFlight} of at most ${MAX_STRING_ELEMENTS_IN_FLIGHT} string elements are in ONNX Runtime now; retry later`,
    );
  }
  stringElementsInFlight += count;
  return () => {
    stringElementsInFlight -= count;
  };
}

/** Our tensor → a worker tensor whose buffer the worker may take. */
function toWire(t: Tensor, owned: boolean, worker: SessionWorker): WireTensor {
  const type = ortTypeOf(t.datatype);
  if (t.datatype === "BYTES") {
    // Framed into one buffer (already framed when packed as it came off the wire): one copy, no per-element objects.
    return { name: t.name, type, dims: t.shape, data: worker.copyIn(frameElements(t.data as Uint8Array[])) };
  }
  const data = t.data as Exclude<TensorData, Uint8Array[]>;
  // A buffer we do not own (a view into a gRPC message, a caller's array) is copied, not transferred away.
  const whole = owned && data.byteOffset === 0 && data.byteLength === data.buffer.byteLength;
  return { name: t.name, type, dims: t.shape, data: whole ? data : worker.copyIn(data) };
}

function fromWire(stage: string, w: WireTensor): Tensor {
  const datatype = datatypeFromOrt(w.type);
  if (!datatype) throw new StageError(Code.Internal, stage, `output ${w.name}: unsupported ORT type ${w.type}`);
  if (datatype === "BYTES") {
    const framed = w.data as Uint8Array;
    return { name: w.name, datatype, shape: w.dims, data: framedElements(framed, elementCount(w.dims)) };
  }
  const view = w.data as ArrayBufferView;
  const data = viewAs(datatype, new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
  return { name: w.name, datatype, shape: w.dims, data } as Tensor;
}

/**
 * Triton's `reshape`: the shape a tensor has for the model, from the shape it has for
 * clients (config dims), and back, for each tensor the config reshapes.
 */
function reshaper(config: ModelConfig) {
  const batching = config.maxBatchSize > 0;
  const table = (list: ModelConfig["input"] | ModelConfig["output"]) =>
    new Map(
      list.flatMap((c) =>
        c.reshape ? [[c.name, { dims: c.dims.map(Number), model: c.reshape.shape.map(Number) }]] : [],
      ),
    );
  const inputs = table(config.input);
  const outputs = table(config.output);
  const lead = (shape: readonly number[]) => (batching ? shape.slice(0, 1) : []);
  return {
    /** A feed's dims as the model takes them. */
    toModel: (name: string, shape: number[]): number[] => {
      const r = inputs.get(name);
      return r ? [...lead(shape), ...r.model] : shape;
    },
    /** An output's shape as clients see it. */
    fromModel: (name: string, shape: number[]): number[] => {
      const r = outputs.get(name);
      return r ? [...lead(shape), ...r.dims] : shape;
    },
  };
}

/** A KIND_GPU instance this machine cannot run, in one line that says what to change. */
function noGpu(name: string, plan: { deviceId: number; executionProviders: readonly string[] }): StageError {
  return new StageError(
    Code.Unavailable,
    name,
    `instance_group KIND_GPU (device ${plan.deviceId}): no GPU that onnxruntime's ${plan.executionProviders.join(",")} execution provider can use on this machine; set kind: KIND_CPU (or KIND_AUTO) in config.pbtxt to run on the CPU`,
  );
}

/**
 * Whether onnxruntime-node carries the provider libraries these execution providers need. Its
 * install script fetches the CUDA provider only where it can (and ONNXRUNTIME_NODE_INSTALL=skip
 * skips it); asked for a provider it lacks, onnxruntime prints its own error line before failing.
 * Only CUDA on Linux is known here; anything else is left to onnxruntime to say.
 */
function executionProvidersInstalled(providers: readonly string[]): boolean {
  if (process.platform !== "linux" || !providers.includes("cuda")) return true;
  const dist = dirname(createRequire(import.meta.url).resolve("onnxruntime-node"));
  return existsSync(join(dist, "..", "bin", "napi-v6", "linux", process.arch, "libonnxruntime_providers_cuda.so"));
}

/** One warmup sample's feeds (fresh buffers each call: they are transferred). */
async function warmupFeeds(config: ModelConfig, index: number, versionDir: string): Promise<WireTensor[]> {
  const w = config.modelWarmup[index]!;
  const batch = config.maxBatchSize > 0 ? [Math.max(1, w.batchSize)] : [];
  const feeds: WireTensor[] = [];
  for (const [name, spec] of Object.entries(w.inputs)) {
    const datatype: DataType = datatypeFromConfig(spec.dataType);
    const item = spec.dims.map(Number);
    const shape = [...batch, ...item];
    const count = elementCount(shape);
    const choice = spec.inputDataType;
    if (datatype === "BYTES") {
      const element = new TextEncoder().encode(choice.case === "randomData" ? "trellis-warmup" : "");
      const data = frameElements(new Array<Uint8Array>(count).fill(element));
      feeds.push({ name, type: "string", dims: shape, data });
      continue;
    }
    const data = (choice.case === "randomData" ? randomData(datatype, count) : allocate(datatype, count)) as Exclude<
      TensorData,
      Uint8Array[]
    >;
    if (choice.case === "inputDataFile") {
      // Triton reads <version>/warmup/<file> as one item's bytes, repeated for each batch item.
      const file = await readFile(
        modelFilePath(join(versionDir, "warmup"), choice.value, "model_warmup input_data_file", config.name),
      );
      const itemBytes = elementCount(item) * elementSize(datatype);
      if (file.byteLength !== itemBytes) {
        throw new Error(
          `warmup file ${choice.value}: ${datatype} ${formatShape(item)} needs ${itemBytes} bytes, got ${file.byteLength}`,
        );
      }
      const bytes = bytesOf(data);
      for (let b = 0; b < (batch[0] ?? 1); b++) bytes.set(file, b * itemBytes);
    }
    feeds.push({ name, type: ortTypeOf(datatype), dims: shape, data });
  }
  return feeds;
}

/** Where the model file is, its name, version and version folder, from the options. */
async function locate(options: OnnxStageOptions, given: ModelConfig) {
  const version = options.version ?? "1";
  if (options.modelPath) {
    const versionDir = options.versionDir ?? dirname(options.modelPath);
    const name = given.name || basename(options.modelPath).replace(/\.onnx$/i, "");
    // A path the caller gave in its own program (not a repository's config): taken as it is.
    if (!(await stat(options.modelPath).catch(() => undefined))?.isFile()) {
      throw new StageError(Code.NotFound, name, `no model file ${basename(options.modelPath)}`);
    }
    return { version, versionDir, name, modelPath: options.modelPath };
  }
  if (!options.modelDir) {
    throw new StageError(Code.InvalidArgument, given.name || "onnx", "give modelPath (the .onnx file) or modelDir");
  }
  const versionDir = options.versionDir ?? join(options.modelDir, version);
  const name = given.name || basename(options.modelDir);
  const modelPath = await resolveModelPath(name, versionDir, given.defaultModelFilename || "model.onnx");
  return { version, versionDir, name, modelPath };
}

/** One session per instance_group instance, each in a worker thread; all started, or none. */
async function startSessions(name: string, given: ModelConfig, modelPath: string) {
  const plans = planInstances(given);
  const cpuInstances = plans.filter((p) => p.kind === "CPU").length;
  const instanceOptions = plans.map((plan) => sessionOptions(given, plan, cpuInstances));
  // Runs hold the CPU gate alone when every instance's threads cover every core.
  const exclusive = plans.every((plan, i) => exclusiveCpu(given, plan, instanceOptions[i]!.intraOpNumThreads));
  const gpuWithoutProvider = plans.find((p) => p.kind === "GPU" && !executionProvidersInstalled(p.executionProviders));
  if (gpuWithoutProvider) throw noGpu(name, gpuWithoutProvider);
  const started = await Promise.allSettled(
    plans.map((_, i) => SessionWorker.start(name, { modelPath, sessionOptions: instanceOptions[i]! })),
  );
  const workers = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const failedAt = started.findIndex((s) => s.status === "rejected");
  if (failedAt >= 0) {
    await Promise.all(workers.map((w) => w.close()));
    const plan = plans[failedAt]!;
    const reason = (started[failedAt] as PromiseRejectedResult).reason;
    const message = reason instanceof Error ? reason.message : String(reason);
    // One line an operator can act on, not onnxruntime's own words (a shared library it could not load).
    if (plan.kind === "GPU") throw noGpu(name, plan);
    throw new StageError(Code.Internal, name, `onnxruntime could not load ${basename(modelPath)}: ${message}`);
  }
  return { workers, exclusive };
}

/** The config served: as given, or completed from the model; checked against the model's tensors. */
async function servedConfig(
  name: string,
  given: ModelConfig,
  worker: SessionWorker,
  modelPath: string,
  options: OnnxStageOptions,
): Promise<{ config: ModelConfig; initializerInputs: Set<string> }> {
  // A config input the session does not list may be an initializer a request can override: the
  // file is read for those only then.
  const unlisted = given.input.some((c) => !worker.inputs.some((m) => m.name === c.name));
  const overridable = unlisted ? await readOverridableInitializers(modelPath) : [];
  const io = { inputs: worker.inputs, outputs: worker.outputs, overridable };
  const config = options.strictModelConfig ? given : autoCompleteConfig(given, io, options);
  if (!config.name) config.name = name;
  if (config.input.length === 0 || config.output.length === 0) {
    throw new StageError(
      Code.InvalidArgument,
      name,
      "strict model config needs input and output sections (or load with strictModelConfig: false)",
    );
  }
  checkConfigAgainstModel(config, io);
  const initializerInputs = new Set(
    overridable.filter((t) => config.input.some((c) => c.name === t.name)).map((t) => t.name),
  );
  return { config, initializerInputs };
}

/**
 * A request that gives an input the model holds as an initializer: onnxruntime takes such a feed,
 * but onnxruntime-node passes only the session's listed inputs and would drop it unseen, so the
 * request is refused rather than answered with the initializer's value.
 */
function cannotOverride(model: string, input: string): StageError {
  return new StageError(
    Code.InvalidArgument,
    model,
    `input '${input}' of model '${model}' is an initializer of the ONNX model, which onnxruntime-node cannot override: leave it out to use the model's own value`,
  );
}

/** Warmup runs on every instance before the model reports ready, outside the statistics (as Triton's). */
async function warmUp(config: ModelConfig, workers: SessionWorker[], versionDir: string): Promise<void> {
  const reshape = reshaper(config);
  const outputNames = config.output.map((o) => o.name);
  try {
    for (let i = 0; i < config.modelWarmup.length; i++) {
      const w = config.modelWarmup[i]!;
      for (const worker of workers) {
        for (let n = 0; n < Math.max(1, w.count); n++) {
          const feeds = await warmupFeeds(config, i, versionDir);
          await worker.run(
            feeds.map((f) => ({ ...f, dims: reshape.toModel(f.name, f.dims) })),
            outputNames,
          );
        }
      }
    }
  } catch (err) {
    const warmupName = config.modelWarmup.map((w) => w.name).join(", ");
    throw new StageError(
      Code.Internal,
      config.name,
      `warmup (${warmupName}) failed: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}

/**
 * Loads the ONNX model of `options` (sessions started, config checked, warmed up): what it
 * computes, for the model runtime. Each execution is a merged batch run on the session of its
 * instance; the runtime checks, batches, sequences, rate-limits and counts.
 */
async function loadOnnx(options: OnnxStageOptions): Promise<OnnxDefinition> {
  const given = modelConfigOf(options.config ?? "");
  const { version, versionDir, name, modelPath } = await locate(options, given);
  const log = options.logger;
  const { workers, exclusive } = await startSessions(name, given, modelPath);

  let config: ModelConfig;
  let initializerInputs: Set<string>;
  try {
    ({ config, initializerInputs } = await servedConfig(name, given, workers[0]!, modelPath, options));
  } catch (err) {
    await Promise.all(workers.map((w) => w.close()));
    throw err;
  }

  const props = await readOnnxMetadataProps(modelPath).catch(() => ({}) as Record<string, string>);
  const synthetic = props[SYNTHETIC_METADATA_KEY] === "true" || existsSync(join(versionDir, SYNTHETIC_MARKER_FILE));
  const platform = config.platform || config.backend || "onnxruntime_onnx";
  const metadata: StageMetadata = {
    ...metadataFromConfig(config, [version]),
    platform: synthetic ? `${platform} (synthetic weights)` : platform,
  };
  if (synthetic) {
    log?.warn(
      { model: name, version, path: modelPath },
      "SYNTHETIC model: seeded random weights from pnpm models:synth; its predictions are meaningless (pnpm models:fetch gets the real one)",
    );
  }

  const outputNames = config.output.map((o) => o.name);
  const reshape = reshaper(config);
  const gate = options.cpuGate;
  const maxSharedWaitMs = exclusiveCpuMaxWaitMs(config);
  const close = async () => {
    await Promise.all(workers.map((w) => w.close()));
  };
  const definition: OnnxDefinition = {
    config,
    version,
    instances: workers.length,
    synthetic,
    modelPath,
    ...(exclusive && gate ? { admit: () => gate.tryAcquireExclusive() ?? gate.acquireExclusive(maxSharedWaitMs) } : {}),
    compute: async (batch, _options, execution) => {
      // Outside the runtime (defineStage), every execution goes to the first session.
      const worker = workers[execution?.instance ?? 0]!;
      const t0 = nowNs();
      let strings = 0;
      for (const t of batch.inputs) if (t.datatype === "BYTES") strings += elementCount(t.shape);
      const giveBack = takeStringBudget(name, strings);
      let r: Awaited<ReturnType<SessionWorker["run"]>>;
      try {
        const overriding = initializerInputs.size > 0 && batch.inputs.find((t) => initializerInputs.has(t.name));
        if (overriding) throw cannotOverride(name, overriding.name);
        const feeds = batch.inputs.map((t) => {
          const feed = toWire(t, execution?.ownsInputs ?? false, worker);
          return { ...feed, dims: reshape.toModel(feed.name, feed.dims) };
        });
        const fetches = batch.outputs?.length ? batch.outputs.map((o) => o.name) : outputNames;
        r = await worker.run(feeds, fetches);
      } finally {
        giveBack();
      }
      const outputs = r.outputs.map((w) => fromWire(name, { ...w, dims: reshape.fromModel(w.name, w.dims) }));
      if (execution) {
        Object.assign(execution.times, {
          computeInputNs: r.startNs - t0,
          computeInferNs: r.endNs - r.startNs,
          computeOutputNs: nowNs() - r.endNs,
        });
      }
      return outputs;
    },
    isReady: () => workers.every((w) => w.alive),
    metadata: () => metadata,
    close,
  };

  try {
    await warmUp(config, workers, versionDir);
  } catch (err) {
    await close();
    throw err;
  }
  log?.info(
    {
      model: name,
      version,
      path: modelPath,
      instances: workers.length,
      maxBatchSize: config.maxBatchSize,
      exclusiveCpu: exclusive,
      synthetic,
    },
    "onnxruntime model loaded",
  );
  // sequence_batching's control and state tensors are added by the runtime's sequence batcher.
  return definition;
}

/**
 * The repository loader's entry point, as every stage package's: what the ONNX model of
 * `options` computes (sessions started, config checked, warmed up), for the model runtime to
 * serve. `strictModelConfig` defaults to false here (a library caller's config may leave the
 * tensors out); the server passes its --strict-model-config.
 */
export function createStage(
  options: StageFactoryOptions & { strictModelConfig?: boolean; defaultMaxBatchSize?: number },
): Promise<OnnxDefinition> {
  return loadOnnx(options);
}

/**
 * The ONNX model of `options`, ready to use in process: served by the model runtime as the
 * server serves it (request checks, dynamic batching as its config says, one session per
 * instance_group instance).
 */
export async function createOnnxStage(options: OnnxStageOptions): Promise<OnnxStage> {
  const definition = await loadOnnx(options);
  const runtime: ModelRuntime = await serveDefinition(definition, {
    ...(options.modelDir ? { modelDir: options.modelDir } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
  });
  return Object.assign(runtime, {
    synthetic: definition.synthetic,
    modelPath: definition.modelPath,
    pendingRequests: () => runtime.pendingRequests?.() ?? 0,
  });
}

/**
 * Loads the ONNX model of `options` as the model runtime's backend.
 * @deprecated Use createStage (what the model computes, for serveDefinition or the repository
 * loader) or createOnnxStage (a ready Stage); this stays for one minor version.
 */
export async function createOnnxModel(options: OnnxStageOptions): Promise<OnnxModel> {
  const definition = await loadOnnx(options);
  return {
    config: definition.config,
    version: definition.version,
    synthetic: definition.synthetic,
    modelPath: definition.modelPath,
    backend: definitionBackend(definition, definition.instances),
    strategy: configBatchingStrategy(definition.config),
  };
}
