/** Issue 46: decode work bounded before libvips starts (JPEG scans, pixels per byte), under load. */
import { Code, StageError } from "@trellis/stage";
import { readFixtureImage } from "@trellis/testing";
import sharp from "sharp";
import { describe, expect, it } from "vitest";
import { countJpegScans, headerSize } from "../src/decode-cost.js";
import { createPreprocess } from "../src/index.js";
import { rawImageRequest } from "./helpers.js";

/** Each segment of a JPEG: its marker, and its bytes (a scan's with its entropy-coded data). */
function jpegSegments(b: Uint8Array): { marker: number; bytes: Uint8Array }[] {
  const out: { marker: number; bytes: Uint8Array }[] = [];
  let i = 2;
  while (i < b.length) {
    const marker = b[i + 1] as number;
    if (marker === 0xd9) break;
    let end = i + 2 + (((b[i + 2] as number) << 8) | (b[i + 3] as number));
    if (marker === 0xda) {
      while (
        !(b[end] === 0xff && b[end + 1] !== 0 && !((b[end + 1] as number) >= 0xd0 && (b[end + 1] as number) <= 0xd7))
      )
        end++;
    }
    out.push({ marker, bytes: b.subarray(i, end) });
    i = end;
  }
  return out;
}

/**
 * A progressive JPEG whose last AC scan is sent `copies` more times: scan markers that cost
 * the file a few bytes each, as in the 2,647-scan image. (libvips refuses a repeated
 * scan as an inconsistent progression once it decodes it; the bound refuses before that.)
 */
async function manyScans(copies: number): Promise<Uint8Array> {
  const progressive = new Uint8Array(
    await sharp({ create: { width: 320, height: 240, channels: 3, background: { r: 30, g: 120, b: 200 } } })
      .jpeg({ progressive: true, quality: 90 })
      .toBuffer(),
  );
  const segments = jpegSegments(progressive);
  const lastScan = segments.filter((s) => s.marker === 0xda).at(-1)!.bytes;
  const parts = [progressive.subarray(0, 2), ...segments.map((s) => s.bytes)];
  for (let n = 0; n < copies; n++) parts.push(lastScan);
  parts.push(Uint8Array.of(0xff, 0xd9));
  return new Uint8Array(Buffer.concat(parts));
}

async function refusal(stage: ReturnType<typeof createPreprocess>, items: Uint8Array[]): Promise<StageError> {
  const err = await stage.infer(rawImageRequest(items)).catch((e: unknown) => e);
  if (!(err instanceof StageError)) throw new Error(`expected a StageError, got ${String(err)}`);
  return err;
}

const chelsea = readFixtureImage("chelsea.jpg");

describe("decode cost bounds", () => {
  it("counts a JPEG's scans by its markers: a progressive photo has about ten, a baseline one", async () => {
    const photo = new Uint8Array(await sharp(chelsea).jpeg({ progressive: true }).toBuffer());
    expect(countJpegScans(photo, 64)).toBe(10);
    expect(countJpegScans(chelsea, 64)).toBe(1);
    expect(countJpegScans(await manyScans(500), 64)).toBe(65); // stops counting past the limit
    expect(countJpegScans(await manyScans(20), 64)).toBe(30);
  });

  it("refuses a JPEG over max_jpeg_scans with a 400 naming it, while good requests in flight are answered", async () => {
    const stage = createPreprocess({ name: "p" });
    const attack = await manyScans(1_000);
    // Lifted, the bound lets it through to libvips, which answers otherwise.
    const lifted = createPreprocess({ name: "p", maxJpegScans: 2_000 });
    expect((await refusal(lifted, [attack])).rawMessage).not.toContain("max_jpeg_scans");
    const [good1, bad, good2] = await Promise.allSettled([
      stage.infer(rawImageRequest([chelsea])),
      refusal(stage, [chelsea, attack]),
      stage.infer(rawImageRequest([chelsea])),
    ]);
    expect([good1.status, good2.status]).toEqual(["fulfilled", "fulfilled"]);
    const err = (bad as PromiseFulfilledResult<StageError>).value;
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe(
      "p: input RAW_IMAGE element 1: JPEG with more than max_jpeg_scans 64 scans (progressive scans are decoding passes; rejected before decoding)",
    );
    // A progressive photo (ten scans) is decoded.
    const photo = new Uint8Array(await sharp(chelsea).jpeg({ progressive: true }).toBuffer());
    expect((await stage.infer(rawImageRequest([photo]))).outputs[0]!.shape).toEqual([1, 3, 224, 224]);
  });

  it("reads PNG, GIF and WebP sizes from their headers", async () => {
    const blank = sharp({ create: { width: 3000, height: 2000, channels: 3, background: "white" } });
    const sizeOf = async (format: "png" | "gif" | "webp", options: object = {}) =>
      headerSize(new Uint8Array(await blank.clone().toFormat(format, options).toBuffer()), format);
    expect(await sizeOf("png")).toEqual({ width: 3000, height: 2000 });
    expect(await sizeOf("gif")).toEqual({ width: 3000, height: 2000 });
    expect(await sizeOf("webp")).toEqual({ width: 3000, height: 2000 });
    expect(await sizeOf("webp", { lossless: true })).toEqual({ width: 3000, height: 2000 });
  });

  it("refuses an image over 2048x2048 asking more than max_pixels_per_byte pixels of each byte", async () => {
    // 6000x6000 of flat colour, lossless WebP: 36 MP (under max_pixels) from a few KB.
    const flat = new Uint8Array(
      await sharp({ create: { width: 6000, height: 6000, channels: 3, background: { r: 90, g: 20, b: 160 } } })
        .webp({ lossless: true })
        .toBuffer(),
    );
    const stage = createPreprocess({ name: "p", mode: "fast" });
    const err = await refusal(stage, [chelsea, flat]);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe(
      `p: input RAW_IMAGE element 1: 6000x6000 = 36000000 pixels from ${flat.length} bytes exceed max_pixels_per_byte 100 (images over 4194304 pixels; rejected before decoding)`,
    );
    // The same bound on a JPEG (its size read from its frame header) and in seed mode.
    const flatJpeg = new Uint8Array(
      await sharp({ create: { width: 6000, height: 4000, channels: 3, background: "white" } })
        .jpeg()
        .toBuffer(),
    );
    const seed = createPreprocess({ name: "p" });
    expect((await refusal(seed, [flatJpeg])).rawMessage).toMatch(
      /^p: input RAW_IMAGE element 0: 6000x4000 = 24000000 pixels from \d+ bytes exceed max_pixels_per_byte 100 /,
    );
    // A small image is decoded whatever its ratio, and a big one with bytes enough for its pixels.
    const smallFlat = new Uint8Array(
      await sharp({ create: { width: 2000, height: 2000, channels: 3, background: "white" } })
        .png()
        .toBuffer(),
    );
    expect((await seed.infer(rawImageRequest([smallFlat]))).outputs[0]!.shape).toEqual([1, 3, 224, 224]);
    const lifted = createPreprocess({ name: "p", maxPixelsPerByte: 1_000_000 });
    expect((await lifted.infer(rawImageRequest([flatJpeg]))).outputs[0]!.shape).toEqual([1, 3, 224, 224]);
  });
});
