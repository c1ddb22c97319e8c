/**
 * @trellis/backend-python: Triton's Python backend as a Trellis backend, a migration bridge.
 * Each instance of instance_group is a python3 process running stub.py, which loads the model's
 * TritonPythonModel; the model runtime batches, checks and counts as for any backend, and this
 * backend only runs `execute(requests)` and answers each request.
 */
import { basename, join } from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { type ModelConfig, ModelConfigSchema, ModelInstanceGroup_Kind } from "@trellis/protocol";
import { instanceCount, type ModelBackend } from "@trellis/runtime";
import { Code, isDecoupled, type ModelCaller, StageError, type StageLogger } from "@trellis/stage";
import { pickOutputs } from "@trellis/stage/backend";
import { MAX_RESPONSES } from "./decoupled.js";
import { StubProcess } from "./stub-process.js";

export { type AutoCompleteOptions, autoCompletePythonConfig } from "./auto-complete.js";
export { STUB_PATH } from "./stub-process.js";

export interface PythonBackendOptions {
  config: ModelConfig;
  /** `<repository>/<model>` and the version folder that holds the model file. */
  modelDir: string;
  version: string;
  /** Which python3 runs the stubs (the server's --python-executable); default "python3". */
  pythonExecutable?: string;
  /** Longest one execution may take before its process is stopped and restarted; default 60 s. */
  executeTimeoutMs?: number;
  /** Longest a process may take to load the model (imports, initialize); default 120 s. */
  loadTimeoutMs?: number;
  /** Largest frame a stub may send (and most unread bytes of a decoupled request's responses); default 1 GiB. */
  maxFrameBytes?: number;
  /** Most responses a decoupled model may send one request; default 100,000. */
  maxStreamResponses?: number;
  /** The server's models, for BLS requests. */
  models?: ModelCaller;
  logger?: StageLogger;
}

/** The model file: default_model_filename, else model.py, in the version folder. */
export function pythonModelFile(config: ModelConfig, modelDir: string, version: string): string {
  const file = config.defaultModelFilename || "model.py";
  // Only a file of the version folder itself: never a path out of the repository.
  if (file !== basename(file) || file === ".." || file.includes("\\"))
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `default_model_filename "${file}" must be a file name in the version folder`,
    );
  return join(modelDir, version, file);
}

/** initialize(args) as Triton's python backend fills it. */
function initializeArgs(config: ModelConfig, modelDir: string, version: string, instance: number) {
  const kind = config.instanceGroup[0]?.kind === ModelInstanceGroup_Kind.GPU ? "GPU" : "CPU";
  const json = toJson(ModelConfigSchema, config, { useProtoFieldName: true });
  return {
    model_config: JSON.stringify(json),
    model_instance_kind: kind,
    model_instance_name: `${config.name}_${instance}`,
    model_instance_device_id: "0",
    model_repository: modelDir,
    model_version: version,
    model_name: config.name,
  };
}

/** A Python model's backend; `instanceStarts`: processes each instance has started (1, plus one per restart). */
export interface PythonBackend extends ModelBackend {
  instanceStarts(): number[];
}

/** Starts every instance's process (loading the model in each) and gives the backend. */
export async function createPythonBackend(options: PythonBackendOptions): Promise<PythonBackend> {
  const { config, modelDir, version } = options;
  const count = instanceCount(config);
  const stubs: StubProcess[] = [];
  for (let i = 0; i < count; i++) {
    stubs.push(
      new StubProcess({
        modelName: config.name,
        pythonExecutable: options.pythonExecutable ?? "python3",
        modelFile: pythonModelFile(config, modelDir, version),
        initialize: initializeArgs(config, modelDir, version, i),
        executeTimeoutMs: options.executeTimeoutMs ?? 60_000,
        loadTimeoutMs: options.loadTimeoutMs ?? 120_000,
        maxFrameBytes: options.maxFrameBytes ?? 1 << 30,
        maxStreamResponses: options.maxStreamResponses ?? MAX_RESPONSES,
        ...(options.models ? { models: options.models } : {}),
        onLog: (text) => options.logger?.info({ model: config.name }, text.trimEnd()),
      }),
    );
  }
  try {
    // One at a time: each load imports numpy and the model's own modules.
    for (const stub of stubs) await stub.start();
  } catch (e) {
    await Promise.all(stubs.map((s) => s.close()));
    throw e;
  }
  return {
    instances: count,
    executeRequests: async (requests, ctx) => ({
      responses: await (stubs[ctx.instance] as StubProcess).execute(requests, ctx.options),
    }),
    ...(isDecoupled(config) ? { executeStream: decoupledExecutor(config.name, version, stubs) } : {}),
    instanceStarts: () => stubs.map((s) => s.starts),
    close: async () => {
      await Promise.all(stubs.map((s) => s.close()));
    },
  };
}

/** A decoupled model's requests, each on the next instance in turn, answered as the model sends. */
function decoupledExecutor(
  name: string,
  version: string,
  stubs: StubProcess[],
): NonNullable<ModelBackend["executeStream"]> {
  let next = 0;
  return async function* (request, options) {
    const stub = stubs[next++ % stubs.length] as StubProcess;
    for await (const { outputs, parameters } of stub.executeDecoupled(request, options)) {
      yield {
        ...(request.id !== undefined ? { id: request.id } : {}),
        modelName: name,
        modelVersion: version,
        outputs: pickOutputs(name, request, outputs),
        ...(parameters ? { parameters } : {}),
      };
    }
  };
}
