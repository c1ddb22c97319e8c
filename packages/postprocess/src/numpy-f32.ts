/**
 * NumPy's own float32 kernels, reproduced bit for bit, so this package's answers equal a
 * `model.py`'s byte for byte (issue 42's shadow check):
 *
 * - `np.exp` on float32 arrays is not libm's correctly rounded expf: on x86 with AVX2 or
 *   AVX-512F (NumPy 1.20 onwards, 2.x too) it is a Cody-Waite range reduction and a rational
 *   polynomial evaluated with fused multiply-adds, up to ~2.5 ULP from the exact value. About
 *   four in ten results differ from `Math.fround(Math.exp(x))` in the last bit.
 * - `np.argsort`'s default kind is an introsort whose order among equal values depends on the
 *   whole row; the int8 model's quantized logits tie often, so a top-5 can list tied classes in
 *   an order no simple rule gives. {@link argsortF32} is NumPy 1.x's algorithm (what Debian 12's
 *   `python3-numpy` runs). NumPy 2 on AVX-512 machines sorts with x86-simd-sort instead and may
 *   order ties differently; the values are the same.
 */

const f = Math.fround;

// NumPy's vectorized expf constants (npy_simd_data.h, npy_math.h), by their float32 bits.
const bits = new DataView(new ArrayBuffer(4));
function f32(word: number): number {
  bits.setUint32(0, word);
  return bits.getFloat32(0);
}
const LOG2E = f(Math.LOG2E);
const CODY_WAITE_LN2_HIGH = f32(0xbf317200);
const CODY_WAITE_LN2_LOW = f32(0xb5bfbe8e);
const P = [
  f32(0x3f800000),
  f32(0x3f39cbd5),
  f32(0x3e7d4c58),
  f32(0x3d517d8c),
  f32(0x3bdd7159),
  f32(0x3a053dd8),
] as const;
const Q = [f32(0x3f800000), f32(0xbe8c6857), f32(0x3cb0e832)] as const;
const EXP_MAX = f32(0x42b17218);
const EXP_MIN = f32(0xc2cff1b5);

/**
 * A float32 fused multiply-add, `round32(a*b + c)` with a single rounding, as the hardware's
 * vfmadd does. The product of two float32s is exact in a double; the sum is rounded once to a
 * double and its error recovered (TwoSum). Rounding that double to float32 is a second rounding
 * that only goes wrong when the double lands exactly halfway between two float32s while the
 * exact sum does not: then the error's sign picks the side.
 */
export function fmaF32(a: number, b: number, c: number): number {
  const p = a * b;
  const s = p + c;
  const bp = s - c;
  const err = p - bp + (c - (s - bp));
  const r = f(s);
  if (err === 0 || r === s) return r;
  // Halfway: the float32 on the other side of s is exactly 2s - r.
  const other = 2 * s - r;
  if (f(other) !== other) return r;
  const up = err > 0;
  return up === other > r ? other : r;
}

/** Round half to even, as the SIMD `rint` does. */
function rintEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** `np.exp` of one float32 value, as NumPy's AVX2/AVX-512F loop computes it. */
export function expF32(x: number): number {
  if (Number.isNaN(x)) return x;
  if (x >= EXP_MAX) return Number.POSITIVE_INFINITY;
  if (x <= EXP_MIN) return 0;
  // Rounded from the exact product: the compiler fuses the mul and the round-to-integer add.
  const k = rintEven(x * LOG2E);
  let y = fmaF32(k, CODY_WAITE_LN2_HIGH, x);
  y = fmaF32(k, CODY_WAITE_LN2_LOW, y);
  let num = fmaF32(P[5], y, P[4]);
  num = fmaF32(num, y, P[3]);
  num = fmaF32(num, y, P[2]);
  num = fmaF32(num, y, P[1]);
  num = fmaF32(num, y, P[0]);
  let den = fmaF32(Q[2], y, Q[1]);
  den = fmaF32(den, y, Q[0]);
  const poly = f(num / den);
  // scalef: poly * 2^k, exact in a double, rounded once (subnormal results included).
  return f(poly * 2 ** k);
}

/** NumPy's `Tag::less` for floats: NaNs sort last. */
function less(a: number, b: number): boolean {
  return a < b || (Number.isNaN(b) && !Number.isNaN(a));
}

const SMALL_QUICKSORT = 15;

/** Index of the most significant set bit (npy_get_msb). */
function msb(n: number): number {
  return 31 - Math.clz32(n);
}

/**
 * `np.argsort(values)` (kind "quicksort") as NumPy 1.x computes it (npysort/quicksort.cpp's
 * aquicksort): median-of-three partitioning, insertion sort below 17 elements, heapsort when the
 * depth limit runs out. Returns the indices in ascending order of value.
 */
export function argsortF32(v: ArrayLike<number>): Int32Array {
  const num = v.length;
  const tosort = new Int32Array(num);
  for (let i = 0; i < num; i++) tosort[i] = i;
  if (num < 2) return tosort;
  const stack: number[] = [];
  const depths: number[] = [];
  let pl = 0;
  let pr = num - 1;
  let cdepth = msb(num) * 2;
  const swap = (i: number, j: number) => {
    const t = tosort[i]!;
    tosort[i] = tosort[j]!;
    tosort[j] = t;
  };
  for (;;) {
    if (cdepth < 0) {
      heapsortRange(v, tosort, pl, pr - pl + 1);
    } else {
      while (pr - pl > SMALL_QUICKSORT) {
        const pm = pl + ((pr - pl) >> 1);
        if (less(v[tosort[pm]!]!, v[tosort[pl]!]!)) swap(pm, pl);
        if (less(v[tosort[pr]!]!, v[tosort[pm]!]!)) swap(pr, pm);
        if (less(v[tosort[pm]!]!, v[tosort[pl]!]!)) swap(pm, pl);
        const vp = v[tosort[pm]!]!;
        let pi = pl;
        let pj = pr - 1;
        swap(pm, pj);
        for (;;) {
          do ++pi;
          while (less(v[tosort[pi]!]!, vp));
          do --pj;
          while (less(vp, v[tosort[pj]!]!));
          if (pi >= pj) break;
          swap(pi, pj);
        }
        swap(pi, pr - 1);
        // The larger partition waits on the stack; the smaller is sorted next.
        if (pi - pl < pr - pi) {
          stack.push(pi + 1, pr);
          pr = pi - 1;
        } else {
          stack.push(pl, pi - 1);
          pl = pi + 1;
        }
        depths.push(--cdepth);
      }
      insertionSortRange(v, tosort, pl, pr);
    }
    if (stack.length === 0) break;
    pr = stack.pop()!;
    pl = stack.pop()!;
    cdepth = depths.pop()!;
  }
  return tosort;
}

function insertionSortRange(v: ArrayLike<number>, tosort: Int32Array, pl: number, pr: number): void {
  for (let pi = pl + 1; pi <= pr; ++pi) {
    const vi = tosort[pi]!;
    const vp = v[vi]!;
    let pj = pi;
    while (pj > pl && less(vp, v[tosort[pj - 1]!]!)) {
      tosort[pj] = tosort[pj - 1]!;
      pj--;
    }
    tosort[pj] = vi;
  }
}

/** NumPy's aheapsort on `tosort[start .. start+n)` (1-based heap indexing, as NumPy's). */
function heapsortRange(v: ArrayLike<number>, tosort: Int32Array, start: number, count: number): void {
  const at = (i: number) => tosort[start + i - 1]!;
  const set = (i: number, x: number) => {
    tosort[start + i - 1] = x;
  };
  const siftDown = (top: number, tmp: number, n: number) => {
    let i = top;
    for (let j = top << 1; j <= n; ) {
      if (j < n && less(v[at(j)]!, v[at(j + 1)]!)) j += 1;
      if (!less(v[tmp]!, v[at(j)]!)) break;
      set(i, at(j));
      i = j;
      j += j;
    }
    set(i, tmp);
  };
  let n = count;
  for (let l = n >> 1; l > 0; --l) siftDown(l, at(l), n);
  while (n > 1) {
    const tmp = at(n);
    set(n, at(1));
    n -= 1;
    siftDown(1, tmp, n);
  }
}
