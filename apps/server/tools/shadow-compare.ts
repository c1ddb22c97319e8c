/**
 * Shadow comparison of a Triton Python model with its TypeScript replacement: both run on the same
 * inputs and every output is compared, numbers by max |Δ| and mismatching elements, strings by
 * exact equality. Run on the seed's chain (preprocess -> inference -> postprocess): each image
 * goes through both preprocesses, the Python one's tensor through the ONNX model, and those logits
 * through both postprocesses, so each pair sees exactly the same input.
 */
import { compareAnswers, loadModel, type OutputAgreement } from "@trellis/model-repository";
import { bytesTensor, type Stage, type Tensor } from "@trellis/stage";

export type { OutputAgreement };

export interface ShadowOptions {
  /** The Triton repository with the Python models (and the ONNX model between them). */
  pythonRepository: string;
  /** The repository with their TypeScript replacements under the same names. */
  typescriptRepository: string;
  /** Encoded images; each is sent as base64 text, as the seed's clients send it. */
  images: readonly Uint8Array[];
  pythonExecutable?: string;
  models?: { preprocess: string; inference: string; postprocess: string };
}

const SEED = {
  preprocess: "resnet50_preprocess",
  inference: "resnet50_inference",
  postprocess: "resnet50_postprocess",
};

const request = (name: string, tensor: Tensor) => ({ inputs: [{ ...tensor, name }] });

/** Runs the chain on every image and gives each output's agreement. */
export async function shadowCompare(options: ShadowOptions): Promise<OutputAgreement[]> {
  const names = options.models ?? SEED;
  const python = options.pythonExecutable ? { python: { pythonExecutable: options.pythonExecutable } } : {};
  const stages: Stage[] = [];
  const load = async (repository: string, name: string) => {
    const stage = await loadModel(repository, name, python);
    stages.push(stage);
    return stage;
  };
  try {
    const pyPre = await load(options.pythonRepository, names.preprocess);
    const tsPre = await load(options.typescriptRepository, names.preprocess);
    const inference = await load(options.pythonRepository, names.inference);
    const pyPost = await load(options.pythonRepository, names.postprocess);
    const tsPost = await load(options.typescriptRepository, names.postprocess);
    const rows = new Map<string, OutputAgreement>();
    const inputName = (s: Stage) => s.config.input[0]?.name ?? "";
    for (const image of options.images) {
      const raw = bytesTensor(inputName(pyPre), [1, 1], [Buffer.from(image).toString("base64")]);
      const [ps, ts] = await Promise.allSettled([
        pyPre.infer({ inputs: [raw] }),
        tsPre.infer(request(inputName(tsPre), raw)),
      ]);
      if (ps.status === "rejected" || ts.status === "rejected") {
        // An image one model refuses: agreement if both do, a mismatch if only one does.
        const key = `${names.preprocess}.${pyPre.config.output[0]?.name ?? ""}`;
        const row = rows.get(key) ?? { output: key, requests: 0, elements: 0, mismatching: 0 };
        rows.set(key, row);
        row.requests += 1;
        if (ps.status === "rejected" && ts.status === "rejected") row.bothFailed = (row.bothFailed ?? 0) + 1;
        else row.oneFailed = (row.oneFailed ?? 0) + 1;
        continue;
      }
      const p = ps.value;
      compareAnswers(names.preprocess, p, ts.value, rows);
      const logits = await inference.infer(request(inputName(inference), p.outputs[0] as Tensor));
      const scores = logits.outputs[0] as Tensor;
      const [pp, tp] = await Promise.all([
        pyPost.infer(request(inputName(pyPost), scores)),
        tsPost.infer(request(inputName(tsPost), scores)),
      ]);
      compareAnswers(names.postprocess, pp, tp, rows);
    }
    return [...rows.values()];
  } finally {
    await Promise.all(stages.map((s) => s.close()));
  }
}

/** The agreement as a table, one row per output. */
export function formatAgreement(rows: readonly OutputAgreement[]): string {
  const lines = [
    "| output | requests | elements | mismatching | max abs delta | both refused | one refused |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const r of rows) {
    const delta = r.maxAbsDelta === undefined ? "(strings: exact)" : String(r.maxAbsDelta);
    lines.push(
      `| ${r.output} | ${r.requests} | ${r.elements} | ${r.mismatching} | ${delta} | ${r.bothFailed ?? 0} | ${r.oneFailed ?? 0} |`,
    );
  }
  return lines.join("\n");
}
