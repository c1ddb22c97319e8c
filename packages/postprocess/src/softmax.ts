/**
 * Softmax and top-k in float32 arithmetic, exactly as NumPy computes them on a
 * float32 row (`e = np.exp(x - x.max()); e / e.sum()`, then `np.argsort`), so
 * the probabilities and their order equal the seed's `postprocess.py` bit for bit.
 */

import { argsortF32, expF32 } from "./numpy-f32.js";

const f = Math.fround;

/**
 * NumPy's pairwise summation for float32 (loops_utils.h.src): below 8
 * values a plain loop, up to 128 eight interleaved accumulators, above that
 * a split at a multiple of 8. Every partial sum is rounded to float32.
 */
export function pairwiseSumF32(a: Float32Array, start: number, n: number): number {
  if (n < 8) {
    let res = 0;
    for (let i = 0; i < n; i++) res = f(res + a[start + i]!);
    return res;
  }
  if (n <= 128) {
    const r = [0, 0, 0, 0, 0, 0, 0, 0];
    for (let j = 0; j < 8; j++) r[j] = a[start + j]!;
    let i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (let j = 0; j < 8; j++) r[j] = f(r[j]! + a[start + i + j]!);
    }
    let res = f(f(f(r[0]! + r[1]!) + f(r[2]! + r[3]!)) + f(f(r[4]! + r[5]!) + f(r[6]! + r[7]!)));
    for (; i < n; i++) res = f(res + a[start + i]!);
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return f(pairwiseSumF32(a, start, n2) + pairwiseSumF32(a, start + n2, n - n2));
}

/**
 * Softmax of `logits[row*c .. row*c+c)` into `out` (length c). The row max
 * is subtracted first, so large logits cannot overflow exp. Returns the
 * index of the first non-finite logit, or -1 when all are finite.
 */
export function softmaxRowF32(logits: Float32Array, row: number, c: number, out: Float32Array): number {
  const base = row * c;
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < c; i++) {
    const v = logits[base + i]!;
    if (!Number.isFinite(v)) return i;
    if (v > max) max = v;
  }
  for (let i = 0; i < c; i++) out[i] = expF32(f(logits[base + i]! - max));
  // NumPy's add.reduce starts from the identity 0, then adds the pairwise sum.
  const sum = f(0 + pairwiseSumF32(out, 0, c));
  for (let i = 0; i < c; i++) out[i] = out[i]! / sum;
  return -1;
}

/**
 * Indices of the k largest values, descending; equal values keep index
 * order (lower index first). The stage's JSON answers order ties as NumPy
 * does instead ({@link topKAsNumpy}); classification strings use this order.
 */
export function topK(values: Float32Array, k: number): number[] {
  const idx: number[] = [];
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!;
    if (idx.length < k) idx.push(i);
    else if (v > values[idx[k - 1]!]!) idx[k - 1] = i;
    else continue;
    // Strict ">" keeps earlier indices ahead of equal values.
    let pos = idx.length - 1;
    while (pos > 0 && v > values[idx[pos - 1]!]!) {
      idx[pos] = idx[pos - 1]!;
      pos--;
    }
    idx[pos] = i;
  }
  return idx;
}

/**
 * The k largest as the seed's `np.argsort(probs)[-k:][::-1]` lists them. Without ties the
 * order is the values' own (what {@link topK} finds); with a tie among the k, or between the
 * k-th and a value left out, NumPy's introsort decides, so the whole row is sorted its way.
 */
export function topKAsNumpy(values: Float32Array, k: number): number[] {
  const top = topK(values, k);
  if (!hasTie(values, top)) return top;
  const order = argsortF32(values);
  const out: number[] = [];
  for (let i = order.length - 1; i >= Math.max(0, order.length - k); i--) out.push(order[i]!);
  return out;
}

/** Whether two of `top` (descending) are equal, or the last one equals a value outside it. */
function hasTie(values: Float32Array, top: readonly number[]): boolean {
  for (let i = 1; i < top.length; i++) if (values[top[i]!] === values[top[i - 1]!]) return true;
  if (top.length === 0) return false;
  const last = values[top[top.length - 1]!]!;
  let equal = 0;
  for (let i = 0; i < values.length; i++) if (values[i] === last) equal++;
  return equal > 1;
}
