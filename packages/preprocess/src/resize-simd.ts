/**
 * The two passes of resize.ts's OpenCV-exact INTER_LINEAR, for 3-channel
 * images, as WebAssembly SIMD kernels: the same integer arithmetic, 4 to 16
 * values per instruction instead of one (the JS loops were about a quarter of
 * a 640x480 image's CPU time). The module is a few hundred bytes assembled
 * here, so there is no build step and no dependency; where WebAssembly SIMD
 * is missing, `simdResizer()` returns undefined and resize.ts uses its JS loops.
 *
 * Kernels (all addresses are byte offsets into the module's memory):
 * - hpass(src, offs, weights, outW, row): for each output column x, the pixel
 *   at src + offs[x] and the one after it, `R_a*wa + R_b*wb` per channel into
 *   row[3x..3x+2] (int32). Loads 8 bytes, so `src` needs 8 bytes of slack; the
 *   second pixel is always the next one (resize.ts: where the table clamps it
 *   to the same pixel, its weight is 0). Writes 16 bytes per column, the 4th
 *   lane being overwritten by the next column: `row` needs 4 bytes of slack.
 * - vpass(r0, r1, b0, b1, blocks, out): `((hi16((r0>>4)*b0) + hi16((r1>>4)*b1) + 2) >> 2)`
 *   for 16 values per block, narrowed to uint8.
 */

// Opcodes (WebAssembly core + fixed-width SIMD proposals).
const I32 = 0x7f;
const V128 = 0x7b;
const LOCAL_GET = 0x20;
const LOCAL_SET = 0x21;
const LOCAL_TEE = 0x22;
const I32_LOAD = 0x28;
const I32_CONST = 0x41;
const I32_EQZ = 0x45;
const I32_ADD = 0x6a;
const I32_SUB = 0x6b;
const BLOCK = 0x02;
const LOOP = 0x03;
const BR_IF = 0x0d;
const END = 0x0b;
const VOID = 0x40;
const simd = (op: number) => [0xfd, ...uleb(op)];
const V128_LOAD = (offset: number) => [...simd(0), 0, ...uleb(offset)];
const V128_LOAD64_ZERO = [...simd(93), 0, 0];
const V128_STORE = [...simd(11), 0, 0];
const V128_CONST = (bytes: number[]) => [...simd(12), ...bytes];
const I8X16_SWIZZLE = simd(14);
const I32X4_SPLAT = simd(17);
const I8X16_NARROW_I16X8_U = simd(102);
const I16X8_NARROW_I32X4_U = simd(134);
const I32X4_SHR_S = simd(172);
const I32X4_ADD = simd(174);
const I32X4_MUL = simd(181);
const I32X4_DOT_I16X8_S = simd(186);
const I8X16_SHUFFLE = (lanes: number[]) => [...simd(13), ...lanes];
const I16X8_EXTEND_LOW_I8X16_U = simd(137);
const I16X8_EXTEND_HIGH_I8X16_U = simd(138);
const I32X4_EXTEND_LOW_I16X8_U = simd(169);
const I32X4_EXTEND_HIGH_I16X8_U = simd(170);
const F32X4_SPLAT = simd(19);
const F32X4_SUB = simd(229);
const F32X4_DIV = simd(231);
const F32X4_CONVERT_I32X4_U = simd(251);
const V128_STORE_AT = (offset: number) => [...simd(11), 0, ...uleb(offset)];
const F32 = 0x7d;

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

/** Signed LEB128, as i32.const takes its operand (64 is not one byte: bit 6 is the sign). */
function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (b & 0x40) === 0) || (n === -1 && (b & 0x40) !== 0)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
}

const get = (i: number) => [LOCAL_GET, i];
const set = (i: number) => [LOCAL_SET, i];
const addTo = (i: number, n: number) => [...get(i), I32_CONST, ...sleb(n), I32_ADD, ...set(i)];
/** `local[i] -= 1; loop again while it is not 0` */
const countdown = (i: number) => [...get(i), I32_CONST, 1, I32_SUB, LOCAL_TEE, i, BR_IF, 0];
/** `block; if local[i] == 0 exit; loop { body }` */
const repeat = (i: number, body: number[]) => [
  BLOCK,
  VOID,
  ...get(i),
  I32_EQZ,
  BR_IF,
  0,
  LOOP,
  VOID,
  ...body,
  END,
  END,
];

// Bytes R_a G_a B_a R_b G_b B_b -> int16 lanes R_a R_b G_a G_b B_a B_b 0 0 (index >= 16 gives 0).
const Z = 0x80;
const PAIR_MASK = [0, Z, 3, Z, 1, Z, 4, Z, 2, Z, 5, Z, Z, Z, Z, Z];

// hpass(src, offs, weights, outW, row)
const hpass = [
  0, // no locals
  ...repeat(3, [
    ...get(4),
    ...get(0),
    ...get(1),
    I32_LOAD,
    2,
    0,
    I32_ADD,
    ...V128_LOAD64_ZERO,
    ...V128_CONST(PAIR_MASK),
    ...I8X16_SWIZZLE,
    ...get(2),
    ...V128_LOAD(0),
    ...I32X4_DOT_I16X8_S,
    ...V128_STORE,
    ...addTo(1, 4),
    ...addTo(2, 16),
    ...addTo(4, 12),
    ...countdown(3),
  ]),
  END,
];

// vpass(r0, r1, b0, b1, blocks, out); locals 6, 7: b0 and b1 splatted.
const term = (row: number, weight: number, offset: number) => [
  ...get(row),
  ...V128_LOAD(offset),
  I32_CONST,
  4,
  ...I32X4_SHR_S,
  ...get(weight),
  ...I32X4_MUL,
  I32_CONST,
  16,
  ...I32X4_SHR_S,
];
const four = (offset: number) => [
  ...term(0, 6, offset),
  ...term(1, 7, offset),
  ...I32X4_ADD,
  I32_CONST,
  2,
  ...I32X4_SPLAT,
  ...I32X4_ADD,
  I32_CONST,
  2,
  ...I32X4_SHR_S,
];
const vpass = [
  1,
  2,
  V128, // two v128 locals
  ...get(2),
  ...I32X4_SPLAT,
  ...set(6),
  ...get(3),
  ...I32X4_SPLAT,
  ...set(7),
  ...repeat(4, [
    ...get(5),
    ...four(0),
    ...four(16),
    ...I16X8_NARROW_I32X4_U,
    ...four(32),
    ...four(48),
    ...I16X8_NARROW_I32X4_U,
    ...I8X16_NARROW_I16X8_U,
    ...V128_STORE,
    ...addTo(0, 64),
    ...addTo(1, 64),
    ...addTo(5, 16),
    ...countdown(4),
  ]),
  END,
];

// planar(rgb, blocks, outR, outG, outB, meanR, stdR, meanG, stdG, meanB, stdB): 16 RGB pixels
// per block to three float planes, each value ((v / 255) - mean) / std in float32 — the same
// three correctly rounded operations normalize.ts's lookup tables are built with.
// Locals: 11-16 the mean/std splats, 17 the 255 splat, 18-20 v0..v2, 21 a channel, 22 lo, 23 hi.
const CH = 21;
const LO = 22;
const HI = 23;
// Deinterleave: channel c's 16 bytes sit at 3i + c of v0|v1|v2; two shuffles gather them.
function gather(c: number): number[] {
  const first = Array.from({ length: 16 }, (_, i) => (3 * i + c < 32 ? 3 * i + c : 0));
  const fromV2 = Array.from({ length: 16 }, (_, i) => (3 * i + c < 32 ? i : 16 + 3 * i + c - 32));
  return [...get(18), ...get(19), ...I8X16_SHUFFLE(first), ...get(20), ...I8X16_SHUFFLE(fromV2), ...set(CH)];
}
function normalizeChannel(out: number, mean: number, std: number): number[] {
  const quarter = (half: number, extend: number[], offset: number) => [
    ...get(out),
    ...get(half),
    ...extend,
    ...F32X4_CONVERT_I32X4_U,
    ...get(17),
    ...F32X4_DIV,
    ...get(mean),
    ...F32X4_SUB,
    ...get(std),
    ...F32X4_DIV,
    ...V128_STORE_AT(offset),
  ];
  return [
    ...get(CH),
    ...I16X8_EXTEND_LOW_I8X16_U,
    ...set(LO),
    ...get(CH),
    ...I16X8_EXTEND_HIGH_I8X16_U,
    ...set(HI),
    ...quarter(LO, I32X4_EXTEND_LOW_I16X8_U, 0),
    ...quarter(LO, I32X4_EXTEND_HIGH_I16X8_U, 16),
    ...quarter(HI, I32X4_EXTEND_LOW_I16X8_U, 32),
    ...quarter(HI, I32X4_EXTEND_HIGH_I16X8_U, 48),
  ];
}
const F32_255 = [0x43, 0x7f, 0x00, 0x00].reverse(); // 255.0f, little-endian
const planar = [
  1,
  13,
  V128, // locals 11..23
  ...[5, 6, 7, 8, 9, 10].flatMap((p) => [...get(p), ...F32X4_SPLAT, ...set(p + 6)]),
  0x43, // f32.const 255
  ...F32_255,
  ...F32X4_SPLAT,
  ...set(17),
  ...repeat(1, [
    ...get(0),
    ...V128_LOAD(0),
    ...set(18),
    ...get(0),
    ...V128_LOAD(16),
    ...set(19),
    ...get(0),
    ...V128_LOAD(32),
    ...set(20),
    ...gather(0),
    ...normalizeChannel(2, 11, 12),
    ...gather(1),
    ...normalizeChannel(3, 13, 14),
    ...gather(2),
    ...normalizeChannel(4, 15, 16),
    ...addTo(0, 48),
    ...addTo(2, 64),
    ...addTo(3, 64),
    ...addTo(4, 64),
    ...countdown(1),
  ]),
  END,
];

const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];
const name = (s: string) => [...uleb(s.length), ...Array.from(s, (c) => c.charCodeAt(0))];

const MODULE = new Uint8Array([
  0x00,
  0x61,
  0x73,
  0x6d,
  0x01,
  0x00,
  0x00,
  0x00,
  ...section(
    1,
    vec([
      [0x60, 5, I32, I32, I32, I32, I32, 0],
      [0x60, 6, I32, I32, I32, I32, I32, I32, 0],
      [0x60, 11, I32, I32, I32, I32, I32, F32, F32, F32, F32, F32, F32, 0],
    ]),
  ),
  ...section(3, vec([[0], [1], [2]])),
  ...section(5, vec([[0, 1]])), // one memory, at least one page
  ...section(
    7,
    vec([
      [...name("memory"), 2, 0],
      [...name("hpass"), 0, 0],
      [...name("vpass"), 0, 1],
      [...name("planar"), 0, 2],
    ]),
  ),
  ...section(10, vec([hpass, vpass, planar].map((body) => [...uleb(body.length), ...body]))),
]);

// The WebAssembly global as far as it is used here (this package's TypeScript lib has no DOM types).
declare const WebAssembly: {
  validate(bytes: Uint8Array): boolean;
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { exports: unknown };
};

interface Kernels {
  memory: { buffer: ArrayBuffer; grow(pages: number): number };
  hpass(src: number, offs: number, weights: number, outW: number, row: number): void;
  vpass(r0: number, r1: number, b0: number, b1: number, blocks: number, out: number): void;
  planar(
    rgb: number,
    blocks: number,
    outR: number,
    outG: number,
    outB: number,
    meanR: number,
    stdR: number,
    meanG: number,
    stdG: number,
    meanB: number,
    stdB: number,
  ): void;
}

/** The SIMD kernels and the module memory they work in, laid out per call by resize.ts. */
export class SimdResizer {
  private bytes: Uint8Array;
  constructor(private readonly k: Kernels) {
    this.bytes = new Uint8Array(k.memory.buffer);
  }

  /** The module memory, at least `size` bytes (growing it replaces the buffer: call before taking views). */
  memory(size: number): Uint8Array {
    const have = this.k.memory.buffer.byteLength;
    if (size > have) this.k.memory.grow(Math.ceil((size - have) / 65536));
    if (this.bytes.buffer !== this.k.memory.buffer) this.bytes = new Uint8Array(this.k.memory.buffer);
    return this.bytes;
  }

  hpass(src: number, offs: number, weights: number, outW: number, row: number): void {
    this.k.hpass(src, offs, weights, outW, row);
  }

  vpass(r0: number, r1: number, b0: number, b1: number, blocks: number, out: number): void {
    this.k.vpass(r0, r1, b0, b1, blocks, out);
  }

  /** 16 * blocks RGB pixels at `rgb` (reads 48 per block) to float planes; mean/std per colour. */
  planar(rgb: number, blocks: number, outs: [number, number, number], mean: readonly number[], std: readonly number[]) {
    this.k.planar(rgb, blocks, ...outs, mean[0]!, std[0]!, mean[1]!, std[1]!, mean[2]!, std[2]!);
  }
}

let resizer: SimdResizer | null | undefined;

/** The kernels, or undefined where this runtime has no WebAssembly SIMD. */
export function simdResizer(): SimdResizer | undefined {
  if (resizer === undefined) {
    resizer = null;
    try {
      if (typeof WebAssembly === "object" && WebAssembly.validate(MODULE)) {
        const instance = new WebAssembly.Instance(new WebAssembly.Module(MODULE));
        resizer = new SimdResizer(instance.exports as unknown as Kernels);
      }
    } catch {
      resizer = null;
    }
  }
  return resizer ?? undefined;
}
