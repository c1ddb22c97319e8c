/**
 * Python models (backend "python") that cannot run here: the refusal, naming the TypeScript
 * stage (a Trellis package, or a model.js of one's own) that does what the model.py did.
 */
import type { ModelConfig } from "@trellis/protocol";
import { Code, datatypeFromConfig, StageError } from "@trellis/stage";

/** A Python model without its model file: where its TypeScript counterpart goes. */
export function pythonRefusal(config: ModelConfig, name: string, version: string): StageError {
  const replacement = trellisReplacement(config);
  const file = config.defaultModelFilename || "model.py";
  return new StageError(
    Code.InvalidArgument,
    name,
    replacement
      ? `backend "python" needs ${file} in the version folder ${version}; ${replacement} does what this model's model.py does: in config.pbtxt, replace backend: "python" with the lines: backend: "typescript" parameters { key: "module" value: { string_value: "${replacement}" } }`
      : `backend "python" needs ${file} in the version folder ${version}; or set backend: "typescript" and either parameters { key: "module" value: { string_value: "<stage package>" } } or put a model.js exporting createStage(options) in the version folder ${version} (the TypeScript counterpart of model.py)`,
  );
}

/**
 * The Trellis package that replaces a Triton Python model, for the kinds it has: the seed's
 * ResNet-50 preprocess (an encoded image in, a [3, 224, 224] FP32 tensor out) and postprocess
 * (1000 logits in, a JSON string out), recognised by name or by that shape.
 */
export function trellisReplacement(config: ModelConfig): string | undefined {
  type Tensors = { dataType: ModelConfig["input"][number]["dataType"]; dims: bigint[] }[];
  const types = (list: Tensors) =>
    list
      .map((t) => {
        try {
          return datatypeFromConfig(t.dataType);
        } catch {
          return "?";
        }
      })
      .join(",");
  const dims = (list: Tensors) => list.map((t) => t.dims.join("x")).join(",");
  const [inputs, outputs] = [types(config.input), types(config.output)];
  if (
    config.name === "resnet50_preprocess" ||
    (inputs === "BYTES" && outputs === "FP32" && dims(config.output) === "3x224x224")
  )
    return "@trellis/preprocess";
  if (
    config.name === "resnet50_postprocess" ||
    (inputs === "FP32" && outputs === "BYTES" && dims(config.input) === "1000")
  )
    return "@trellis/postprocess";
  return undefined;
}
