/**
 * The seed preprocessing's reference tensors, made here rather than carried: 602 KB a photo is
 * too much to commit for each, and the script that makes them is short and ours. Each is made
 * once per checkout by scripts/reference-tensor.py (the seed's OpenCV steps) and kept in
 * packages/testing/.cache/reference; its SHA-256 must equal the one pinned in
 * fixtures/reference/sha256.json, so a different OpenCV fails loudly instead of moving the
 * reference under the tests.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";

const testingRoot = join(import.meta.dirname, "..");
const imagesDir = join(testingRoot, "..", "..", "samples", "images");
const cacheDir = join(testingRoot, ".cache", "reference");
const script = join(testingRoot, "scripts", "reference-tensor.py");
const pinsFile = join(testingRoot, "fixtures", "reference", "sha256.json");

/** Debian's python3 has OpenCV (python3-opencv); a python3 earlier on PATH may not. */
const python = (): string =>
  process.env.TRELLIS_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");

let pins: Record<string, string> | undefined;
/** Tensors already read and checked in this process: hashed once, not on every read. */
const checked = new Map<string, Buffer>();

const sha256 = (bytes: Uint8Array): string => createHash("sha256").update(bytes).digest("hex");

const readPins = (): Record<string, string> =>
  (pins ??= JSON.parse(readFileSync(pinsFile, "utf8")) as Record<string, string>);

const cachedFile = (photo: string): string => join(cacheDir, `${photo}.f32`);

/**
 * Makes every pinned tensor the cache lacks, in one Python run (importing OpenCV costs more
 * than a photo), each written aside and renamed: test files running at once may make the same.
 */
function makeMissingTensors(): void {
  const missing = Object.keys(readPins()).filter((photo) => !existsSync(cachedFile(photo)));
  if (missing.length === 0) return;
  mkdirSync(cacheDir, { recursive: true });
  const suffix = `${process.pid}.${Math.random().toString(36).slice(2)}.part`;
  const parts = missing.map((photo) => `${cachedFile(photo)}.${suffix}`);
  try {
    try {
      const pairs = missing.flatMap((photo, k) => [join(imagesDir, photo), parts[k]!]);
      execFileSync(python(), [script, ...pairs], { stdio: ["ignore", "ignore", "pipe"] });
    } catch (err) {
      const stderr = String((err as { stderr?: unknown }).stderr ?? "").trim();
      throw new Error(
        `making the reference tensors needs python3 with NumPy and OpenCV (Debian: python3-numpy python3-opencv; or set TRELLIS_PYTHON): ${stderr.split("\n").at(-1) ?? ""}`,
      );
    }
    for (const [k, photo] of missing.entries()) {
      const made = sha256(readFileSync(parts[k]!));
      if (made !== readPins()[photo])
        throw new Error(
          `the reference tensor made for '${photo}' has SHA-256 ${made}, not the pinned ${readPins()[photo]}: this OpenCV decodes or resizes differently from the seed's (OpenCV 4.6)`,
        );
    }
    for (const [k, photo] of missing.entries()) renameSync(parts[k]!, cachedFile(photo));
  } finally {
    for (const part of parts) rmSync(part, { force: true });
  }
}

/** The raw little-endian FP32 bytes of `photo`'s reference tensor (a photo of samples/images). */
export function referenceTensorBytes(photo: string): Buffer {
  const known = checked.get(photo);
  if (known) return known;
  const pinned = readPins()[photo];
  if (!pinned) throw new Error(`no reference tensor is pinned for '${photo}' (fixtures/reference/sha256.json)`);
  const file = cachedFile(photo);
  if (!existsSync(file)) makeMissingTensors();
  const bytes = readFileSync(file);
  if (sha256(bytes) !== pinned)
    throw new Error(`${file} does not match its pinned SHA-256: delete it to make it again`);
  checked.set(photo, bytes);
  return bytes;
}
