/**
 * Seed mode against OpenCV itself, on images the shared reference tensors do not cover: a CMYK
 * JPEG and JPEGs tagged with EXIF orientations (the README's "Fidelity to the seed"). OpenCV runs
 * the seed's pipeline from bench/opencv_preprocess.py. Needs python3 with cv2 (Debian's
 * python3-opencv is OpenCV 4.6, the seed's); without it these tests are skipped, saying so.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readFixtureImage } from "@trellis/testing";
import sharp from "sharp";
import { afterAll, describe, expect, it } from "vitest";
import { createPreprocess } from "../src/index.js";
import { diff, preprocessOne } from "./helpers.js";

const BENCH = join(import.meta.dirname, "..", "bench");

function pythonWithCv2(): { python: string; version: string } | undefined {
  for (const python of [process.env.PYTHON, "python3", "/usr/bin/python3"]) {
    if (!python) continue;
    const r = spawnSync(python, ["-c", "import cv2; print(cv2.__version__)"], { encoding: "utf8" });
    if (r.status === 0) return { python, version: r.stdout.trim() };
  }
  return undefined;
}

const cv2 = pythonWithCv2();
// CI installs python3-opencv (.ci/run): there a missing cv2 is a failure, not a skip.
if (!cv2 && process.env.CI) throw new Error("python3 with cv2 not found in CI (apt-get install python3-opencv)");
if (!cv2)
  console.log("python3 with cv2 not found: the OpenCV comparisons are skipped (apt-get install python3-opencv)");

/** The seed's tensor for `file`, computed by OpenCV (float32, 3*224*224). */
function opencvTensor(file: string): Float32Array {
  const script = [
    "import sys",
    `sys.path.insert(0, ${JSON.stringify(BENCH)})`,
    "from opencv_preprocess import preprocess",
    "sys.stdout.buffer.write(preprocess(open(sys.argv[1], 'rb').read()).astype('<f4').tobytes())",
  ].join("\n");
  const out = execFileSync(cv2!.python, ["-c", script, file], { maxBuffer: 1 << 24 });
  return new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4);
}

describe.skipIf(!cv2)(`seed mode against OpenCV ${cv2?.version ?? ""}`, () => {
  const stage = createPreprocess();
  const chelseaPng = readFixtureImage("chelsea.png");
  const work = mkdtempSync(join(tmpdir(), "trellis-opencv-"));
  afterAll(() => rmSync(work, { recursive: true, force: true }));

  const compare = async (name: string, bytes: Uint8Array) => {
    const file = join(work, name);
    writeFileSync(file, bytes);
    const ours = await preprocessOne(stage, bytes);
    const theirs = opencvTensor(file);
    expect(theirs.length).toBe(3 * 224 * 224);
    return diff(ours, theirs);
  };

  it("is bit-identical on a CMYK JPEG written by sharp", async () => {
    const cmyk = new Uint8Array(await sharp(chelseaPng).toColourspace("cmyk").jpeg({ quality: 95 }).toBuffer());
    expect((await sharp(cmyk).metadata()).space).toBe("cmyk");
    expect((await compare("cmyk.jpg", cmyk)).max).toBe(0);
  });

  it.each([2, 3, 5, 6, 8])("is bit-identical on a JPEG with EXIF orientation %i", async (orientation) => {
    const tagged = new Uint8Array(
      await sharp(chelseaPng).jpeg({ quality: 95 }).withMetadata({ orientation }).toBuffer(),
    );
    expect((await sharp(tagged).metadata()).orientation).toBe(orientation);
    expect((await compare(`orientation-${orientation}.jpg`, tagged)).max).toBe(0);
  });
});
