/**
 * The seed's `resnet50_postprocess` (Python backend, NumPy) as a TS stage:
 * logits -> softmax -> top-k -> labels -> one JSON string per batch item,
 * plus Triton's classification extension on the same probabilities.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { type ModelConfig, type ModelStatistics, parseModelConfig } from "@trellis/protocol";
import { type ModelRuntime, serveDefinition } from "@trellis/runtime";
import {
  bytesTensor,
  Code,
  configParameter,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  metadataFromConfig,
  nowNs,
  type ParameterValue,
  type RequestOutcome,
  type Stage,
  type StageDefinition,
  StageError,
  type StageFactoryOptions,
  type StageLogger,
  type StageMetadata,
  StatisticsRecorder,
  type Tensor,
  traceExecution,
} from "@trellis/stage";
import { checkInferRequest, type ModelConfigSource, modelConfigOf, modelFilePath } from "@trellis/stage/backend";
import { cFixed6, pyJsonFloatList, pyJsonStringList } from "./format.js";
import { loadLabels } from "./labels.js";
import { softmaxRowF32, topKAsNumpy } from "./softmax.js";

export const DEFAULT_INPUT = "LOGITS";
export const DEFAULT_OUTPUT = "OUTPUT_RESULTS";
export const DEFAULT_LABEL_FILE = "imagenet_classes.txt";
export const DEFAULT_TOP_K = 5;

export interface PostprocessOptions {
  /**
   * The model's config.pbtxt, parsed or as text: names, max_batch_size, parameters (`top_k`),
   * `label_filename`. Default: the seed's (LOGITS FP32 [classes] → OUTPUT_RESULTS, max_batch_size 256).
   */
  config?: ModelConfigSource;
  version?: string;
  /** `<repository>/<model>`: where Triton resolves an output's `label_filename`. */
  modelDir?: string;
  /** `<repository>/<model>/<version>`: where the seed kept `imagenet_classes.txt`. */
  versionDir?: string;
  /** Labels given directly; then no file is read. */
  labels?: readonly string[];
  /** A label file (one label a line) to read, when `labels` is not given. */
  labelsFile?: string;
  /** Overrides the config's `top_k` parameter. */
  topK?: number;
  logger?: StageLogger;
}

function parseK(raw: ParameterValue | undefined, what: string, stage: string, max: number, code: Code): number {
  const n = typeof raw === "string" ? Number(raw.trim()) : Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > max) {
    throw new StageError(code, stage, `${what} must be an integer from 1 to ${max}, got ${String(raw)}`);
  }
  return n;
}

async function resolveLabels(options: PostprocessOptions, outputLabelFile: string, stage: string): Promise<string[]> {
  if (options.labels) return [...options.labels];
  // A file the caller's own program names (not a repository's config): read as it is.
  if (options.labelsFile) return loadLabels(options.labelsFile, stage);
  if (outputLabelFile) {
    // Triton resolves label_filename against the model directory; the seed
    // kept its labels in the version folder, so that is tried next.
    // Inside the model's folder whoever wrote the config (a load request's override included).
    const candidates = [options.modelDir, options.versionDir]
      .filter((d): d is string => !!d)
      .map((d) => modelFilePath(d, outputLabelFile, "label_filename", stage));
    const found = candidates.find((p) => existsSync(p)) ?? candidates[0];
    if (!found)
      throw new StageError(Code.NotFound, stage, `label_filename ${outputLabelFile}: no model directory given`);
    return loadLabels(found, stage);
  }
  if (!options.versionDir) {
    throw new StageError(Code.NotFound, stage, `no labels: pass labels or a versionDir holding ${DEFAULT_LABEL_FILE}`);
  }
  return loadLabels(join(options.versionDir, DEFAULT_LABEL_FILE), stage);
}

export class PostprocessStage implements Stage {
  readonly name: string;
  readonly version: string;
  readonly inputName: string;
  readonly outputName: string;
  readonly classes: number;
  private readonly stats: StatisticsRecorder;
  private readonly meta: StageMetadata;
  private readonly batching: boolean;
  private readonly labelsKey: string;
  private readonly probsKey: string;
  private closed = false;
  /** The model runtime serving this stage's definition (createPostprocess): infer goes through it. */
  private served: ModelRuntime | undefined;

  constructor(
    readonly config: ModelConfig,
    version: string,
    readonly labels: readonly string[],
    readonly k: number,
  ) {
    this.name = config.name || "postprocess";
    this.version = version;
    this.inputName = config.input[0]?.name || DEFAULT_INPUT;
    this.outputName = config.output[0]?.name || DEFAULT_OUTPUT;
    this.classes = labels.length;
    this.batching = config.maxBatchSize > 0;
    this.labelsKey = `top${k}_labels`;
    this.probsKey = `top${k}_probs`;
    this.stats = new StatisticsRecorder(this.name, version);
    this.meta = metadataFromConfig(config, [version]);
    // A config without tensors (auto-complete) still reports what we serve.
    if (this.meta.inputs.length === 0) {
      this.meta.inputs.push({ name: this.inputName, datatype: "FP32", shape: this.dims([this.classes]) });
    }
    if (this.meta.outputs.length === 0) {
      this.meta.outputs.push({ name: this.outputName, datatype: "BYTES", shape: this.dims([1]) });
    }
  }

  private dims(d: number[]): number[] {
    return this.batching ? [-1, ...d] : d;
  }

  isReady(): boolean {
    return !this.closed;
  }

  metadata(): StageMetadata {
    return this.meta;
  }

  statistics(): ModelStatistics {
    return this.served ? this.served.statistics() : this.stats.snapshot();
  }

  /** Requests waiting in its model runtime's queue. */
  pendingRequests(): number {
    return this.served?.pendingRequests?.() ?? 0;
  }

  async close(): Promise<void> {
    if (this.served) await this.served.close();
    this.closed = true;
  }

  /** Serves this stage's definition by the model runtime from now on (createPostprocess does). */
  async serve(): Promise<this> {
    this.served ??= await serveDefinition(this.definition());
    return this;
  }

  private fail(message: string): StageError {
    return new StageError(Code.InvalidArgument, this.name, message);
  }

  /** Checks the request; returns the logits, the batch size, and k for a classification request (0 = JSON). */
  private validate(request: InferRequest): { logits: Float32Array; n: number; classify: number } {
    const n = checkInferRequest(request, {
      model: this.name,
      maxBatchSize: this.config.maxBatchSize,
      inputs: [{ name: this.inputName, datatype: "FP32", dims: [this.classes] }],
      outputs: [this.outputName],
    });
    const input = request.inputs[0]!;
    let classify = 0;
    for (const o of request.outputs ?? []) {
      const c = o.parameters?.classification;
      if (c !== undefined) {
        classify = parseK(c, `output ${o.name}: classification`, this.name, this.classes, Code.InvalidArgument);
      }
    }
    return { logits: input.data as Float32Array, n, classify };
  }

  /**
   * Postprocesses N rows of logits: one seed-format JSON per row, or with
   * `classify` = k, k "<prob>:<index>:<label>" strings per row.
   */
  run(logits: Float32Array, n: number, classify = 0): string[] {
    const c = this.classes;
    const probs = new Float32Array(c);
    const out: string[] = [];
    for (let row = 0; row < n; row++) {
      const bad = softmaxRowF32(logits, row, c, probs);
      if (bad >= 0) {
        throw this.fail(
          `input ${this.inputName}: batch item ${row} has a non-finite logit (${logits[row * c + bad]}) at class ${bad}`,
        );
      }
      if (classify > 0) {
        for (const i of topKAsNumpy(probs, classify)) out.push(`${cFixed6(probs[i]!)}:${i}:${this.labels[i]}`);
      } else {
        const top = topKAsNumpy(probs, this.k);
        out.push(
          `{"${this.labelsKey}": ${pyJsonStringList(top.map((i) => this.labels[i]!))}, "${this.probsKey}": ${pyJsonFloatList(top.map((i) => probs[i]!))}}`,
        );
      }
    }
    return out;
  }

  infer(request: InferRequest, options: InferOptions = {}): Promise<InferResponse> {
    return this.served ? this.served.infer(request, options) : this.answer(request, options);
  }

  /**
   * What this stage computes, for the model runtime (Triton's `execute(requests)`): each request
   * of a batch answered on its own, so a row with a non-finite logit fails only its request.
   */
  definition(): StageDefinition {
    return {
      config: this.config,
      version: this.version,
      metadata: () => this.meta,
      execute: (requests, options) => requests.map((request) => this.outcome(request, options ?? {})),
      isReady: () => !this.closed,
      close: () => {
        this.closed = true;
      },
    };
  }

  private outcome(request: InferRequest, options: InferOptions): RequestOutcome {
    try {
      return this.outputs(request, options);
    } catch (err) {
      return err instanceof Error ? err : new StageError(Code.Internal, this.name, String(err));
    }
  }

  /** One request's output tensor (it throws a StageError naming what was wrong). */
  private outputs(request: InferRequest, options: InferOptions): Tensor[] {
    if (this.closed) throw new StageError(Code.Unavailable, this.name, "model is unloaded");
    if (options.signal?.aborted) throw new StageError(Code.Canceled, this.name, "request cancelled");
    const { logits, n, classify } = this.validate(request);
    const strings = this.run(logits, n, classify);
    const width = classify > 0 ? classify : 1;
    const shape = this.batching ? [n, width] : [width];
    return [bytesTensor(this.outputName, shape, strings)];
  }

  private async answer(request: InferRequest, options: InferOptions): Promise<InferResponse> {
    const start = nowNs();
    try {
      const outputs = this.outputs(request, options);
      const n = this.batching ? (outputs[0]?.shape[0] ?? 1) : 1;
      const { endNs, times } = this.stats.ranAlone(start, n);
      traceExecution(options.trace, start, start, endNs, times);
      return { id: request.id, modelName: this.name, modelVersion: this.version, outputs };
    } catch (err) {
      this.stats.requestFailed(nowNs() - start);
      throw err;
    }
  }
}

/** The seed's postprocess config, for `classes` logits. */
function defaultConfig(classes: number): ModelConfig {
  return parseModelConfig(
    `name: "postprocess"
backend: "typescript"
max_batch_size: 256
input [ { name: "${DEFAULT_INPUT}" data_type: TYPE_FP32 dims: [ ${classes} ] } ]
output [ { name: "${DEFAULT_OUTPUT}" data_type: TYPE_STRING dims: [ 1 ] } ]`,
    "(default postprocess config)",
  );
}

/** Loads the labels, checks them against the config, and makes the stage (not yet served). */
async function buildPostprocess(options: PostprocessOptions): Promise<PostprocessStage> {
  const given = options.config === undefined ? undefined : modelConfigOf(options.config, "postprocess");
  const stage = given?.name || "postprocess";
  const output = given?.output[0];
  const labels = await resolveLabels(options, output?.labelFilename ?? "", stage);
  const config = given ?? defaultConfig(labels.length);
  const input = config.input[0];
  const dims = input?.dims.map(Number) ?? [];
  const declared = dims.length > 0 ? dims[dims.length - 1]! : -1;
  if (labels.length === 0) throw new StageError(Code.InvalidArgument, stage, "the label file holds no labels");
  if (declared > 0 && declared !== labels.length) {
    throw new StageError(
      Code.InvalidArgument,
      stage,
      `label count ${labels.length} does not match the ${declared} classes of input ${input?.name || DEFAULT_INPUT}`,
    );
  }
  const k =
    options.topK !== undefined
      ? parseK(options.topK, "top_k", stage, labels.length, Code.InvalidArgument)
      : parseK(
          configParameter(config, "top_k") ?? DEFAULT_TOP_K,
          "parameter top_k",
          stage,
          labels.length,
          Code.InvalidArgument,
        );
  const s = new PostprocessStage(config, options.version ?? "1", labels, k);
  options.logger?.info({ model: stage, labels: labels.length, topK: k }, "postprocess stage loaded");
  return s;
}

/**
 * The postprocess stage in process: labels loaded and checked against the config, served by the
 * model runtime as the server serves it (request checks, batching as its config says).
 */
export async function createPostprocess(options: PostprocessOptions): Promise<PostprocessStage> {
  return (await buildPostprocess(options)).serve();
}

/** The StageFactory entry point (`backend: "typescript"`, parameter module = @trellis/postprocess): what it computes. */
export async function createStage(options: StageFactoryOptions): Promise<StageDefinition> {
  const stage = await buildPostprocess({
    config: options.config,
    version: options.version,
    modelDir: options.modelDir,
    versionDir: options.versionDir,
    logger: options.logger,
  });
  return stage.definition();
}
