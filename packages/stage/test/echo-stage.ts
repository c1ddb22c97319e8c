import { create } from "@bufbuild/protobuf";
import { DataType, ModelConfigSchema, ModelInputSchema, ModelOutputSchema } from "@trellis/protocol";
import { Code, StageError } from "../src/errors.js";
import type { InferRequest, InferResponse, Stage } from "../src/stage.js";
import { nowNs, StatisticsRecorder } from "../src/statistics.js";
import { metadataFromConfig } from "../src/wire.js";

/** A real (if tiny) stage: returns each input renamed OUT_<name>; fails on request for "FAIL". */
export function echoStage(name = "echo"): Stage {
  const config = create(ModelConfigSchema, {
    name,
    backend: "typescript",
    maxBatchSize: 8,
    input: [
      create(ModelInputSchema, { name: "TEXT", dataType: DataType.TYPE_STRING, dims: [1n] }),
      create(ModelInputSchema, { name: "VALUES", dataType: DataType.TYPE_FP32, dims: [-1n] }),
    ],
    output: [
      create(ModelOutputSchema, { name: "OUT_TEXT", dataType: DataType.TYPE_STRING, dims: [1n] }),
      create(ModelOutputSchema, { name: "OUT_VALUES", dataType: DataType.TYPE_FP32, dims: [-1n] }),
    ],
  });
  const recorder = new StatisticsRecorder(name, "1");
  return {
    name,
    version: "1",
    config,
    isReady: () => true,
    metadata: () => metadataFromConfig(config, ["1"]),
    async infer(req: InferRequest): Promise<InferResponse> {
      const start = nowNs();
      if (req.parameters?.fail) {
        recorder.requestFailed(nowNs() - start);
        throw new StageError(Code.InvalidArgument, name, `asked to fail: ${String(req.parameters.fail)}`);
      }
      const outputs = req.inputs.map((t) => ({ ...t, name: `OUT_${t.name}` }));
      const batch = req.inputs[0]?.shape[0] ?? 1;
      const t = { computeInputNs: 0, computeInferNs: nowNs() - start, computeOutputNs: 0 };
      recorder.executed(batch, t);
      recorder.requestSucceeded(nowNs() - start, batch, 0, t);
      return { id: req.id, modelName: name, modelVersion: "1", outputs };
    },
    statistics: () => recorder.snapshot(),
    close: async () => {},
  };
}
