/**
 * The floor of issue 57's large-BYTES load, in onnxruntime-node itself: a string identity model
 * (the one apps/server/bench/large-bytes.ts serves) run in this process on one tensor of
 * 10,485,760 one-letter strings, with no server, wire or worker between. For each of ROUNDS (3)
 * runs it prints the time to make the string array and the tensor, the run, and the whole, then
 * the process's peak RSS (VmHWM). The server's end-to-end time is compared with this floor.
 * Run: node packages/inference-onnx/dist/bench/bytes-floor.js (after pnpm build).
 */
import { readFileSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { identityModel } from "@trellis/testing";
import * as ort from "onnxruntime-node";

const ELEMENTS = 10_485_760;
const ROUNDS = Number(process.env.ROUNDS ?? 3);

const dir = await mkdtemp(join(tmpdir(), "trellis-bytes-floor-"));
const path = join(dir, "model.onnx");
await writeFile(path, identityModel([{ name: "IN", type: "string", shape: ["N"] }]));
const session = await ort.InferenceSession.create(path);
const peakMiB = () => {
  const line = readFileSync("/proc/self/status", "utf8").match(/VmHWM:\s+(\d+) kB/);
  return line ? Math.round(Number(line[1]) / 1024) : Number.NaN;
};

for (let round = 1; round <= ROUNDS; round++) {
  const t0 = performance.now();
  const strings = new Array<string>(ELEMENTS).fill("a");
  const tensor = new ort.Tensor("string", strings, [ELEMENTS]);
  const t1 = performance.now();
  const out = await session.run({ IN: tensor });
  const t2 = performance.now();
  const n = (out.IN_out as ort.Tensor).data.length;
  console.log(
    `round ${round}: tensor ${(t1 - t0).toFixed(0)} ms, run ${(t2 - t1).toFixed(0)} ms, total ${(t2 - t0).toFixed(0)} ms (${n} elements back)`,
  );
}
console.log(`VmHWM ${peakMiB()} MiB`);
await session.release();
await rm(dir, { recursive: true, force: true });
