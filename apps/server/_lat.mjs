import { copyFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { frameBytes, grpcTransport } from "@trellis/stage";
import {
  fixtureImagesDir,
  grpcJsInferenceClient,
  makeSeedRepository,
  removeDir,
  startServerProcess,
} from "@trellis/testing";
import sharp from "sharp";

const photos = await Promise.all(
  ["chelsea.jpg", "coffee.jpg", "astronaut.jpg"].map(
    async (p) =>
      new Uint8Array(
        await sharp(join(fixtureImagesDir, p)).resize(1920, 1080, { fit: "cover" }).jpeg({ quality: 90 }).toBuffer(),
      ),
  ),
);
const repo = await makeSeedRepository({
  editConfig: (n, t) => (n === "resnet50_inference" ? t + (process.env.EXTRA ?? "") : t),
});
if (!process.env.MOBILE) await copyFile("/tmp/synth/model.onnx", join(repo, "resnet50_inference", "1", "model.onnx"));
const server = await startServerProcess(["--model-repository", repo]);
const client = createClient(GRPCInferenceService, grpcTransport(server.grpc));
const g = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
const reqs = photos.map((p) =>
  create(ModelInferRequestSchema, {
    modelName: "resnet50_ensemble",
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
    rawInputContents: [frameBytes([p])],
  }),
);
const greqs = photos.map((p) => ({
  model_name: "resnet50_ensemble",
  inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
  raw_input_contents: [Buffer.from(frameBytes([p]))],
}));
const stats = async () =>
  Object.fromEntries((await client.modelStatistics({})).modelStats.map((m) => [m.name, m.inferenceStats]));
for (const [label, call] of [
  ["connect", (i) => client.modelInfer(reqs[i % 3])],
  ["grpc-js", (i) => g.modelInfer(greqs[i % 3])],
]) {
  for (let i = 0; i < 5; i++) await call(i);
  const s0 = await stats();
  const N = Number(process.env.N ?? 40);
  const times = [];
  for (let i = 0; i < N; i++) {
    const t = performance.now();
    await call(i);
    times.push(performance.now() - t);
  }
  const s1 = await stats();
  times.sort((a, b) => a - b);
  let line = `${label}: client p50 ${times[N >> 1].toFixed(1)} mean ${(times.reduce((a, b) => a + b) / N).toFixed(1)} |`;
  for (const m of Object.keys(s1).sort()) {
    const d = (k) => Number(s1[m][k].ns - s0[m][k].ns) / N / 1e6;
    line += ` ${m.replace("resnet50_", "")} ${d("success").toFixed(2)} (q ${d("queue").toFixed(2)} in ${d("computeInput").toFixed(2)} inf ${d("computeInfer").toFixed(2)} out ${d("computeOutput").toFixed(2)})`;
  }
  console.log(line);
}
g.close();
await server.stop("SIGTERM");
await removeDir(repo);
