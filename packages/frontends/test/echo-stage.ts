import { create } from "@bufbuild/protobuf";
import { DataType, ModelConfigSchema, ModelInputSchema, ModelOutputSchema } from "@trellis/protocol";
import type { InferRequest, Stage } from "@trellis/stage";
import { Code, defineStage, StageError } from "@trellis/stage";

/** A subclass of StageError, as packages raise their own (the ensemble's step errors). */
export class EchoError extends StageError {}

/**
 * A real (if tiny) stage: returns each input renamed OUT_<name>; fails with
 * INVALID_ARGUMENT when asked (parameter fail; failWith "subclass" raises an EchoError).
 */
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
  return defineStage({
    config,
    compute(req: InferRequest) {
      if (req.parameters?.fail) {
        const Raise = req.parameters.failWith === "subclass" ? EchoError : StageError;
        throw new Raise(Code.InvalidArgument, name, `asked to fail: ${String(req.parameters.fail)}`);
      }
      return req.inputs.map((t) => ({ ...t, name: `OUT_${t.name}` }));
    },
  });
}
