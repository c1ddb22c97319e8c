/**
 * The preprocess stage: RAW_IMAGE (BYTES [N,1], encoded images) ->
 * PREPROCESSED_IMAGE (FP32 [N,3,224,224] by default). The images of a batch's
 * requests are decoded in parallel on libuv's thread pool (sharp is async); a
 * stage-wide limit caps how many are in flight across requests. Each request is
 * answered on its own: a bad image fails only the request that sent it.
 */
import { DataType as ConfigDataType, type ModelConfig, parseModelConfig } from "@trellis/protocol";
import { type ModelRuntime, serveDefinition } from "@trellis/runtime";
import {
  Code,
  type CpuGate,
  datatypeFromConfig,
  formatShape,
  type InferOptions,
  type InferRequest,
  type RequestOutcome,
  type Stage,
  type StageDefinition,
  StageError,
  type StageFactoryOptions,
  type StageLogger,
  type Tensor,
  tensor,
} from "@trellis/stage";
import {
  checkInferRequest,
  invalidArgument,
  type ModelConfigSource,
  modelConfigOf,
  type RequestSpec,
} from "@trellis/stage/backend";
import { FairLimiter } from "./fair-limiter.js";
import { decodeCrop, ElementError, unwrap } from "./image.js";
import { lookupTables, rowWriter } from "./normalize.js";
import { type PreprocessParameters, parametersFromConfig, resolveParameters } from "./options.js";

export interface PreprocessOptions extends Partial<PreprocessParameters> {
  /** The model's config.pbtxt, parsed or as text; its `parameters` are read, its input/output names used. */
  config?: ModelConfigSource;
  /** Model name when no config is given (default "preprocess"). */
  name?: string;
  version?: string;
  logger?: StageLogger;
  /** The server's CPU gate: decodes hold it shared, so an inference run that takes every core waits for them; absent: ungated. */
  cpuGate?: CpuGate;
}

const DEFAULT_INPUT = "RAW_IMAGE";
const DEFAULT_OUTPUT = "PREPROCESSED_IMAGE";

function outputShape(p: PreprocessParameters): number[] {
  return p.layout === "NCHW" ? [3, p.cropSize, p.cropSize] : [p.cropSize, p.cropSize, 3];
}

/** The config a stage created without one reports: the seed's, with these parameters. */
function defaultConfig(name: string, p: PreprocessParameters): ModelConfig {
  return parseModelConfig(
    `name: ${JSON.stringify(name)}
backend: "typescript"
max_batch_size: 256
input [ { name: "${DEFAULT_INPUT}", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "${DEFAULT_OUTPUT}", data_type: TYPE_${p.outputDatatype}, dims: [ ${outputShape(p).join(", ")} ] } ]`,
    "(default preprocess config)",
  );
}

/** The config must describe what the parameters produce; a mismatch is a load error naming both. */
function checkConfig(config: ModelConfig, p: PreprocessParameters): void {
  const stage = config.name;
  if (config.input.length !== 1 || config.output.length !== 1) {
    throw invalidArgument(
      stage,
      `config needs exactly one input and one output, has ${config.input.length} and ${config.output.length}`,
    );
  }
  const input = config.input[0]!;
  const output = config.output[0]!;
  if (input.dataType !== ConfigDataType.TYPE_STRING) {
    throw invalidArgument(
      stage,
      `config input ${input.name} must be TYPE_STRING, is ${ConfigDataType[input.dataType]}`,
    );
  }
  const outType = datatypeFromConfig(output.dataType);
  if (outType !== p.outputDatatype) {
    throw invalidArgument(
      stage,
      `config output ${output.name} is ${outType} but output_datatype is ${p.outputDatatype}`,
    );
  }
  const want = outputShape(p);
  const dims = output.dims.map(Number);
  const fits = dims.length === want.length && dims.every((d, i) => d === -1 || d === want[i]);
  if (!fits) {
    throw invalidArgument(
      stage,
      `config output ${output.name} dims ${formatShape(dims)} do not match layout ${p.layout} with crop_size ${p.cropSize} (${formatShape(want)})`,
    );
  }
}

/**
 * What the preprocess model computes (served by the model runtime from a repository). Explicit
 * options win over the config's parameters.
 */
export function preprocessDefinition(options: PreprocessOptions = {}): StageDefinition {
  const { config: configSource, name: givenName, version = "1", logger, ...explicit } = options;
  const givenConfig = configSource === undefined ? undefined : modelConfigOf(configSource, givenName || "preprocess");
  const name = givenConfig?.name || givenName || "preprocess";
  const params = resolveParameters(name, givenConfig ? parametersFromConfig(givenConfig, name) : {}, explicit);
  const config = givenConfig ?? defaultConfig(name, params);
  checkConfig(config, params);
  const inputName = config.input[0]!.name;
  const outputName = config.output[0]!.name;
  const batching = config.maxBatchSize > 0;
  // Decode slots go to waiting requests in turn (see fair-limiter.ts).
  const limiter = new FairLimiter(params.concurrency);
  const gate = options.cpuGate;
  const tables = lookupTables(params);
  const perImage = 3 * params.cropSize * params.cropSize;
  let closed = false;
  /** Requests none of whose images has started decoding (the limiter is full). */
  let waiting = 0;

  /** What a request is checked against: Triton's checks and words, and [N] taken for [N,1]. */
  const requestSpec: RequestSpec = {
    model: name,
    maxBatchSize: config.maxBatchSize,
    inputs: [
      {
        name: inputName,
        datatype: "BYTES",
        dims: [1],
        alsoAccepts: (shape) => shape.length === (batching ? 1 : 0),
      },
    ],
    outputs: [outputName],
    // An empty batch is answered with an empty one.
    emptyBatch: true,
  };

  /** One request's output tensor, or the error naming its bad elements (the others of its batch go on). */
  async function preprocessOne(request: InferRequest, signal: AbortSignal | undefined): Promise<RequestOutcome> {
    try {
      checkInferRequest(request, requestSpec);
      const items = request.inputs[0]!.data as Uint8Array[];
      const n = items.length;
      const out = params.outputDatatype === "FP16" ? new Uint16Array(n * perImage) : new Float32Array(n * perImage);
      const failures: { index: number; reason: string }[] = [];
      let started = n === 0;
      if (!started) waiting++;
      const markStarted = () => {
        if (started) return;
        started = true;
        waiting--;
      };
      await Promise.all(
        items.map((element, index) =>
          limiter.run(request, async () => {
            markStarted();
            // One bad element fails its request: skip that request's work that can no longer be used.
            if (failures.length > 0 || signal?.aborted) return;
            try {
              const { bytes, format } = unwrap(element, params.encoding, params.maxBytes, params.mode);
              const c = params.cropSize;
              const sink = rowWriter(tables, params.layout, params.channelOrder, c, c, out, index * perImage);
              await decodeCrop(bytes, format, params, sink);
            } catch (err) {
              if (!(err instanceof ElementError)) throw err;
              failures.push({ index, reason: err.message });
            }
          }),
        ),
      ).finally(markStarted);
      if (signal?.aborted) return new StageError(Code.Canceled, name, "request cancelled");
      if (failures.length > 0) {
        failures.sort((a, b) => a.index - b.index);
        const list = failures.map((f) => `element ${f.index}: ${f.reason}`).join("; ");
        return invalidArgument(name, `input ${inputName} ${list}`);
      }
      const shape = batching ? [n, ...outputShape(params)] : outputShape(params);
      return [tensor(outputName, params.outputDatatype, shape, out) as Tensor];
    } catch (err) {
      if (err instanceof StageError) return err;
      logger?.error({ err, model: name }, "preprocess failed");
      return new StageError(Code.Internal, name, err instanceof Error ? err.message : String(err), { cause: err });
    }
  }

  return {
    config,
    version,
    requestSpec,
    async execute(requests: readonly InferRequest[], opts: InferOptions = {}): Promise<RequestOutcome[]> {
      if (closed) return requests.map(() => new StageError(Code.Unavailable, name, "stage is closed"));
      // Decodes share the CPU gate: an inference run that uses every core waits for them, and they for it.
      let releaseCpu = gate?.tryAcquireShared() ?? (gate ? undefined : () => {});
      if (!releaseCpu && gate) {
        // Waiting for the gate: pending, as requests waiting for a decode slot are.
        waiting += requests.length;
        try {
          releaseCpu = await gate.acquireShared();
        } finally {
          waiting -= requests.length;
        }
      }
      try {
        return await Promise.all(requests.map((request) => preprocessOne(request, opts.signal)));
      } finally {
        releaseCpu?.();
      }
    },
    isReady: () => !closed,
    pendingRequests: () => waiting,
    close: () => {
      closed = true;
    },
  };
}

/**
 * The preprocess stage, ready at once: a Stage you may use as it is, or await (as every stage
 * package's friendly factory) for the same stage once its runtime is made.
 */
export interface PreprocessStage extends Stage, PromiseLike<Stage> {}

/**
 * The preprocess stage in process, served by the model runtime as the server serves it: each
 * request checked against the config, batched as its dynamic_batching says. It needs nothing
 * loaded, so it is usable at once (`createPreprocess().infer(...)`, as in 0.1), and awaitable
 * like the other packages' factories (`await createPreprocess()`). A bad option or config
 * throws here.
 */
export function createPreprocess(options: PreprocessOptions = {}): PreprocessStage {
  const definition = preprocessDefinition(options);
  const served = serveDefinition(definition, options.logger ? { logger: options.logger } : {});
  let runtime: ModelRuntime | undefined;
  // Calls made before the runtime is made wait for it (and see its error, if it failed).
  served.then(
    (r) => {
      runtime = r;
    },
    () => {},
  );
  return {
    name: definition.config.name,
    version: definition.version ?? "1",
    config: definition.config,
    isReady: async () => (await served).isReady(),
    metadata: async () => (await served).metadata(),
    infer: (request, inferOptions) =>
      runtime ? runtime.infer(request, inferOptions) : served.then((r) => r.infer(request, inferOptions)),
    statistics: async () => (await served).statistics(),
    pendingRequests: () => runtime?.pendingRequests?.() ?? definition.pendingRequests?.() ?? 0,
    maxQueueSize: () => runtime?.maxQueueSize() ?? 0,
    close: async () => (await served).close(),
    // biome-ignore lint/suspicious/noThenProperty: awaitable on purpose, as the other factories' promises.
    then: (onfulfilled, onrejected) => served.then(onfulfilled, onrejected),
  };
}

/**
 * The repository loader's entry point, as every stage package's: what the model computes, its
 * parameters from config.pbtxt.
 */
export async function createStage(options: StageFactoryOptions): Promise<StageDefinition> {
  const stageOptions: PreprocessOptions = { config: options.config, version: options.version };
  if (options.logger) stageOptions.logger = options.logger;
  if (options.cpuGate) stageOptions.cpuGate = options.cpuGate;
  return preprocessDefinition(stageOptions);
}
