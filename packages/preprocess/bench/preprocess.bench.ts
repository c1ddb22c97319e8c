/**
 * `pnpm bench`: ms/image and images/s for seed and fast modes at 640x480,
 * 1920x1080 and 4000x3000 JPEGs, 1 and 2 requests in flight, beside the
 * seed's OpenCV preprocessing on the same files when python3 has cv2.
 *
 * Corpus: the sample CC0 photos (samples/images) resized (up) with sharp into a temp dir.
 * Not part of the package's public surface (src/index.ts does not export it).
 */
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createPreprocess } from "@trellis/preprocess";
import { bytesTensor } from "@trellis/stage";
import { fixtureImagesDir } from "@trellis/testing";
import sharp from "sharp";

const here = import.meta.dirname; // dist/bench
const script = join(here, "../../bench/opencv_preprocess.py");
const PHOTOS = ["chelsea.png", "coffee.png", "astronaut.jpg", "motorcycle_left.jpg"];
const SIZES: [number, number][] = [
  [640, 480],
  [1920, 1080],
  [4000, 3000],
];
/** Seconds of measurement per cell; BENCH_SECONDS overrides. */
const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);

async function makeCorpus(dir: string): Promise<Map<string, string[]>> {
  const corpus = new Map<string, string[]>();
  for (const [w, h] of SIZES) {
    const files: string[] = [];
    for (const photo of PHOTOS) {
      const file = join(dir, `${photo.replace(".png", "")}_${w}x${h}.jpg`);
      const jpeg = await sharp(join(fixtureImagesDir, photo))
        .resize(w, h, { fit: "cover", kernel: "lanczos3" })
        .jpeg({ quality: 90 })
        .toBuffer();
      writeFileSync(file, jpeg);
      files.push(file);
    }
    corpus.set(`${w}x${h}`, files);
  }
  return corpus;
}

interface Result {
  msPerImage: number;
  imagesPerSecond: number;
}

/** `inFlight` loops, each sending one-image requests back to back, for about SECONDS. */
async function benchStage(mode: "seed" | "fast", blobs: Uint8Array[], inFlight: number): Promise<Result> {
  const stage = createPreprocess({ mode });
  const request = (b: Uint8Array) => stage.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [b])] });
  for (const b of blobs) await request(b); // warm-up
  let images = 0;
  const start = performance.now();
  const deadline = start + SECONDS * 1000;
  await Promise.all(
    Array.from({ length: inFlight }, async (_, lane) => {
      let i = lane;
      while (performance.now() < deadline) {
        await request(blobs[i++ % blobs.length]!);
        images++;
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  return { msPerImage: (seconds * 1000 * inFlight) / images, imagesPerSecond: images / seconds };
}

function findPython(): string | undefined {
  for (const py of [process.env.PYTHON, "python3", "/usr/bin/python3"]) {
    if (!py) continue;
    try {
      execFileSync(py, ["-c", "import cv2"], { stdio: "ignore" });
      return py;
    } catch {}
  }
  return undefined;
}

function runPython(
  py: string,
  reps: number,
  files: string[],
): Promise<{ images: number; seconds: number; opencv: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(py, [script, String(reps), ...files], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`python exited ${code}`))));
  });
}

/** The seed's OpenCV pipeline: `inFlight` processes in parallel (Triton's instance_group count). */
async function benchOpenCV(py: string, files: string[], inFlight: number, estimateMs: number) {
  const reps = Math.max(1, Math.round((SECONDS * 1000) / estimateMs / files.length));
  const start = performance.now();
  const runs = await Promise.all(Array.from({ length: inFlight }, () => runPython(py, reps, files)));
  const images = runs.reduce((a, r) => a + r.images, 0);
  // Per-process timing excludes interpreter start-up; throughput uses the slowest process.
  const seconds = Math.max(...runs.map((r) => r.seconds));
  void start;
  return {
    msPerImage: (seconds * 1000 * inFlight) / images,
    imagesPerSecond: images / seconds,
    opencv: runs[0]!.opencv,
  };
}

const fmt = (x: number, digits = 1) => x.toFixed(digits);

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "trellis-preprocess-bench-"));
  try {
    const corpus = await makeCorpus(dir);
    const py = findPython();
    console.log(
      `preprocess bench: sharp ${sharp.versions.sharp} / libvips ${sharp.versions.vips}, node ${process.version}, ` +
        `UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE ?? "4 (default)"}, ${SECONDS}s per cell, ` +
        `corpus ${PHOTOS.length} photos per size (${dir})`,
    );
    if (!py) console.log("python3 with cv2 not found: OpenCV columns skipped (apt-get install python3-opencv)");
    const rows: string[] = [];
    const header =
      "| size | in flight | OpenCV ms/img | OpenCV img/s | seed ms/img | seed img/s | seed vs OpenCV | fast ms/img | fast img/s | fast vs OpenCV |";
    rows.push(header, "|---|---|---|---|---|---|---|---|---|---|");
    for (const [size, files] of corpus) {
      const blobs = files.map((f) => new Uint8Array(readFileSync(f)));
      for (const inFlight of [1, 2]) {
        const seed = await benchStage("seed", blobs, inFlight);
        const fast = await benchStage("fast", blobs, inFlight);
        const cv = py ? await benchOpenCV(py, files, inFlight, seed.msPerImage) : undefined;
        const ratio = (r: Result) => (cv ? `${fmt(r.imagesPerSecond / cv.imagesPerSecond, 2)}×` : "n/a");
        const row = `| ${size} | ${inFlight} | ${cv ? fmt(cv.msPerImage) : "n/a"} | ${cv ? fmt(cv.imagesPerSecond) : "n/a"} | ${fmt(seed.msPerImage)} | ${fmt(seed.imagesPerSecond)} | ${ratio(seed)} | ${fmt(fast.msPerImage)} | ${fmt(fast.imagesPerSecond)} | ${ratio(fast)} |`;
        rows.push(row);
        console.log(row);
      }
    }
    console.log(`\n${rows.join("\n")}`);
    console.log("ratio = images/s relative to OpenCV at the same in-flight count (higher is faster)");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
