/**
 * classify: the common case in one call. An image's bytes go to a stage that takes encoded
 * images and answers with this package's JSON (the seed ensemble, a pipeline ending in
 * postprocess); its top-k labels and probabilities come back.
 */
import { bytesTensor, bytesToStrings, Code, type InferOptions, type Stage, StageError } from "@trellis/stage";

export interface Classification {
  /** The k most likely labels, most likely first. */
  labels: string[];
  /** Their softmax probabilities. */
  probs: number[];
}

/** The top-k of one image (its file's bytes) by `stage`, whose one BYTES input takes encoded images. */
export async function classify(stage: Stage, image: Uint8Array, options?: InferOptions): Promise<Classification> {
  const meta = await stage.metadata();
  const input = meta.inputs.find((t) => t.datatype === "BYTES");
  if (!input) throw new StageError(Code.InvalidArgument, stage.name, "classify needs a stage with a BYTES input");
  const shape = input.shape[0] === -1 ? [1, 1] : [1];
  const { outputs } = await stage.infer({ inputs: [bytesTensor(input.name, shape, [image])] }, options);
  const text = outputs.find((t) => t.datatype === "BYTES");
  const answer = text ? bytesToStrings(text)[0] : undefined;
  const parsed = answer === undefined ? undefined : (JSON.parse(answer) as Record<string, unknown>);
  const key = parsed && Object.keys(parsed).find((k) => /^top\d+_labels$/.test(k));
  if (!parsed || !key) {
    throw new StageError(Code.Internal, stage.name, "the answer is not a postprocess JSON string (top<k>_labels)");
  }
  return { labels: parsed[key] as string[], probs: parsed[key.replace(/_labels$/, "_probs")] as number[] };
}
