/**
 * Bounds on what one image may cost to decode, checked from its bytes before libvips
 * sees them: a progressive JPEG's scan count (each scan is another pass over every
 * coefficient, so thousands of them take seconds on a small file, as libjpeg-turbo's
 * security advice warns) and the pixels each encoded byte may ask for (a lossless
 * WebP of flat colour packs 40 MP into 100 KB and costs seconds).
 */
import { ElementError } from "./element-error.js";

/** Images up to this many pixels are decoded whatever their pixels per byte (2048 x 2048). */
export const PIXELS_FREE_OF_RATIO = 2048 * 2048;

/**
 * Counts a JPEG's start-of-scan markers, walking the marker segments and skipping each
 * scan's entropy-coded data to its next marker; stops counting past `limit`, so the
 * walk is at most one pass over the file, done by indexOf.
 */
export function countJpegScans(b: Uint8Array, limit: number): number {
  let scans = 0;
  let i = 2;
  while (i + 3 < b.length) {
    if (b[i] !== 0xff) return scans;
    const marker = b[i + 1] as number;
    // Fill bytes before a marker; RSTn and standalone markers have no length.
    if (marker === 0xff || (marker >= 0xd0 && marker <= 0xd7) || marker === 0x01) {
      i += marker === 0xff ? 1 : 2;
      continue;
    }
    if (marker === 0xd9) return scans;
    const length = ((b[i + 2] as number) << 8) | (b[i + 3] as number);
    i += 2 + length;
    if (marker !== 0xda) continue;
    if (++scans > limit) return scans;
    // Entropy-coded data: a marker is 0xFF followed by neither 0x00 (a stuffed byte) nor RSTn.
    for (;;) {
      i = b.indexOf(0xff, i);
      if (i < 0 || i + 1 >= b.length) return scans;
      const next = b[i + 1] as number;
      if (next === 0x00 || next === 0xff || (next >= 0xd0 && next <= 0xd7)) i += next === 0xff ? 1 : 2;
      else break;
    }
  }
  return scans;
}

/** Refuses a JPEG with more scans than `maxScans` (a progressive photo has about ten). */
export function checkJpegScans(b: Uint8Array, maxScans: number): void {
  const scans = countJpegScans(b, maxScans);
  if (scans > maxScans) {
    throw new ElementError(
      `JPEG with more than max_jpeg_scans ${maxScans} scans (progressive scans are decoding passes; rejected before decoding)`,
    );
  }
}

/** Refuses an image above PIXELS_FREE_OF_RATIO pixels that asks more than `maxPerByte` pixels of each file byte. */
export function checkPixelsPerByte(width: number, height: number, fileBytes: number, maxPerByte: number): void {
  const pixels = width * height;
  if (pixels <= PIXELS_FREE_OF_RATIO || pixels <= fileBytes * maxPerByte) return;
  throw new ElementError(
    `${width}x${height} = ${pixels} pixels from ${fileBytes} bytes exceed max_pixels_per_byte ${maxPerByte} ` +
      `(images over ${PIXELS_FREE_OF_RATIO} pixels; rejected before decoding)`,
  );
}

const u16be = (b: Uint8Array, i: number) => ((b[i] as number) << 8) | (b[i + 1] as number);
const u16le = (b: Uint8Array, i: number) => (b[i] as number) | ((b[i + 1] as number) << 8);
const u24le = (b: Uint8Array, i: number) => u16le(b, i) + (b[i + 2] as number) * 65536;
const u32be = (b: Uint8Array, i: number) => u16be(b, i) * 65536 + u16be(b, i + 2);
const tag = (b: Uint8Array, i: number) => String.fromCharCode(...b.subarray(i, i + 4));

/**
 * Width and height from a PNG, GIF or WebP header, read in microseconds so small files
 * keep their single libvips call; undefined when the header does not say (the caller
 * then asks libvips).
 */
export function headerSize(b: Uint8Array, format: string): { width: number; height: number } | undefined {
  if (format === "png" && b.length >= 24 && tag(b, 12) === "IHDR") return { width: u32be(b, 16), height: u32be(b, 20) };
  if (format === "gif" && b.length >= 10) return { width: u16le(b, 6), height: u16le(b, 8) };
  if (format === "webp" && b.length >= 30) {
    const chunk = tag(b, 12);
    if (chunk === "VP8X") return { width: u24le(b, 24) + 1, height: u24le(b, 27) + 1 };
    if (chunk === "VP8 ") return { width: u16le(b, 26) & 0x3fff, height: u16le(b, 28) & 0x3fff };
    if (chunk === "VP8L") {
      const bits = (b[21] as number) | ((b[22] as number) << 8) | ((b[23] as number) << 16) | ((b[24] as number) << 24);
      return { width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1 };
    }
  }
  return undefined;
}
