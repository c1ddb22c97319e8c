/**
 * Image formats in seed mode are those of the seed's `cv2.imdecode` (OpenCV 4.6):
 * BMP and PBM/PGM/PPM are decoded (by our own decoders, pixel for pixel as OpenCV's
 * grfmt_bmp.cpp / grfmt_pxm.cpp), GIF, AVIF, HEIF and SVG are refused naming the
 * format. Every file here is written by the test from known pixels, and its tensor
 * must equal, bit for bit, the tensor of the same pixels given as a (lossless) PNG.
 */
import { Code, type Stage, StageError } from "@trellis/stage";
import { readFixtureImage, readReferenceTensor } from "@trellis/testing";
import sharp from "sharp";
import { beforeAll, describe, expect, it } from "vitest";
import { createPreprocess } from "../src/index.js";
import { diff, preprocessOne, rawImageRequest } from "./helpers.js";

const seed = createPreprocess({ name: "resnet50_preprocess" });
const fast = createPreprocess({ name: "resnet50_preprocess", mode: "fast" });

/** An odd-width crop of chelsea: 301 * 3 = 903 bytes a row, so BMP rows carry 1 byte of padding. */
const W = 301;
const H = 227;
let rgb: Uint8Array;

beforeAll(async () => {
  const { data, info } = await sharp(readFixtureImage("chelsea.png"))
    .extract({ left: 70, top: 40, width: W, height: H })
    .removeAlpha()
    .raw()
    .toBuffer({ resolveWithObject: true });
  expect(info.channels).toBe(3);
  rgb = new Uint8Array(data);
});

const png = async (pixels: Uint8Array, width: number, height: number, channels: 1 | 3) =>
  new Uint8Array(await sharp(pixels, { raw: { width, height, channels } }).png().toBuffer());

/** Both tensors, byte for byte. */
async function expectSameTensor(stage: Stage, file: Uint8Array, reference: Uint8Array): Promise<void> {
  const got = await preprocessOne(stage, file);
  const want = await preprocessOne(stage, reference);
  expect(got.length).toBe(3 * 224 * 224);
  expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true);
}

async function failure(item: Uint8Array | string, stage: Stage = seed): Promise<StageError> {
  try {
    await stage.infer(rawImageRequest([item]));
  } catch (err) {
    if (err instanceof StageError) return err;
    throw err;
  }
  throw new Error("the request succeeded");
}

// ---- BMP writer -------------------------------------------------------------------------------

interface BmpOptions {
  bpp: 1 | 8 | 16 | 24 | 32;
  topDown?: boolean;
  /** BGRA entries, for bpp <= 8. */
  palette?: Uint8Array;
  /** Index per pixel (bpp <= 8), or 16-bit value per pixel (bpp 16), else RGB. */
  pixels: Uint8Array | Uint16Array;
  width: number;
  height: number;
  compression?: number;
}

function bmp(o: BmpOptions): Uint8Array {
  const pitch = ((o.width * o.bpp + 31) >> 5) << 2;
  const paletteBytes = o.palette?.length ?? 0;
  const offset = 14 + 40 + paletteBytes;
  const b = Buffer.alloc(offset + pitch * o.height);
  b.write("BM", 0, "latin1");
  b.writeUInt32LE(b.length, 2);
  b.writeUInt32LE(offset, 10);
  b.writeUInt32LE(40, 14);
  b.writeInt32LE(o.width, 18);
  b.writeInt32LE(o.topDown ? -o.height : o.height, 22);
  b.writeUInt16LE(1, 26);
  b.writeUInt16LE(o.bpp, 28);
  b.writeUInt32LE(o.compression ?? 0, 30);
  b.writeUInt32LE(pitch * o.height, 34);
  b.writeUInt32LE(paletteBytes / 4, 46);
  if (o.palette) b.set(o.palette, 54);
  for (let y = 0; y < o.height; y++) {
    const row = offset + (o.topDown ? y : o.height - 1 - y) * pitch;
    for (let x = 0; x < o.width; x++) {
      const p = y * o.width + x;
      if (o.bpp === 1) {
        if (o.pixels[p]) b[row + (x >> 3)] = (b[row + (x >> 3)] as number) | (0x80 >> (x & 7));
      } else if (o.bpp === 8) b[row + x] = o.pixels[p] as number;
      else if (o.bpp === 16) b.writeUInt16LE(o.pixels[p] as number, row + 2 * x);
      else {
        const n = o.bpp / 8;
        b[row + n * x] = o.pixels[3 * p + 2] as number;
        b[row + n * x + 1] = o.pixels[3 * p + 1] as number;
        b[row + n * x + 2] = o.pixels[3 * p] as number;
        if (n === 4) b[row + n * x + 3] = 0x5a; // alpha, dropped as IMREAD_COLOR does
      }
    }
  }
  return new Uint8Array(b);
}

// ---- PNM writer -------------------------------------------------------------------------------

function pnm(magic: string, width: number, height: number, maxval: number | undefined, body: Uint8Array | string) {
  const header = `${magic}\n# written by formats.test.ts\n${width} ${height}\n${maxval === undefined ? "" : `${maxval}\n`}`;
  const text = typeof body === "string" ? Buffer.from(body, "latin1") : Buffer.from(body);
  return new Uint8Array(Buffer.concat([Buffer.from(header, "latin1"), text]));
}

const grey = (p: Uint8Array) =>
  Uint8Array.from({ length: p.length / 3 }, (_, i) => ((p[3 * i] as number) + (p[3 * i + 2] as number)) >> 1);

describe("seed mode decodes BMP as cv2.imdecode does", () => {
  it("24-bit, bottom-up, odd width (row padding): same tensor as the PNG", async () => {
    await expectSameTensor(seed, bmp({ bpp: 24, pixels: rgb, width: W, height: H }), await png(rgb, W, H, 3));
  });

  it("24-bit, top-down (negative height): same tensor as the PNG", async () => {
    const file = bmp({ bpp: 24, pixels: rgb, width: W, height: H, topDown: true });
    await expectSameTensor(seed, file, await png(rgb, W, H, 3));
  });

  it("32-bit BGRA: alpha dropped, same tensor as the PNG", async () => {
    await expectSameTensor(seed, bmp({ bpp: 32, pixels: rgb, width: W, height: H }), await png(rgb, W, H, 3));
  });

  it("8-bit palettized: same tensor as the PNG of the palette's colours", async () => {
    // 3-3-2 bit quantisation: 256 colours, so each pixel is an index into a full palette.
    const palette = new Uint8Array(256 * 4);
    for (let i = 0; i < 256; i++) palette.set([(i & 3) << 6, ((i >> 2) & 7) << 5, (i >> 5) << 5, 0], 4 * i);
    const index = new Uint8Array(W * H);
    const quantised = new Uint8Array(W * H * 3);
    for (let p = 0; p < W * H; p++) {
      const i =
        (((rgb[3 * p] as number) >> 5) << 5) |
        (((rgb[3 * p + 1] as number) >> 5) << 2) |
        ((rgb[3 * p + 2] as number) >> 6);
      index[p] = i;
      quantised.set([palette[4 * i + 2] as number, palette[4 * i + 1] as number, palette[4 * i] as number], 3 * p);
    }
    const file = bmp({ bpp: 8, palette, pixels: index, width: W, height: H });
    await expectSameTensor(seed, file, await png(quantised, W, H, 3));
  });

  it("1-bit with a two-colour palette: same tensor as the PNG", async () => {
    const palette = Uint8Array.from([10, 200, 30, 0, 250, 40, 120, 0]);
    const bits = Uint8Array.from({ length: W * H }, (_, p) => (((p % W) >> 4) + ((p / W) >> 4)) & 1);
    const pixels = new Uint8Array(W * H * 3);
    for (let p = 0; p < W * H; p++) pixels.set(bits[p] ? [120, 40, 250] : [30, 200, 10], 3 * p);
    await expectSameTensor(
      seed,
      bmp({ bpp: 1, palette, pixels: bits, width: W, height: H }),
      await png(pixels, W, H, 3),
    );
  });

  it("16-bit 5-5-5: channels widened by a shift, as OpenCV does", async () => {
    const words = new Uint16Array(W * H);
    const pixels = new Uint8Array(W * H * 3);
    for (let p = 0; p < W * H; p++) {
      const [r, g, b] = [rgb[3 * p] as number, rgb[3 * p + 1] as number, rgb[3 * p + 2] as number];
      words[p] = ((r >> 3) << 10) | ((g >> 3) << 5) | (b >> 3);
      pixels.set([r & 0xf8, g & 0xf8, b & 0xf8], 3 * p);
    }
    await expectSameTensor(seed, bmp({ bpp: 16, pixels: words, width: W, height: H }), await png(pixels, W, H, 3));
  });

  it("a BMP of the whole chelsea photo gives chelsea.png's reference tensor exactly", async () => {
    const { data, info } = await sharp(readFixtureImage("chelsea.png"))
      .removeAlpha()
      .raw()
      .toBuffer({ resolveWithObject: true });
    const file = bmp({ bpp: 24, pixels: new Uint8Array(data), width: info.width, height: info.height });
    expect(diff(await preprocessOne(seed, file), readReferenceTensor("chelsea.png")).max).toBe(0);
  });
});

describe("seed mode decodes PBM/PGM/PPM as cv2.imdecode does", () => {
  it("P6 (binary RGB, maxval 255): same tensor as the PNG", async () => {
    await expectSameTensor(seed, pnm("P6", W, H, 255, rgb), await png(rgb, W, H, 3));
  });

  it("P6 with maxval 65535: 16-bit samples scaled down by >> 8, as OpenCV does", async () => {
    const wide = Buffer.alloc(rgb.length * 2);
    // The high byte is v; the low byte (0 or 200) is what >> 8 discards.
    for (let i = 0; i < rgb.length; i++) wide.writeUInt16BE((rgb[i] as number) * 256 + (i % 2) * 200, 2 * i);
    await expectSameTensor(seed, pnm("P6", W, H, 65535, new Uint8Array(wide)), await png(rgb, W, H, 3));
  });

  it("P5 (binary grey): same tensor as the grey PNG", async () => {
    const g = grey(rgb);
    await expectSameTensor(seed, pnm("P5", W, H, 255, g), await png(g, W, H, 1));
  });

  it("P3 (ASCII RGB, comments between samples): same tensor as the PNG", async () => {
    const words: string[] = [];
    for (let i = 0; i < rgb.length; i++)
      words.push(`${rgb[i]}${i % 17 === 16 ? "\n# a comment\n" : i % 3 === 2 ? "\n" : " "}`);
    await expectSameTensor(seed, pnm("P3", W, H, 255, words.join("")), await png(rgb, W, H, 3));
  });

  it("P2 with maxval 15: samples scaled to v * 255 / 15, as OpenCV does", async () => {
    const g = grey(rgb);
    const levels = Array.from(g, (v) => v >> 4);
    const scaled = Uint8Array.from(levels, (v) => Math.floor((v * 255) / 15));
    await expectSameTensor(seed, pnm("P2", W, H, 15, `${levels.join(" ")}\n`), await png(scaled, W, H, 1));
  });

  it("P4 and P1 (bilevel, 1 = black): same tensor as the PNG", async () => {
    const bits = Uint8Array.from({ length: W * H }, (_, p) => (((p % W) >> 3) + ((p / W) >> 3)) & 1);
    const pitch = (W + 7) >> 3;
    const packed = new Uint8Array(pitch * H);
    for (let p = 0; p < W * H; p++) {
      const x = p % W;
      const y = Math.floor(p / W);
      if (bits[p]) packed[y * pitch + (x >> 3)] = (packed[y * pitch + (x >> 3)] as number) | (0x80 >> (x & 7));
    }
    const grey8 = Uint8Array.from(bits, (b) => (b ? 0 : 255));
    const reference = await png(grey8, W, H, 1);
    await expectSameTensor(seed, pnm("P4", W, H, undefined, packed), reference);
    await expectSameTensor(seed, pnm("P1", W, H, undefined, `${Array.from(bits).join("")}\n`), reference);
  });
});

describe("seed mode refuses what cv2.imdecode refuses, naming the format", () => {
  it.each<[string, () => Promise<Uint8Array | string>, string]>([
    ["GIF", async () => new Uint8Array(await sharp(readFixtureImage("chelsea.png")).gif().toBuffer()), "gif"],
    [
      "AVIF",
      async () =>
        new Uint8Array(
          await sharp(rgb, { raw: { width: W, height: H, channels: 3 } })
            .avif({ effort: 0 })
            .toBuffer(),
        ),
      "avif",
    ],
    ["HEIF", async () => Uint8Array.from(Buffer.from("\0\0\0\x18ftypheic\0\0\0\0mif1heic", "latin1")), "heif"],
    ["SVG", async () => '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "svg"],
  ])("%s", async (_label, make, format) => {
    const err = await failure(await make());
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(
      new RegExp(
        `element 0: unsupported format ${format} in seed mode: the seed's OpenCV \\(cv2\\.imdecode\\) does not decode it`,
      ),
    );
  });

  it("JPEG 2000, which OpenCV can read, is refused as not decoded by this stage", async () => {
    const jp2 = Uint8Array.from(Buffer.from("\0\0\0\x0cjP  \r\n\x87\n\0\0\0\x14ftypjp2 ", "latin1"));
    const err = await failure(jp2);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/element 0: unsupported format jp2 \(JPEG 2000\): not decoded by this stage/);
  });

  it("fast mode still accepts GIF (first frame)", async () => {
    const gif = new Uint8Array(await sharp(readFixtureImage("chelsea.png")).gif().toBuffer());
    const out = await preprocessOne(fast, gif);
    expect(diff(out, readReferenceTensor("chelsea.png")).mean).toBeLessThan(0.1);
  });

  it("fast mode decodes BMP and PPM too, as it does the same pixels as PNG", async () => {
    const reference = await preprocessOne(fast, await png(rgb, W, H, 3));
    for (const file of [bmp({ bpp: 24, pixels: rgb, width: W, height: H }), pnm("P6", W, H, 255, rgb)]) {
      expect(diff(await preprocessOne(fast, file), reference).max).toBe(0);
    }
  });
});

describe("BMP and PNM files that are cut off, malformed or huge are refused with INVALID_ARGUMENT", () => {
  /** A 24-bit BMP header claiming width x height, with no pixel data. */
  const bmpHeader = (width: number, height: number, bpp = 24, compression = 0) => {
    const b = Buffer.alloc(54);
    b.write("BM", 0, "latin1");
    b.writeUInt32LE(54, 10);
    b.writeUInt32LE(40, 14);
    b.writeInt32LE(width, 18);
    b.writeInt32LE(height, 22);
    b.writeUInt16LE(1, 26);
    b.writeUInt16LE(bpp, 28);
    b.writeUInt32LE(compression, 30);
    return new Uint8Array(b);
  };

  it.each<[string, () => Uint8Array, RegExp]>([
    [
      "a truncated BMP",
      () => bmp({ bpp: 24, pixels: rgb, width: W, height: H }).subarray(0, 54 + 904 * 100 + 17),
      /truncated or corrupt bmp: pixel data needs 205208 bytes at offset 54, the file has 90417/,
    ],
    [
      "a BMP declaring 100000x100000",
      () => bmpHeader(100_000, 100_000),
      /100000x100000 = 10000000000 pixels exceed max_pixels 40000000 \(rejected before decoding\)/,
    ],
    [
      "a BMP declaring 6000x6000 (under max_pixels) with no pixel data",
      () => bmpHeader(6000, -6000),
      /truncated or corrupt bmp: pixel data needs 108000000 bytes at offset 54, the file has 0/,
    ],
    ["a BMP with 7 bits per pixel", () => bmpHeader(4, 4, 7), /corrupt bmp: unsupported bit depth 7/],
    ["a BMP with a header cut short", () => bmpHeader(4, 4).subarray(0, 30), /truncated or corrupt bmp: header/],
    [
      "a BMP with RLE8 compression",
      () => bmpHeader(4, 4, 8, 1),
      /unsupported bmp: RLE8 compression is not decoded by this stage/,
    ],
    [
      "a truncated PPM",
      () => pnm("P6", W, H, 255, rgb).subarray(0, 1000),
      /truncated or corrupt ppm: pixel data needs 204981 bytes, the file has 956 after the header/,
    ],
    [
      "a PGM declaring 100000x100000",
      () => pnm("P5", 100_000, 100_000, 255, new Uint8Array(16)),
      /100000x100000 = 10000000000 pixels exceed max_pixels 40000000 \(rejected before decoding\)/,
    ],
    [
      "a PPM with a letter in its header",
      () => pnm("P6", W, H, undefined, "abc\n"),
      /corrupt ppm: header: unexpected 'a'/,
    ],
    ["a PPM with maxval 70000", () => pnm("P6", 2, 2, 70000, new Uint8Array(24)), /corrupt ppm: maxval 70000/],
    [
      "an ASCII PPM with too few samples",
      () => pnm("P3", 4, 4, 255, `1 2 3 4 5 6\n# ${"-".repeat(200)}\n`),
      /truncated or corrupt ppm: 6 of 48 samples before the end of the file/,
    ],
    [
      "an ASCII PPM declaring 6000x6000 in a few bytes",
      () => pnm("P3", 6000, 6000, 255, "1 2 3 4 5 6\n"),
      /truncated or corrupt ppm: 108000000 samples need at least 215999999 bytes, the file has 12 after the header/,
    ],
    [
      "an ASCII PGM with a letter among its samples",
      () => pnm("P2", 2, 1, 255, "12 x\n"),
      /corrupt pgm: .*unexpected 'x'/,
    ],
  ])("%s", async (_label, make, message) => {
    const err = await failure(make());
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^resnet50_preprocess: input RAW_IMAGE element 0: /);
    expect(err.rawMessage).toMatch(message);
  });

  it("a small max_pixels refuses a BMP and a PPM from their headers", async () => {
    const small = createPreprocess({ name: "resnet50_preprocess", maxPixels: 10_000 });
    for (const file of [bmp({ bpp: 24, pixels: rgb, width: W, height: H }), pnm("P6", W, H, 255, rgb)]) {
      const err = await failure(file, small);
      expect(err.rawMessage).toContain(`element 0: ${W}x${H} = ${W * H} pixels exceed max_pixels 10000`);
    }
  });
});
