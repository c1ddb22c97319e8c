/**
 * The expected MobileNetV2 answers for tests, computed on the machine the tests run on.
 *
 * The shared model is int8 (QOperator), and ONNX Runtime's int8 kernels differ by
 * instruction set: on a CPU without VNNI (AVX2 only) they give other logits than on
 * the AVX-512 VNNI machine where `mobilenetv2_top5.json` was made, enough to change
 * top-1s (astronaut.jpg: stethoscope on an AVX2-only EPYC, bobsled in the JSON;
 * rocket.jpg: 540, not 657). So tests that check the pipeline classifies like ONNX
 * Runtime compare with ONNX Runtime run here, on the same CPU, not with the JSON.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import * as ort from "onnxruntime-node";
import { fixturePhotos, LABELS_PATH, MOBILENET_PATH, type ReferenceTop5, readReferenceTensor } from "./paths.js";

/** One photo's top-5 as in `mobilenetv2_top5.json`, plus the raw logits it came from. */
export interface CpuTop5 extends ReferenceTop5 {
  /** The model's `output` row for the photo's reference tensor: 1000 float32 logits. */
  logits: Float32Array;
}

/**
 * The top-1 classes the shared README names that hold on both kinds of x86-64 CPU
 * seen so far (AVX2-only, and the AVX-512 VNNI one that made the JSON): a check,
 * independent of the machine, that the model really classifies. rocket.jpg (657
 * missile in the README) is left out: it is 540 on an AVX2-only CPU.
 */
export const STABLE_TOP1: Readonly<Record<string, { index: number; label: string }>> = {
  "chelsea.jpg": { index: 285, label: "Egyptian cat" },
  "coffee.jpg": { index: 967, label: "espresso" },
  "camera.jpg": { index: 872, label: "tripod" },
  "motorcycle_left.jpg": { index: 665, label: "moped" },
};

const f = Math.fround;

/**
 * Softmax then the 5 largest, descending: float32 probabilities
 * (`exp(x - max) / sum`, `Math.exp` rounded), equal ones by lower class index
 * first. A simple rule, not the seed's: NumPy's exp differs in the last bit and
 * its argsort orders ties its own way (see {@link numpyTop5}).
 */
export function softmaxTop5(logits: Float32Array, labels: readonly string[]): ReferenceTop5 {
  let max = Number.NEGATIVE_INFINITY;
  for (const v of logits) max = Math.max(max, v);
  const exp = Array.from(logits, (v) => f(Math.exp(f(v - max))));
  const sum = exp.reduce((a, b) => a + b, 0);
  const probs = exp.map((e) => f(e / sum));
  const top = probs
    .map((p, i) => [p, i] as const)
    .sort((a, b) => b[0] - a[0] || a[1] - b[1])
    .slice(0, 5)
    .map(([, i]) => i);
  return {
    top5_index: top,
    top5_labels: top.map((i) => labels[i] as string),
    top5_probs: top.map((i) => probs[i] as number),
  };
}

let memo: Promise<Record<string, CpuTop5>> | undefined;

/**
 * MobileNetV2's top-5 (and logits) for every fixture photo, as onnxruntime-node
 * gives it in this process on THIS machine's CPU, one photo at a time, on the
 * photo's seed reference tensor (`readReferenceTensor`, so our preprocessing is
 * out of the loop) with ONNX Runtime's default session options. Keyed like
 * `readReferenceTop5()`.
 *
 * Why not `readReferenceTop5()`: int8 kernels differ between CPUs (see this
 * file's head), so the JSON's top-5 only holds on a CPU like the one that made
 * it. This baseline is the same ONNX Runtime on the same CPU as the code under
 * test, yet independent of it (its own session; the softmax and top-5 by NumPy
 * itself, as the seed's postprocess.py: {@link numpyTop5}), so "the pipeline
 * classifies like direct ONNX Runtime and the seed's Python" stays an exact
 * check, tie order included, on any x86-64 machine. On this model the logits do not depend on batch size,
 * thread count or graph optimisation level (checked on an AVX2-only EPYC), so
 * a pipeline that batches or tunes its session must still match them.
 * Memoised: the session runs once per process.
 */
export function referenceTop5OnThisCpu(): Promise<Record<string, CpuTop5>> {
  memo ??= (async () => {
    const labels = readFileSync(LABELS_PATH, "utf8").split("\n");
    const session = await ort.InferenceSession.create(MOBILENET_PATH);
    try {
      const out: Record<string, CpuTop5> = {};
      for (const photo of fixturePhotos()) {
        const input = new ort.Tensor("float32", readReferenceTensor(photo), [1, 3, 224, 224]);
        const result = await session.run({ input });
        const logits = Float32Array.from(result.output?.data as Float32Array);
        if (logits.length !== 1000) throw new Error(`${photo}: expected 1000 logits, got ${logits.length}`);
        out[photo] = { top5_index: [], top5_labels: [], top5_probs: [], logits };
      }
      const rows = Object.values(out);
      for (const [i, top] of numpyTop5(rows.map((r) => r.logits)).entries()) {
        const row = rows[i] as CpuTop5;
        row.top5_index = top.index;
        row.top5_labels = top.index.map((k) => labels[k] as string);
        row.top5_probs = top.probs;
      }
      return out;
    } finally {
      await session.release();
    }
  })();
  return memo;
}

/** The python3 with NumPy that computes the seed's answers: Debian's (python3-numpy), as the seed's models run. */
const NUMPY_PYTHON = process.env.TRELLIS_PYTHON ?? "/usr/bin/python3";

// The seed's postprocess.py, line for line in what it computes.
const SEED_TOP5 = `
import sys, json, numpy as np
logits = np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32).reshape(-1, 1000)
exp_logits = np.exp(logits - np.max(logits, axis=1, keepdims=True))
probs = exp_logits / np.sum(exp_logits, axis=1, keepdims=True)
top5 = np.argsort(probs, axis=1)[:, -5:][:, ::-1]
print(json.dumps([{"index": [int(j) for j in top5[i]], "probs": [float(probs[i][j]) for j in top5[i]]} for i in range(len(top5))]))
`;

/**
 * The seed's top-5 of each row of 1000 logits, computed by NumPy itself (the seed's
 * postprocess.py arithmetic: float32 softmax, `np.argsort(probs)[:, -5:][:, ::-1]`), so tied
 * probabilities come in NumPy's order. Needs Debian's python3-numpy (.ci/run installs it; set
 * TRELLIS_PYTHON for another python3 whose NumPy is 1.x).
 */
export function numpyTop5(rows: readonly Float32Array[]): { index: number[]; probs: number[] }[] {
  const input = new Uint8Array(rows.length * 4000);
  for (const [i, row] of rows.entries()) input.set(new Uint8Array(row.buffer, row.byteOffset, 4000), i * 4000);
  let out: string;
  try {
    out = execFileSync(NUMPY_PYTHON, ["-c", SEED_TOP5], { input, stdio: ["pipe", "pipe", "pipe"] }).toString("utf8");
  } catch (err) {
    const why = (err as { stderr?: Buffer }).stderr?.toString().trim().split("\n").pop() ?? String(err);
    throw new Error(
      `the seed's top-5 needs NumPy in ${NUMPY_PYTHON} (${why}): apt-get install python3-numpy, or set TRELLIS_PYTHON`,
    );
  }
  return JSON.parse(out) as { index: number[]; probs: number[] }[];
}
