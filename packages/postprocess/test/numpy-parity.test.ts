/**
 * The seed's postprocess.py computes with NumPy; this package must answer byte for byte as it
 * does. Rows of logits (int8-like quantized ones, which tie often, and plain floats) go to a real
 * NumPy (Debian's python3-numpy, /usr/bin/python3: what the seed's models run under, and what CI
 * installs) running postprocess.py's own lines, and every JSON string must be identical; np.exp
 * is checked value by value over its whole useful range too.
 */
import { execFileSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { createPostprocess } from "../src/index.js";
import { expF32 } from "../src/numpy-f32.js";

const PYTHON = process.env.TRELLIS_TEST_PYTHON ?? "/usr/bin/python3";

/** Runs a NumPy script with `input` on stdin; its stdout. */
function numpy(script: string, input: Uint8Array): Buffer {
  return execFileSync(PYTHON, ["-c", script], { input, maxBuffer: 256 * 1024 * 1024 });
}

/** Deterministic rows: int8-like logits (scale × integer: many ties) and plain float logits. */
function rows(n: number, classes: number): Float32Array {
  let s = 42;
  const rnd = () => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return s / 2 ** 32;
  };
  const out = new Float32Array(n * classes);
  for (let r = 0; r < n; r++) {
    const quantized = r % 2 === 0;
    const scale = 0.05 + rnd() * 0.3;
    for (let c = 0; c < classes; c++) {
      const gauss = Math.sqrt(-2 * Math.log(1 - rnd())) * Math.cos(2 * Math.PI * rnd()) * 4;
      out[r * classes + c] = quantized ? Math.round(gauss / scale) * scale : gauss;
    }
  }
  return out;
}

// postprocess.py's softmax, argsort and json.dumps, verbatim in what they compute.
const POSTPROCESS_PY = `
import sys, json, numpy as np
logits = np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32).reshape(-1, 1000)
labels = ["class_%d" % i for i in range(1000)]
exp_logits = np.exp(logits - np.max(logits, axis=1, keepdims=True))
probs = exp_logits / np.sum(exp_logits, axis=1, keepdims=True)
top5_indices = np.argsort(probs, axis=1)[:, -5:][:, ::-1]
for i in range(logits.shape[0]):
    item = {"top5_labels": [labels[j] for j in top5_indices[i]], "top5_probs": [float(probs[i][j]) for j in top5_indices[i]]}
    print(json.dumps(item))
`;

describe("@trellis/postprocess against NumPy (postprocess.py's arithmetic)", () => {
  it("gives byte-identical JSON for 2,000 rows, ties included", async () => {
    const n = 2000;
    const logits = rows(n, 1000);
    const labels = Array.from({ length: 1000 }, (_, i) => `class_${i}`);
    const stage = await createPostprocess({ labels });
    const ours = stage.run(logits, n);
    await stage.close();
    const theirs = numpy(POSTPROCESS_PY, new Uint8Array(logits.buffer)).toString("utf8").trimEnd().split("\n");
    expect(theirs).toHaveLength(n);
    const differing = ours.flatMap((s, i) => (s === theirs[i] ? [] : [i]));
    expect(differing.slice(0, 3).map((i) => [ours[i], theirs[i]])).toEqual([]);
    // The check has teeth: ties at the top do occur in these rows.
    const tied = ours.filter((s) => {
      const probs = (JSON.parse(s) as { top5_probs: number[] }).top5_probs;
      return new Set(probs).size < probs.length;
    });
    expect(tied.length).toBeGreaterThan(50);
  }, 60_000);

  it("computes np.exp's float32 results bit for bit, from -104 to 89", () => {
    const n = 400_000;
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = -104 + (193 * i) / n;
    const want = new Float32Array(
      new Uint8Array(
        numpy(
          'import sys, numpy as np\nnp.seterr(over="ignore")\nsys.stdout.buffer.write(np.exp(np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32)).tobytes())',
          new Uint8Array(x.buffer),
        ),
      ).buffer,
    );
    const got = new Float32Array(n);
    for (let i = 0; i < n; i++) got[i] = expF32(x[i]!);
    let differing = 0;
    let naive = 0;
    for (let i = 0; i < n; i++) {
      if (!Object.is(got[i], want[i])) differing++;
      if (Math.fround(Math.exp(x[i]!)) !== want[i]) naive++;
    }
    expect(differing).toBe(0);
    // Math.exp rounded to float32 (correctly rounded) would not do.
    expect(naive).toBeGreaterThan(n / 10);
  });
});
