/**
 * A strict Windows BMP decoder giving the pixels OpenCV 4.6's `cv2.imdecode(IMREAD_COLOR)`
 * gives (modules/imgcodecs/src/grfmt_bmp.cpp), as RGB where OpenCV has BGR. libvips (sharp)
 * has no BMP loader, and the seed decodes BMP, so seed mode needs one.
 *
 * Decoded as OpenCV does: BITMAPCOREHEADER (12 bytes) and BITMAPINFOHEADER or any longer
 * header (>= 36 bytes; the palette follows the header, the pixels start at the file header's
 * offset); 1-, 4- and 8-bit palettized (indices past the palette are black), 16-bit 5-5-5
 * (BI_RGB or BI_BITFIELDS) and 5-6-5 (BI_BITFIELDS), channels widened by a plain shift
 * (`v << 3`, no bit replication); 24-bit; 32-bit with alpha dropped (BI_RGB, or BI_BITFIELDS
 * read as BGRA whatever the masks, as OpenCV does); rows bottom-up (positive height) or
 * top-down (negative), each padded to 4 bytes, the last one included. RLE4/RLE8, which
 * OpenCV also reads, are refused (not decoded by this stage), as are the JPEG/PNG-in-BMP
 * compressions OpenCV refuses.
 *
 * The input is untrusted: every read is bounds-checked, the size is checked against
 * max_pixels and the pixel data's length against the file before the output is allocated.
 */
import { checkPixels, ElementError, type RgbImage } from "./element-error.js";

const BI_RGB = 0;
const BI_RLE8 = 1;
const BI_RLE4 = 2;
const BI_BITFIELDS = 3;

const corrupt = (what: string) => new ElementError(`truncated or corrupt bmp: ${what}`);

export function decodeBmp(b: Uint8Array, maxPixels: number): RgbImage {
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const need = (end: number, what: string) => {
    if (b.length < end) throw corrupt(`${what} ends at byte ${end}, the file has ${b.length} bytes`);
  };
  need(18, "header");
  const offset = view.getInt32(10, true);
  const size = view.getInt32(14, true);
  let width: number;
  let height: number;
  let bpp: number;
  let compression = BI_RGB;
  let paletteAt = 14 + size;
  let entries = 0;
  let entrySize = 4;
  if (size >= 36) {
    need(50, "header");
    width = view.getInt32(18, true);
    height = view.getInt32(22, true);
    bpp = view.getUint16(28, true);
    compression = view.getUint32(30, true);
    const used = view.getInt32(46, true);
    if (bpp <= 8) {
      if (used < 0 || used > 256) throw corrupt(`palette of ${used} colours (at most 256)`);
      entries = used === 0 ? 1 << bpp : used;
    }
  } else if (size === 12) {
    need(26, "header");
    width = view.getUint16(18, true);
    height = view.getUint16(20, true);
    bpp = view.getUint16(24, true);
    paletteAt = 26;
    entrySize = 3;
    if (bpp <= 8) entries = 1 << bpp;
  } else {
    throw corrupt(`header size ${size} (expected 12, or 36 and more)`);
  }
  if (width <= 0 || height === 0) throw corrupt(`dimensions ${width}x${height}`);
  if (compression === BI_RLE8 || compression === BI_RLE4) {
    throw new ElementError(
      `unsupported bmp: ${compression === BI_RLE8 ? "RLE8" : "RLE4"} compression is not decoded by this stage (uncompressed BMP is)`,
    );
  }
  const known = size === 12 ? [1, 4, 8, 24, 32] : [1, 4, 8, 16, 24, 32];
  if (!known.includes(bpp)) throw corrupt(`unsupported bit depth ${bpp}`);
  const bitfields = compression === BI_BITFIELDS && (bpp === 16 || bpp === 32);
  if (compression !== BI_RGB && !bitfields) throw corrupt(`unsupported compression ${compression} for ${bpp}-bit`);
  const rows = Math.abs(height);
  const bottomUp = height > 0;
  checkPixels(width, rows, maxPixels);

  const palette = new Uint8Array(256 * 3); // RGB; entries the file leaves out stay black
  if (bpp <= 8) {
    need(paletteAt + entries * entrySize, `${entries}-colour palette`);
    for (let i = 0; i < entries; i++) {
      const at = paletteAt + i * entrySize;
      palette[3 * i] = b[at + 2] as number;
      palette[3 * i + 1] = b[at + 1] as number;
      palette[3 * i + 2] = b[at] as number;
    }
  }
  let rgb565 = false;
  if (bpp === 16 && bitfields) {
    need(paletteAt + 12, "colour masks");
    const r = view.getUint32(paletteAt, true);
    const g = view.getUint32(paletteAt + 4, true);
    const bl = view.getUint32(paletteAt + 8, true);
    if (bl === 0x1f && g === 0x7e0 && r === 0xf800) rgb565 = true;
    else if (!(bl === 0x1f && g === 0x3e0 && r === 0x7c00)) {
      throw corrupt(
        `16-bit colour masks r=0x${r.toString(16)} g=0x${g.toString(16)} b=0x${bl.toString(16)} (only 5-5-5 and 5-6-5)`,
      );
    }
  }

  const pitch = Math.ceil(Math.ceil((width * bpp) / 8) / 4) * 4;
  const dataBytes = pitch * rows;
  if (offset < 0 || offset + dataBytes > b.length) {
    throw corrupt(
      `pixel data needs ${dataBytes} bytes at offset ${offset}, the file has ${Math.max(0, b.length - Math.max(0, offset))}`,
    );
  }

  const out = new Uint8Array(width * rows * 3);
  if (bpp === 24 || bpp === 32) {
    bgrRows(b, out, offset, pitch, width, rows, bottomUp, bpp / 8);
    return { width, height: rows, rgb: out };
  }
  for (let y = 0; y < rows; y++) {
    const src = offset + (bottomUp ? rows - 1 - y : y) * pitch;
    let o = y * width * 3;
    switch (bpp) {
      case 1:
      case 4:
      case 8: {
        const perByte = 8 / bpp;
        const mask = (1 << bpp) - 1;
        for (let x = 0; x < width; x++) {
          const byte = b[src + Math.floor(x / perByte)] as number;
          const i = 3 * ((byte >> (8 - bpp * ((x % perByte) + 1))) & mask);
          out[o++] = palette[i] as number;
          out[o++] = palette[i + 1] as number;
          out[o++] = palette[i + 2] as number;
        }
        break;
      }
      case 16:
        for (let x = 0; x < width; x++) {
          const t = (b[src + 2 * x] as number) | ((b[src + 2 * x + 1] as number) << 8);
          out[o++] = rgb565 ? (t >> 8) & 0xf8 : (t >> 7) & 0xf8;
          out[o++] = rgb565 ? (t >> 3) & 0xfc : (t >> 2) & 0xf8;
          out[o++] = (t << 3) & 0xf8;
        }
        break;
    }
  }
  return { width, height: rows, rgb: out };
}

/** 24-bit BGR or 32-bit BGRA rows to top-down RGB (a loop of its own: the common case, kept monomorphic). */
function bgrRows(
  b: Uint8Array,
  out: Uint8Array,
  offset: number,
  pitch: number,
  width: number,
  rows: number,
  bottomUp: boolean,
  n: number,
): void {
  for (let y = 0, o = 0; y < rows; y++) {
    let s = offset + (bottomUp ? rows - 1 - y : y) * pitch;
    for (let x = 0; x < width; x++, s += n, o += 3) {
      out[o] = b[s + 2] as number;
      out[o + 1] = b[s + 1] as number;
      out[o + 2] = b[s] as number;
    }
  }
}
