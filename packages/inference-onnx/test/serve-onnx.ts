/** An ONNX model served by the model runtime, as the repository loader serves it, for tests of the backend. */
import { createModelRuntime, type ModelRuntime } from "@trellis/runtime";
import { createOnnxModel, type OnnxStageOptions } from "../dist/index.js";

export interface OnnxStage extends ModelRuntime {
  readonly synthetic: boolean;
  readonly modelPath: string;
  pendingRequests(): number;
}

export async function createOnnxStage(options: OnnxStageOptions & { version?: string }): Promise<OnnxStage> {
  const model = await createOnnxModel(options);
  const runtime = await createModelRuntime({
    config: model.config,
    version: model.version,
    backend: model.backend,
    modelDir: options.modelDir,
    strategy: model.strategy,
  });
  const pending = runtime.pendingRequests?.bind(runtime);
  return Object.assign(runtime, {
    synthetic: model.synthetic,
    modelPath: model.modelPath,
    pendingRequests: () => pending?.() ?? 0,
  });
}
