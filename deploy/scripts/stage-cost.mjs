#!/usr/bin/env node
/**
 * CPU cost per image of each stage of the split deployment, for sizing (deploy/README.md, "Scaling").
 *
 *   pnpm --filter @trellis/deploy stage-cost            (after `pnpm build`)
 *
 * Runs the split layout as four local server processes (preprocess, inference, postprocess, and
 * the ensemble front calling them over gRPC), sends images through the front over HTTP, 4 at a
 * time, and divides each process's CPU time (user + system, /proc/<pid>/stat) by the number of
 * images: core-ms per image, serving overhead included, as each Deployment would spend it.
 * Inference is measured with the shared MobileNetV2 (int8) and, when models/resnet50_inference/1/
 * model.onnx exists (`pnpm models:fetch`, or the synthetic stand-in: same graph and cost), ResNet-50 fp32.
 * Larger photos are made from chelsea.jpg with ImageMagick's `convert` when it is installed.
 */
import { execFileSync } from "node:child_process";
import { copyFile, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fixtureImagesDir, makeSeedRepository, modelsDir, startServerProcess } from "@trellis/testing";

const TICK_MS = 1000 / Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
const cpuMs = async (pid) => {
  const fields = (await readFile(`/proc/${pid}/stat`, "utf8")).split(") ")[1].split(" ");
  return (Number(fields[11]) + Number(fields[12])) * TICK_MS; // utime + stime
};

async function infer(http, bytes) {
  const header = JSON.stringify({
    inputs: [
      { name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1], parameters: { binary_data_size: bytes.length + 4 } },
    ],
  });
  const len = Buffer.alloc(4);
  len.writeUInt32LE(bytes.length);
  const res = await fetch(`${http}/v2/models/resnet50_ensemble/infer`, {
    method: "POST",
    body: Buffer.concat([Buffer.from(header), len, bytes]),
    headers: { "Inference-Header-Content-Length": String(header.length) },
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  await res.arrayBuffer();
}

async function measure(servers, bytes, n, concurrency = 4) {
  for (let i = 0; i < 4; i++) await infer(servers.front.http, bytes); // warm up
  const before = {};
  for (const [k, s] of Object.entries(servers)) before[k] = await cpuMs(s.proc.pid);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next++ < n) await infer(servers.front.http, bytes);
    }),
  );
  const out = {};
  for (const [k, s] of Object.entries(servers)) out[k] = ((await cpuMs(s.proc.pid)) - before[k]) / n;
  return out;
}

async function split(repository) {
  const stage = (model) =>
    startServerProcess(["--model-repository", repository, "--model-control-mode", "explicit", "--load-model", model]);
  const [pre, inf, post] = await Promise.all([
    stage("resnet50_preprocess"),
    stage("resnet50_inference"),
    stage("resnet50_postprocess"),
  ]);
  const endpoints = join(repository, "..", `endpoints-${process.pid}.json`);
  await writeFile(
    endpoints,
    JSON.stringify({ resnet50_preprocess: pre.grpc, resnet50_inference: inf.grpc, resnet50_postprocess: post.grpc }),
  );
  const front = await startServerProcess([
    "--model-repository",
    repository,
    "--model-control-mode",
    "explicit",
    "--load-model",
    "resnet50_ensemble",
    "--endpoints",
    endpoints,
  ]);
  return { preprocess: pre, inference: inf, postprocess: post, front };
}

const photos = [{ name: "chelsea.jpg 451x300", file: join(fixtureImagesDir, "chelsea.jpg"), n: 32 }];
const temp = [];
try {
  for (const [w, h] of [
    [1920, 1280],
    [4000, 2667],
  ]) {
    const file = join(tmpdir(), `stage-cost-${w}x${h}-${process.pid}.jpg`);
    execFileSync("convert", [join(fixtureImagesDir, "chelsea.jpg"), "-resize", `${w}x${h}!`, "-quality", "90", file]);
    temp.push(file);
    photos.push({ name: `chelsea.jpg resized ${w}x${h}`, file, n: 16 });
  }
} catch {
  console.log("(ImageMagick's convert not found: small photos only)");
}
photos.push({ name: "motorcycle_left.jpg 741x500", file: join(fixtureImagesDir, "motorcycle_left.jpg"), n: 16 });

const models = [{ name: "MobileNetV2 int8 (shared)", model: undefined }];
const resnet = join(modelsDir, "resnet50_inference", "1", "model.onnx");
try {
  await readFile(join(modelsDir, "resnet50_postprocess", "1", "imagenet_classes.txt"));
  models.push({ name: "ResNet-50 fp32 (models/)", model: resnet });
} catch {}

const rows = [];
for (const { name, model } of models) {
  const repository = await makeSeedRepository({ prefix: "stage-cost-" });
  if (model) await copyFile(model, join(repository, "resnet50_inference", "1", "model.onnx"));
  const servers = await split(repository);
  try {
    for (const photo of model ? photos.slice(0, 1) : photos) {
      const cost = await measure(servers, await readFile(photo.file), photo.n);
      rows.push({ model: name, photo: photo.name, ...cost });
      console.log(
        `${name.padEnd(26)} ${photo.name.padEnd(30)} ` +
          Object.entries(cost)
            .map(([k, v]) => `${k} ${v.toFixed(1)}`)
            .join("  ") +
          "  core-ms/image",
      );
    }
  } finally {
    await Promise.all(Object.values(servers).map((s) => s.stop("SIGTERM")));
    await rm(repository, { recursive: true, force: true });
    await rm(join(repository, "..", `endpoints-${process.pid}.json`), { force: true });
  }
}
for (const f of temp) await rm(f, { force: true });
