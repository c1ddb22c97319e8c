/**
 * A strict Netpbm decoder (P1..P6: PBM, PGM, PPM) giving the pixels OpenCV 4.6's
 * `cv2.imdecode(IMREAD_COLOR)` gives (modules/imgcodecs/src/grfmt_pxm.cpp), as RGB where
 * OpenCV has BGR. libvips (sharp) has no PNM loader, and the seed decodes PNM, so seed
 * mode needs one.
 *
 * As OpenCV: the header's numbers may be separated by whitespace and `#` comments (to the
 * end of the line); the pixel data of P4/P5/P6 starts right after the one byte that ends
 * maxval (for PBM: the height). PBM: 1 is black. Binary P5/P6 with maxval <= 255: samples
 * are taken as they are (OpenCV does not rescale them); maxval 256..65535: big-endian
 * 16-bit samples, scaled to 8 bits by `v >> 8`. ASCII P2/P3: samples above maxval are
 * clamped to it, then scaled by `v * 255 / maxval` (integer division) for maxval <= 255,
 * by `v >> 8` above. Grey is replicated to three channels.
 *
 * The input is untrusted: every read is bounds-checked, the size is checked against
 * max_pixels and the data's length against the file before the output is allocated.
 */
import { checkPixels, ElementError, type RgbImage } from "./element-error.js";

export type PnmFormat = "pbm" | "pgm" | "ppm";

const isDigit = (c: number) => c >= 0x30 && c <= 0x39;
// C's isspace: space, \t, \n, \v, \f, \r.
const isSpace = (c: number) => c === 0x20 || (c >= 0x09 && c <= 0x0d);
const show = (c: number) => (c >= 0x21 && c <= 0x7e ? `'${String.fromCharCode(c)}'` : `byte 0x${c.toString(16)}`);

export function decodePnm(b: Uint8Array, format: PnmFormat, maxPixels: number): RgbImage {
  const corrupt = (what: string) => new ElementError(`truncated or corrupt ${format}: ${what}`);
  const kind = (b[1] as number) - 0x30; // 1..6, checked by the sniffer
  let pos = 2;

  /**
   * OpenCV's ReadNumber: skips whitespace and comments, reads up to `maxDigits` digits (0: any)
   * and, unless it stopped on maxDigits, the byte that ends the number. `undefined` at the end
   * of the data before any digit; `end` says whether the end may terminate the number.
   */
  const readNumber = (where: string, maxDigits = 0): number | undefined => {
    for (;;) {
      if (pos >= b.length) return undefined;
      const c = b[pos] as number;
      if (isDigit(c)) break;
      if (c === 0x23) {
        while (pos < b.length && b[pos] !== 0x0a && b[pos] !== 0x0d) pos++;
        pos++;
      } else if (isSpace(c)) pos++;
      else throw corrupt(`${where}: unexpected ${show(c)} at byte ${pos}`);
    }
    let value = 0;
    let digits = 0;
    while (pos < b.length && isDigit(b[pos] as number)) {
      value = value * 10 + ((b[pos] as number) - 0x30);
      if (value > 0x7fffffff) throw corrupt(`${where}: number too large at byte ${pos}`);
      pos++;
      if (maxDigits !== 0 && ++digits >= maxDigits) return value;
    }
    pos++; // the byte that ended the number
    return value;
  };
  const header = (name: string) => {
    const v = readNumber("header");
    if (v === undefined) throw corrupt(`header ends before its ${name}`);
    return v;
  };

  const width = header("width");
  const height = header("height");
  const maxval = kind === 1 || kind === 4 ? 1 : header("maxval");
  if (width <= 0 || height <= 0) throw corrupt(`dimensions ${width}x${height}`);
  if (maxval <= 0 || maxval > 65535) throw corrupt(`maxval ${maxval} (expected 1 to 65535)`);
  checkPixels(width, height, maxPixels);

  const channels = kind === 3 || kind === 6 ? 3 : 1;
  const samples = width * height * channels;
  const start = Math.min(pos, b.length);
  const available = b.length - start;
  const wide = maxval > 255;
  if (kind >= 4) {
    const needed = kind === 4 ? Math.ceil(width / 8) * height : samples * (wide ? 2 : 1);
    if (needed > available)
      throw corrupt(`pixel data needs ${needed} bytes, the file has ${available} after the header`);
  } else {
    // Each sample takes a digit; P2/P3 samples also a separator between them.
    const least = kind === 1 ? samples : 2 * samples - 1;
    if (least > available) {
      throw corrupt(`${samples} samples need at least ${least} bytes, the file has ${available} after the header`);
    }
  }

  const out = new Uint8Array(width * height * 3);
  const put = (p: number, v: number) => {
    if (channels === 1) {
      out[3 * p] = v;
      out[3 * p + 1] = v;
      out[3 * p + 2] = v;
    } else out[p] = v;
  };
  if (kind === 4) {
    const pitch = Math.ceil(width / 8);
    for (let y = 0, o = 0; y < height; y++) {
      const row = start + y * pitch;
      for (let x = 0; x < width; x++, o += 3) {
        const v = ((b[row + (x >> 3)] as number) >> (7 - (x & 7))) & 1 ? 0 : 255;
        out[o] = v;
        out[o + 1] = v;
        out[o + 2] = v;
      }
    }
  } else if (kind === 6 && !wide) {
    out.set(b.subarray(start, start + samples));
  } else if (kind >= 5) {
    const step = wide ? 2 : 1; // 16-bit: the big-endian high byte is v >> 8
    if (channels === 3) for (let i = 0; i < samples; i++) out[i] = b[start + step * i] as number;
    else {
      for (let i = 0, o = 0; i < samples; i++, o += 3) {
        const v = b[start + step * i] as number;
        out[o] = v;
        out[o + 1] = v;
        out[o + 2] = v;
      }
    }
  } else {
    // The 8-bit table as OpenCV builds it.
    const scale = (v: number) => (wide ? v >> 8 : Math.floor((v * 255) / maxval));
    for (let i = 0; i < samples; i++) {
      const v = readNumber("pixel data", kind === 1 ? 1 : 0);
      if (v === undefined) throw corrupt(`${i} of ${samples} samples before the end of the file`);
      put(i, kind === 1 ? (v !== 0 ? 0 : 255) : scale(Math.min(v, maxval)));
    }
  }
  return { width, height, rgb: out };
}
