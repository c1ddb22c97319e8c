/**
 * Triton's auto-complete for Python models: before any instance starts, a python3 process runs
 * the model's `TritonPythonModel.auto_complete_config(auto_complete_model_config)` on the config
 * the repository gives (partial, or a bare one for a folder without config.pbtxt) and the
 * server serves the config it returns. The process only imports model.py: no instance is made.
 */
import { spawn } from "node:child_process";
import { type ModelConfig, modelConfigToJson, parseModelConfigJson } from "@trellis/protocol";
import { Code, StageError } from "@trellis/stage";
import { encodeFrame, type Frame, FrameReader } from "./frames.js";
import { pythonStartError, STUB_PATH } from "./stub-process.js";

export interface AutoCompleteOptions {
  config: ModelConfig;
  /** The model file (pythonModelFile). */
  modelFile: string;
  pythonExecutable?: string;
  /** Longest the import and auto_complete_config may take; default 120 s. */
  timeoutMs?: number;
  /** Largest answer the process may send; default 16 MiB. */
  maxFrameBytes?: number;
}

/** The config `auto_complete_config` makes of `config` (`config` itself when the model has none). */
export async function autoCompletePythonConfig(options: AutoCompleteOptions): Promise<ModelConfig> {
  const { config } = options;
  const name = config.name;
  const answer = await askStub(options);
  if (answer.header.type === "load_failed")
    throw new StageError(Code.InvalidArgument, name, `auto_complete_config failed: ${String(answer.header.message)}`);
  let completed: ModelConfig;
  try {
    completed = parseModelConfigJson(JSON.stringify(answer.header.config), "the config auto_complete_config returned");
  } catch (e) {
    throw new StageError(Code.InvalidArgument, name, (e as Error).message);
  }
  // As Triton: auto-complete fills a config in, it does not rename or move the model.
  if (completed.name && completed.name !== name)
    throw new StageError(
      Code.InvalidArgument,
      name,
      `auto_complete_config renamed the model to "${completed.name}"; a model's name is its folder's`,
    );
  completed.name = name;
  if (completed.backend !== config.backend)
    throw new StageError(
      Code.InvalidArgument,
      name,
      `auto_complete_config changed the backend to "${completed.backend}"`,
    );
  return completed;
}

function askStub(options: AutoCompleteOptions): Promise<Frame> {
  const { config } = options;
  const python = options.pythonExecutable ?? "python3";
  const timeoutMs = options.timeoutMs ?? 120_000;
  return new Promise<Frame>((resolve, reject) => {
    const child = spawn(python, ["-u", STUB_PATH], { stdio: ["pipe", "pipe", "pipe"] });
    const reader = new FrameReader(options.maxFrameBytes ?? 16 << 20);
    let settled = false;
    const settle = (error: Error | undefined, frame?: Frame) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.kill("SIGKILL");
      if (error) reject(error);
      else resolve(frame as Frame);
    };
    const timer = setTimeout(
      () =>
        settle(
          new StageError(
            Code.Unavailable,
            config.name,
            `auto_complete_config gave no answer within ${timeoutMs} ms and its process was stopped`,
          ),
        ),
      timeoutMs,
    );
    child.once("error", (e: NodeJS.ErrnoException) => settle(pythonStartError(config.name, python, e)));
    child.stdout.on("data", (chunk: Buffer) => {
      try {
        const [frame] = reader.push(chunk);
        if (frame) settle(undefined, frame);
      } catch (e) {
        settle(new StageError(Code.Internal, config.name, (e as Error).message));
      }
    });
    child.stderr.on("data", () => {});
    // "close", not "exit": the answer on stdout is read by then.
    child.on("close", (code, signal) =>
      settle(
        new StageError(
          Code.Unavailable,
          config.name,
          `auto_complete_config: its Python process exited (${signal ?? `code ${code}`}) without an answer`,
        ),
      ),
    );
    child.stdin.on("error", () => {});
    child.stdin.write(
      encodeFrame({
        type: "auto_complete",
        model_file: options.modelFile,
        model_config: JSON.stringify(modelConfigToJson(config)),
      }),
    );
  });
}
