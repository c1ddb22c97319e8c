/**
 * The stage's parameters: defaults are the seed's, config.pbtxt `parameters`
 * (string values, as Triton has them) override the defaults, and options
 * passed to the factory override both.
 */
import os from "node:os";
import type { ModelConfig } from "@trellis/protocol";
import { configParameter } from "@trellis/stage";
import { invalidArgument } from "@trellis/stage/backend";

export type Mode = "seed" | "fast";
export type Encoding = "auto" | "raw" | "base64";
export type ChannelOrder = "RGB" | "BGR";
export type Layout = "NCHW" | "NHWC";
export type OutputDatatype = "FP32" | "FP16";

export interface PreprocessParameters {
  /** Short side after resizing (the seed: 256). */
  resizeSize: number;
  /** Side of the square center crop (the seed: 224). */
  cropSize: number;
  /** Per-colour mean subtracted after /255, listed R, G, B whatever the channel order. */
  mean: [number, number, number];
  /** Per-colour std divided by after the mean, listed R, G, B. */
  std: [number, number, number];
  channelOrder: ChannelOrder;
  layout: Layout;
  outputDatatype: OutputDatatype;
  /** `seed`: matches the seed's OpenCV output; `fast`: libvips shrink-on-load + resize. */
  mode: Mode;
  /** How RAW_IMAGE elements are encoded: file bytes, base64 text, or detect. */
  encoding: Encoding;
  /** Largest accepted element, in encoded (file) bytes. */
  maxBytes: number;
  /** Largest accepted image, width x height, checked from the header before decoding. */
  maxPixels: number;
  /** Most scans a JPEG may have: each progressive scan is another decoding pass (a photo has about ten). */
  maxJpegScans: number;
  /** Most pixels an image over 2048x2048 may ask of each encoded byte: bounds decode work per byte sent. */
  maxPixelsPerByte: number;
  /** Images decoded at once by this stage, across requests. */
  concurrency: number;
}

export const DEFAULT_PARAMETERS: Readonly<PreprocessParameters> = Object.freeze<PreprocessParameters>({
  resizeSize: 256,
  cropSize: 224,
  mean: [0.485, 0.456, 0.406],
  std: [0.229, 0.224, 0.225],
  channelOrder: "RGB",
  layout: "NCHW",
  outputDatatype: "FP32",
  mode: "seed",
  encoding: "auto",
  maxBytes: 64 * 1024 * 1024,
  maxPixels: 40_000_000,
  maxJpegScans: 64,
  maxPixelsPerByte: 100,
  concurrency: Math.max(1, os.availableParallelism()),
});

/** config.pbtxt parameter keys, snake_case as Triton configs spell them. */
const KEYS: Record<keyof PreprocessParameters, string> = {
  resizeSize: "resize_size",
  cropSize: "crop_size",
  mean: "mean",
  std: "std",
  channelOrder: "channel_order",
  layout: "layout",
  outputDatatype: "output_datatype",
  mode: "mode",
  encoding: "encoding",
  maxBytes: "max_bytes",
  maxPixels: "max_pixels",
  maxJpegScans: "max_jpeg_scans",
  maxPixelsPerByte: "max_pixels_per_byte",
  concurrency: "concurrency",
};

function bad(stage: string, key: string, value: unknown, expected: string) {
  return invalidArgument(stage, `parameter ${key} = ${JSON.stringify(value)}: expected ${expected}`);
}

function positiveInt(stage: string, key: string, raw: string): number {
  const n = Number(raw.trim());
  if (!Number.isSafeInteger(n) || n <= 0) throw bad(stage, key, raw, "a positive integer");
  return n;
}

function triple(stage: string, key: string, raw: string): [number, number, number] {
  // Accept "0.485,0.456,0.406", "0.485 0.456 0.406" or a JSON array.
  const parts = raw
    .replace(/^\s*\[|\]\s*$/g, "")
    .split(/[\s,]+/)
    .filter((s) => s !== "");
  const values = parts.map(Number);
  if (values.length !== 3 || values.some((v) => !Number.isFinite(v))) {
    throw bad(stage, key, raw, "three numbers (R, G, B)");
  }
  return values as [number, number, number];
}

function oneOf<T extends string>(stage: string, key: string, raw: string, allowed: readonly T[]): T {
  const upper = allowed.find((a) => a.toLowerCase() === raw.trim().toLowerCase());
  if (!upper) throw bad(stage, key, raw, `one of ${allowed.join(", ")}`);
  return upper;
}

/** Parameters present in a config's `parameters` map, parsed; absent ones are left out. */
export function parametersFromConfig(config: ModelConfig, stage = config.name): Partial<PreprocessParameters> {
  const out: Partial<PreprocessParameters> = {};
  const get = (key: string) => configParameter(config, key);
  const set = <K extends keyof PreprocessParameters>(k: K, parse: (raw: string) => PreprocessParameters[K]) => {
    const raw = get(KEYS[k]);
    if (raw !== undefined) out[k] = parse(raw);
  };
  set("resizeSize", (r) => positiveInt(stage, "resize_size", r));
  set("cropSize", (r) => positiveInt(stage, "crop_size", r));
  set("mean", (r) => triple(stage, "mean", r));
  set("std", (r) => triple(stage, "std", r));
  set("channelOrder", (r) => oneOf(stage, "channel_order", r, ["RGB", "BGR"] as const));
  set("layout", (r) => oneOf(stage, "layout", r, ["NCHW", "NHWC"] as const));
  set("outputDatatype", (r) => oneOf(stage, "output_datatype", r, ["FP32", "FP16"] as const));
  set("mode", (r) => oneOf(stage, "mode", r, ["seed", "fast"] as const));
  set("encoding", (r) => oneOf(stage, "encoding", r, ["auto", "raw", "base64"] as const));
  set("maxBytes", (r) => positiveInt(stage, "max_bytes", r));
  set("maxPixels", (r) => positiveInt(stage, "max_pixels", r));
  set("maxJpegScans", (r) => positiveInt(stage, "max_jpeg_scans", r));
  set("maxPixelsPerByte", (r) => positiveInt(stage, "max_pixels_per_byte", r));
  set("concurrency", (r) => positiveInt(stage, "concurrency", r));
  return out;
}

/** Defaults, then `layers` in order (later wins), checked for consistency. */
export function resolveParameters(stage: string, ...layers: Partial<PreprocessParameters>[]): PreprocessParameters {
  const p: PreprocessParameters = {
    ...DEFAULT_PARAMETERS,
    mean: [...DEFAULT_PARAMETERS.mean],
    std: [...DEFAULT_PARAMETERS.std],
  };
  for (const layer of layers) {
    for (const [k, v] of Object.entries(layer)) if (v !== undefined) (p as unknown as Record<string, unknown>)[k] = v;
  }
  const int = (key: keyof PreprocessParameters) => {
    const v = p[key];
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0)
      throw bad(stage, KEYS[key], v, "a positive integer");
  };
  (
    ["resizeSize", "cropSize", "maxBytes", "maxPixels", "maxJpegScans", "maxPixelsPerByte", "concurrency"] as const
  ).forEach(int);
  if (p.cropSize > p.resizeSize) {
    throw invalidArgument(
      stage,
      `parameter crop_size = ${p.cropSize} is larger than resize_size = ${p.resizeSize}: the crop must fit the resized short side`,
    );
  }
  for (const key of ["mean", "std"] as const) {
    const v = p[key];
    if (!Array.isArray(v) || v.length !== 3 || v.some((x) => !Number.isFinite(x))) {
      throw bad(stage, key, v, "three numbers (R, G, B)");
    }
  }
  if (p.std.some((s) => s === 0)) throw bad(stage, "std", p.std, "non-zero values");
  const enums: [keyof PreprocessParameters, readonly string[]][] = [
    ["channelOrder", ["RGB", "BGR"]],
    ["layout", ["NCHW", "NHWC"]],
    ["outputDatatype", ["FP32", "FP16"]],
    ["mode", ["seed", "fast"]],
    ["encoding", ["auto", "raw", "base64"]],
  ];
  for (const [key, allowed] of enums) {
    if (!allowed.includes(p[key] as string)) throw bad(stage, KEYS[key], p[key], `one of ${allowed.join(", ")}`);
  }
  return p;
}
