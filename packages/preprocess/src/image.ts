/**
 * One RAW_IMAGE element to a cropSize x cropSize x 3 RGB uint8 crop:
 * unwrap (raw bytes or base64), sniff the format, read the header (size
 * limits before any pixel is decoded), decode with sharp/libvips on libuv's
 * thread pool, then resize + crop as the mode says.
 */
import sharp, { type Sharp, type SharpOptions } from "sharp";
import { decodeBmp } from "./bmp.js";
import { checkJpegScans, checkPixelsPerByte, headerSize } from "./decode-cost.js";
import { checkPixels, ElementError, type RgbImage } from "./element-error.js";
import type { Encoding, Mode } from "./options.js";
import { decodePnm } from "./pnm.js";
import { type AxisTable, axisTable, type RowSink, resizeRows, sourceSpan } from "./resize.js";

export { ElementError };

/**
 * Seed mode decodes what the seed's `cv2.imdecode` (OpenCV 4.6) decodes. OpenCV's imread
 * documentation (docs.opencv.org/4.6.0/d4/da8/group__imgcodecs.html#ga288b8b3da0892bd651fce07b3bbd3a56)
 * lists: Windows bitmaps (*.bmp, *.dib), JPEG, JPEG 2000, PNG, WebP, portable image format
 * (*.pbm, *.pgm, *.ppm, *.pxm, *.pnm), PFM, Sun rasters, TIFF, OpenEXR, Radiance HDR and
 * GDAL rasters; GIF, AVIF, HEIF and SVG are not among them (imdecode returns None). Of that
 * list seed mode decodes JPEG, PNG, WebP and TIFF with libvips, BMP and PBM/PGM/PPM with
 * its own decoders (src/bmp.ts, src/pnm.ts), and refuses the rest (OPENCV_ONLY) by name.
 */
export const SEED_FORMATS = ["jpeg", "png", "webp", "tiff", "bmp", "pbm", "pgm", "ppm"] as const;
/** Fast mode also takes what libvips decodes beyond OpenCV. */
export const FAST_FORMATS = [...SEED_FORMATS, "gif", "avif"] as const;
/** Every format some mode decodes (fast mode's list). */
export const SUPPORTED_FORMATS = FAST_FORMATS;
type Supported = (typeof FAST_FORMATS)[number];

/** Formats OpenCV's imdecode can read that this stage does not decode, with their names. */
const OPENCV_ONLY: Record<string, string> = {
  jp2: "JPEG 2000",
  exr: "OpenEXR",
  hdr: "Radiance HDR",
  pfm: "PFM",
  pam: "PAM",
  sunras: "Sun raster",
};

/** Why `format` is refused in `mode`, or undefined when the mode decodes it. */
export function formatRefusal(format: string, mode: Mode): string | undefined {
  if (mode === "fast") {
    if ((FAST_FORMATS as readonly string[]).includes(format)) return undefined;
    const name = OPENCV_ONLY[format] ? ` (${OPENCV_ONLY[format]})` : "";
    return `unsupported format ${format}${name} (fast mode decodes: ${FAST_FORMATS.join(", ")})`;
  }
  if ((SEED_FORMATS as readonly string[]).includes(format)) return undefined;
  const decodes = `seed mode decodes: ${SEED_FORMATS.join(", ")}`;
  if (OPENCV_ONLY[format]) {
    return `unsupported format ${format} (${OPENCV_ONLY[format]}): not decoded by this stage, although OpenCV can read it (${decodes})`;
  }
  const fast = (FAST_FORMATS as readonly string[]).includes(format) ? `; mode fast decodes ${format}` : "";
  return `unsupported format ${format} in seed mode: the seed's OpenCV (cv2.imdecode) does not decode it (${decodes}${fast})`;
}

const ascii = (b: Uint8Array, start: number, end: number) => String.fromCharCode(...b.subarray(start, end));
// C's isspace, as OpenCV's PNM signature check uses.
const isSpaceByte = (c: number | undefined) => c !== undefined && (c === 0x20 || (c >= 0x09 && c <= 0x0d));

/** The image format a file's first bytes announce, or undefined. */
export function sniffFormat(b: Uint8Array): string | undefined {
  if (b.length < 3) return undefined;
  // Netpbm, as OpenCV tells it: 'P', a digit, a whitespace byte.
  if (b[0] === 0x50 && isSpaceByte(b[2])) {
    const kind = b[1] as number;
    if (kind >= 0x31 && kind <= 0x36) return (["pbm", "pgm", "ppm"] as const)[(kind - 0x31) % 3];
    if (kind === 0x37) return "pam";
    if (kind === 0x46 || kind === 0x66) return "pfm";
  }
  if (b.length < 4) return undefined;
  if (b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "jpeg";
  if (b[0] === 0x89 && ascii(b, 1, 4) === "PNG") return "png";
  if (ascii(b, 0, 4) === "GIF8") return "gif";
  if (ascii(b, 0, 4) === "RIFF" && b.length >= 12 && ascii(b, 8, 12) === "WEBP") return "webp";
  if (
    (b[0] === 0x49 && b[1] === 0x49 && b[2] === 0x2a && b[3] === 0) ||
    (b[0] === 0x4d && b[1] === 0x4d && b[2] === 0 && b[3] === 0x2a)
  )
    return "tiff";
  if (b.length >= 12 && ascii(b, 4, 8) === "ftyp") {
    const brand = ascii(b, 8, 12);
    if (brand === "avif" || brand === "avis") return "avif";
    if (["heic", "heix", "hevc", "heim", "heis", "mif1", "msf1"].includes(brand)) return "heif";
    return undefined;
  }
  if (b[0] === 0x42 && b[1] === 0x4d) return "bmp";
  if (b[0] === 0xff && b[1] === 0x0a) return "jxl";
  if (b.length >= 12 && ascii(b, 4, 8) === "jP  ") return "jp2";
  if (b[0] === 0xff && b[1] === 0x4f && b[2] === 0xff && b[3] === 0x51) return "jp2"; // bare J2K codestream
  if (b[0] === 0x76 && b[1] === 0x2f && b[2] === 0x31 && b[3] === 0x01) return "exr";
  if (b[0] === 0x59 && b[1] === 0xa6 && b[2] === 0x6a && b[3] === 0x95) return "sunras";
  if (ascii(b, 0, 2) === "#?" && /^#\?(RADIANCE|RGBE)/.test(ascii(b, 0, Math.min(b.length, 12)))) return "hdr";
  if (ascii(b, 0, 4) === "%PDF") return "pdf";
  if (b[0] === 0x00 && b[1] === 0x00 && (b[2] === 0x01 || b[2] === 0x02) && b[3] === 0x00) return "ico";
  const head = ascii(b, 0, Math.min(b.length, 256)).trimStart();
  if (head.startsWith("<svg") || (head.startsWith("<?xml") && head.includes("<svg"))) return "svg";
  return undefined;
}

// base64 (standard or URL-safe alphabet), whitespace allowed; a data: URI prefix is stripped.
const B64 = new Uint8Array(256);
for (const c of "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_") B64[c.charCodeAt(0)] = 1;
const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** Decodes base64 text strictly; throws ElementError saying what is wrong. */
export function decodeBase64(text: Uint8Array, maxBytes: number): Uint8Array {
  let start = 0;
  if (text.length > 5 && ascii(text, 0, 5) === "data:") {
    const comma = text.indexOf(0x2c);
    if (comma < 0 || !ascii(text, 0, comma).endsWith(";base64")) {
      throw new ElementError("undecodable base64: a data: URI without ';base64,'");
    }
    start = comma + 1;
  }
  let chars = 0;
  let pad = 0;
  for (let i = start; i < text.length; i++) {
    const c = text[i] as number;
    if (isSpace(c)) continue;
    if (c === 0x3d) {
      pad++;
      continue;
    }
    if (pad > 0 || B64[c] !== 1) {
      const what = pad > 0 ? "data after '=' padding" : `invalid character 0x${c.toString(16).padStart(2, "0")}`;
      throw new ElementError(`undecodable base64: ${what} at offset ${i}`);
    }
    chars++;
  }
  if (chars === 0) throw new ElementError("undecodable base64: no base64 data");
  if (pad > 2 || chars % 4 === 1 || (pad > 0 && (chars + pad) % 4 !== 0)) {
    throw new ElementError(`undecodable base64: bad length (${chars} characters, ${pad} padding)`);
  }
  const decodedSize = Math.floor((chars * 3) / 4);
  if (decodedSize > maxBytes) {
    throw new ElementError(`${decodedSize} bytes (decoded from base64) exceed max_bytes ${maxBytes}`);
  }
  const s = Buffer.from(text.buffer, text.byteOffset + start, text.length - start).toString("latin1");
  return new Uint8Array(Buffer.from(s, "base64"));
}

/** The encoded image inside an element, and its format; throws ElementError. */
export function unwrap(
  element: Uint8Array,
  encoding: Encoding,
  maxBytes: number,
  mode: Mode = "seed",
): { bytes: Uint8Array; format: string } {
  if (element.length === 0) throw new ElementError("empty (0 bytes)");
  let bytes = element;
  let format = encoding === "base64" ? undefined : sniffFormat(element);
  if (encoding === "base64" || (encoding === "auto" && format === undefined)) {
    if (encoding === "auto" && !looksLikeText(element)) {
      throw new ElementError(
        `not an image: no known image signature (first bytes ${hex(element)}) and not base64 text`,
      );
    }
    bytes = decodeBase64(element, maxBytes);
    format = sniffFormat(bytes);
    if (format === undefined) {
      throw new ElementError(
        `not an image: base64 decoded to ${bytes.length} bytes with no known image signature (first bytes ${hex(bytes)})`,
      );
    }
  } else if (element.length > maxBytes) {
    throw new ElementError(`${element.length} bytes exceed max_bytes ${maxBytes}`);
  }
  if (format === undefined)
    throw new ElementError(`not an image: no known image signature (first bytes ${hex(element)})`);
  if (bytes.length > maxBytes) throw new ElementError(`${bytes.length} bytes exceed max_bytes ${maxBytes}`);
  const refusal = formatRefusal(format, mode);
  if (refusal !== undefined) throw new ElementError(refusal);
  return { bytes, format };
}

function looksLikeText(b: Uint8Array): boolean {
  const n = Math.min(b.length, 64);
  for (let i = 0; i < n; i++) {
    const c = b[i] as number;
    if (c < 0x09 || c > 0x7e) return false;
  }
  return true;
}

const hex = (b: Uint8Array) =>
  Array.from(b.subarray(0, 8), (x) => x.toString(16).padStart(2, "0")).join(" ") + (b.length > 8 ? " …" : "");

/** libvips appends to one error buffer, so a message can carry lines from earlier failures: keep the first. */
function vipsReason(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  const lines = msg.split("\n").filter((l) => l.trim() !== "");
  return (lines[0] ?? msg).trim();
}

export interface CropGeometry {
  resizedWidth: number;
  resizedHeight: number;
  left: number;
  top: number;
}

/** The seed's geometry: short side to resizeSize (long side truncated), then a centered crop. */
export function cropGeometry(width: number, height: number, resizeSize: number, cropSize: number): CropGeometry {
  let resizedWidth: number;
  let resizedHeight: number;
  if (height < width) {
    resizedHeight = resizeSize;
    resizedWidth = Math.trunc((width * resizeSize) / height);
  } else {
    resizedWidth = resizeSize;
    resizedHeight = Math.trunc((height * resizeSize) / width);
  }
  return {
    resizedWidth,
    resizedHeight,
    left: Math.floor((resizedWidth - cropSize) / 2),
    top: Math.floor((resizedHeight - cropSize) / 2),
  };
}

export interface DecodeSettings {
  mode: Mode;
  resizeSize: number;
  cropSize: number;
  maxPixels: number;
  /** Most scans a JPEG may have (max_jpeg_scans). */
  maxJpegScans: number;
  /** Most pixels an image over PIXELS_FREE_OF_RATIO may ask of each file byte (max_pixels_per_byte). */
  maxPixelsPerByte: number;
}

// libvips' own check and ours must agree, so sharp gets the same limit; "truncated"
// makes a cut-off file an error instead of grey fill, yet tolerates the benign
// libjpeg warnings (extraneous bytes and the like) that OpenCV also accepts.
const FAIL_ON = "truncated" as const;

/** Above this many encoded bytes (~2 MP of JPEG), seed mode reads the header first. */
const LARGE_FILE = 512 * 1024;

/**
 * Decodes one image to its crop, cropSize rows of cropSize RGB pixels, handed
 * row by row to `sink`. ICC profiles are ignored and alpha is dropped (not
 * composited), as OpenCV's IMREAD_COLOR does; EXIF orientation is applied, as
 * imdecode does.
 */
export async function decodeCrop(bytes: Uint8Array, format: string, s: DecodeSettings, sink: RowSink): Promise<void> {
  const input = { failOn: FAIL_ON, limitInputPixels: s.maxPixels, ignoreIcc: true } as const;
  if (format === "bmp" || format === "pbm" || format === "pgm" || format === "ppm") {
    // Formats libvips has no loader for: our own decoders (they throw ElementError only).
    const image = format === "bmp" ? decodeBmp(bytes, s.maxPixels) : decodePnm(bytes, format, s.maxPixels);
    return await resizeDecoded(image, s, sink);
  }
  try {
    // Decode work bounded before libvips starts: scans of a JPEG, pixels per byte of any file.
    if (format === "jpeg") checkJpegScans(bytes, s.maxJpegScans);
    const header = format === "jpeg" ? undefined : headerSize(bytes, format);
    if (header) {
      checkPixels(header.width, header.height, s.maxPixels);
      checkPixelsPerByte(header.width, header.height, bytes.length, s.maxPixelsPerByte);
    }
    if (format === "jpeg") {
      // JPEG's geometry, components and orientation come from its own header, read here in
      // microseconds instead of a libvips metadata call: seed mode's decode then keeps only
      // the rows and columns the crop reads, fast mode knows its resize at once.
      const h = jpegHeader(bytes);
      if (h !== undefined && h.components !== 4) {
        const turned = h.orientation >= 5;
        const size = { width: turned ? h.height : h.width, height: turned ? h.width : h.height };
        checkPixels(size.width, size.height, s.maxPixels);
        checkPixelsPerByte(size.width, size.height, bytes.length, s.maxPixelsPerByte);
        if (s.mode === "fast") {
          const g = cropGeometry(size.width, size.height, s.resizeSize, s.cropSize);
          return await decodeFast(bytes, input, g, s.cropSize, sink);
        }
        // Plain RGB, upright: no orientation or colour stage in the libvips pipeline at all.
        const plain = h.components === 3 && h.orientation === 1;
        return await decodeSeed(bytes, input, s, false, sink, size, plain);
      }
    }
    // Other small files: seed mode needs no geometry up front, so one libvips call does it all
    // (JPEG's CMYK is told from its frame header; TIFF's only from libvips' metadata).
    // Large files: a header read first lets the decode keep only the rows and columns
    // the crop reads, which saves more than the extra call costs.
    // (Only when the size was checked above: a CMYK JPEG's header was, for others the header read.)
    const sized = header !== undefined || (format === "jpeg" && jpegHeader(bytes) !== undefined);
    if (s.mode === "seed" && format !== "tiff" && bytes.length < LARGE_FILE && sized) {
      return await decodeSeed(bytes, input, s, format === "jpeg" && jpegComponents(bytes) === 4, sink);
    }
    const meta = await sharp(bytes, input).metadata();
    const width = meta.autoOrient?.width ?? meta.width;
    const height = meta.autoOrient?.height ?? meta.height;
    if (!width || !height) throw new ElementError(`${format} image without dimensions`);
    checkPixels(width, height, s.maxPixels);
    checkPixelsPerByte(width, height, bytes.length, s.maxPixelsPerByte);
    if (s.mode === "seed") return await decodeSeed(bytes, input, s, meta.space === "cmyk", sink, { width, height });
    return await decodeFast(bytes, input, cropGeometry(width, height, s.resizeSize, s.cropSize), s.cropSize, sink);
  } catch (err) {
    if (err instanceof ElementError) throw err;
    const reason = vipsReason(err);
    // libvips refuses over-limit images from the header, before decoding; say how big.
    if (/pixel limit/i.test(reason)) {
      const meta = await sharp(bytes, { ...input, limitInputPixels: false })
        .metadata()
        .catch(() => undefined);
      if (meta?.width && meta.height) checkPixels(meta.width, meta.height, s.maxPixels);
      throw new ElementError(`more pixels than max_pixels ${s.maxPixels} (rejected before decoding)`);
    }
    throw new ElementError(
      `truncated or corrupt ${format}: ${reason === LOST_REASON ? ownReason(bytes, format) : reason}`,
    );
  }
}

/**
 * What sharp says when libvips' error buffer was empty. That buffer is global and every
 * sharp pipeline clears it when it ends, so a decode finishing on another thread can wipe
 * this one's message before sharp reads it.
 */
const LOST_REASON = "Unknown error";

/** Our own account of a failed decode whose libvips message was lost. */
function ownReason(bytes: Uint8Array, format: string): string {
  if (format === "jpeg" && !jpegHasEnd(bytes))
    return "premature end of JPEG data (no end-of-image marker after the last scan)";
  return "the decoder failed (its message was lost to a concurrent decode)";
}

const lastMarker = (b: Uint8Array, marker: number): number => {
  for (let i = b.length - 2; i >= 0; i--) if (b[i] === 0xff && b[i + 1] === marker) return i;
  return -1;
};

/**
 * Whether a JPEG's last scan is followed by its end-of-image marker. Entropy-coded data never
 * holds FF D9 (a data FF is stuffed with 00), and an EXIF thumbnail's EOI comes before the
 * image's scans, so an EOI after the last start-of-scan is the image's own.
 */
export function jpegHasEnd(b: Uint8Array): boolean {
  return lastMarker(b, 0xd9) > lastMarker(b, 0xda);
}

/** Number of colour components in a JPEG's frame header (4 = CMYK/YCCK), or 0 if not found. */
export function jpegComponents(b: Uint8Array): number {
  return jpegHeader(b)?.components ?? 0;
}

export interface JpegHeader {
  width: number;
  height: number;
  components: number;
  /** EXIF orientation (1..8; 1 when there is no EXIF orientation tag). */
  orientation: number;
}

const u16 = (b: Uint8Array, i: number, le: boolean) =>
  le ? (b[i] as number) | ((b[i + 1] as number) << 8) : ((b[i] as number) << 8) | (b[i + 1] as number);
const u32 = (b: Uint8Array, i: number, le: boolean) =>
  le ? u16(b, i, true) + u16(b, i + 2, true) * 65536 : u16(b, i, false) * 65536 + u16(b, i + 2, false);

/**
 * A JPEG's frame header (SOF) and EXIF orientation, read from the marker segments
 * before the scan; undefined when anything is unusual (no frame header, a zero
 * dimension, two EXIF blocks, an EXIF block that does not parse, an orientation
 * outside 1..8), so the caller falls back to asking libvips.
 */
export function jpegHeader(b: Uint8Array): JpegHeader | undefined {
  let orientation: number | undefined;
  let i = 2;
  while (i + 9 < b.length) {
    if (b[i] !== 0xff) return undefined;
    const marker = b[i + 1] as number;
    if (marker === 0xff) {
      i++;
      continue;
    }
    const len = u16(b, i + 2, false);
    // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      const height = u16(b, i + 5, false);
      const width = u16(b, i + 7, false);
      if (width === 0 || height === 0) return undefined;
      return { width, height, components: b[i + 9] as number, orientation: orientation ?? 1 };
    }
    if (marker === 0xda) return undefined;
    // APP1 "Exif\0\0": libvips takes the orientation from IFD0's tag 0x0112.
    if (marker === 0xe1 && len >= 8 && ascii(b, i + 4, i + 10) === "Exif\0\0") {
      if (orientation !== undefined) return undefined;
      orientation = exifOrientation(b, i + 10, Math.min(b.length, i + 2 + len));
      if (orientation === undefined) return undefined;
    }
    i += 2 + len;
  }
  return undefined;
}

/** Orientation from a TIFF-structured EXIF block at [tiff, end): 1 if absent, undefined if malformed. */
function exifOrientation(b: Uint8Array, tiff: number, end: number): number | undefined {
  if (tiff + 8 > end) return undefined;
  const order = ascii(b, tiff, tiff + 2);
  if (order !== "II" && order !== "MM") return undefined;
  const le = order === "II";
  if (u16(b, tiff + 2, le) !== 42) return undefined;
  const ifd = tiff + u32(b, tiff + 4, le);
  if (ifd + 2 > end) return undefined;
  const count = u16(b, ifd, le);
  if (ifd + 2 + count * 12 > end) return undefined;
  for (let e = ifd + 2; e < ifd + 2 + count * 12; e += 12) {
    if (u16(b, e, le) !== 0x0112) continue;
    // SHORT, one value, stored in the entry itself.
    if (u16(b, e + 2, le) !== 3 || u32(b, e + 4, le) !== 1) return undefined;
    const v = u16(b, e + 8, le);
    return v >= 1 && v <= 8 ? v : undefined;
  }
  return 1;
}

/** To 3-channel 8-bit sRGB: grey is replicated, palettes expanded, alpha dropped, 16-bit scaled down. */
function toRgb8(img: Sharp): Sharp {
  return img.removeAlpha().toColourspace("srgb").raw({ depth: "uchar" });
}

async function decodeSeed(
  bytes: Uint8Array,
  input: SharpOptions,
  s: DecodeSettings,
  cmyk: boolean,
  sink: RowSink,
  size?: { width: number; height: number },
  plain = false,
): Promise<void> {
  let image = plain ? sharp(bytes, input) : sharp(bytes, input).autoOrient();
  let region = { left: 0, top: 0 };
  let tables: { xs: AxisTable; ys: AxisTable } | undefined;
  if (size) {
    // Geometry known: decode only the source rectangle the crop reads.
    tables = seedTables(size.width, size.height, s);
    const sx = sourceSpan(tables.xs);
    const sy = sourceSpan(tables.ys);
    region = { left: sx.start, top: sy.start };
    image = image.extract({ left: sx.start, top: sy.start, width: sx.end - sx.start, height: sy.end - sy.start });
  }
  const { data, info } = await (cmyk
    ? image.pipelineColourspace("cmyk").toColourspace("cmyk").raw({ depth: "uchar" })
    : plain
      ? image.raw({ depth: "uchar" })
      : toRgb8(image)
  ).toBuffer({ resolveWithObject: true });
  if (!cmyk && info.channels !== 3) throw new ElementError(`decoded to ${info.channels} channels, expected 3`);
  const rgb = cmyk ? cmykToRgbLikeOpenCV(data, info.channels) : data;
  const { xs, ys } = tables ?? seedTables(info.width, info.height, s);
  resizeRows(rgb, info.width, 3, xs, ys, region.left, region.top, sink);
}

// Coefficient tables by geometry: a service sees few distinct image sizes, and building
// them costs about as much as the resize itself at 640x480. Bounded, cleared when full.
const tableCache = new Map<string, { xs: AxisTable; ys: AxisTable }>();

function seedTables(width: number, height: number, s: DecodeSettings): { xs: AxisTable; ys: AxisTable } {
  const key = `${width} ${height} ${s.resizeSize} ${s.cropSize}`;
  const cached = tableCache.get(key);
  if (cached) return cached;
  const g = cropGeometry(width, height, s.resizeSize, s.cropSize);
  const tables = {
    xs: axisTable(width, g.resizedWidth, g.left, s.cropSize),
    ys: axisTable(height, g.resizedHeight, g.top, s.cropSize),
  };
  if (tableCache.size >= 256) tableCache.clear();
  tableCache.set(key, tables);
  return tables;
}

/**
 * OpenCV's own CMYK -> BGR (icvCvt_CMYK2BGR_8u_C4C3R on libjpeg's inverted
 * Adobe CMYK), not a colour-managed conversion: `R = k - ((255 - c) * k >> 8)`
 * with inverted c and k. libvips hands out non-inverted CMYK, hence 255 - x.
 */
function cmykToRgbLikeOpenCV(data: Uint8Array, channels: number): Uint8Array {
  if (channels < 4) throw new ElementError(`CMYK image decoded to ${channels} channels`);
  const pixels = data.length / channels;
  const out = new Uint8Array(pixels * 3);
  for (let p = 0; p < pixels; p++) {
    const i = p * channels;
    const k = 255 - (data[i + 3] as number);
    for (let c = 0; c < 3; c++) out[p * 3 + c] = k - (((data[i + c] as number) * k) >> 8);
  }
  return out;
}

/** An image our own decoders produced, resized and cropped as the mode says. */
async function resizeDecoded(image: RgbImage, s: DecodeSettings, sink: RowSink): Promise<void> {
  if (s.mode === "seed") {
    const { xs, ys } = seedTables(image.width, image.height, s);
    resizeRows(image.rgb, image.width, 3, xs, ys, 0, 0, sink);
    return;
  }
  const raw = { raw: { width: image.width, height: image.height, channels: 3 as const } };
  const g = cropGeometry(image.width, image.height, s.resizeSize, s.cropSize);
  await decodeFast(image.rgb, raw, g, s.cropSize, sink);
}

async function decodeFast(
  bytes: Uint8Array,
  input: SharpOptions,
  g: CropGeometry,
  crop: number,
  sink: RowSink,
): Promise<void> {
  const { data, info } = await toRgb8(
    sharp(bytes, input)
      .autoOrient()
      .resize(g.resizedWidth, g.resizedHeight, { fit: "fill", kernel: "cubic" })
      .extract({ left: g.left, top: g.top, width: crop, height: crop }),
  ).toBuffer({ resolveWithObject: true });
  if (info.channels !== 3) throw new ElementError(`decoded to ${info.channels} channels, expected 3`);
  for (let y = 0; y < crop; y++) sink(y, data, y * crop * 3);
}

export type { Supported };
