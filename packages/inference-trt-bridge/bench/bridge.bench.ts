// Bench: FP16 conversion throughput and the bridge's round-trip cost over
// loopback gRPC against an echo stage (no model work, so the figure is the bridge + transport).

import { listenStage } from "@trellis/frontends";
import { createTrtBridge } from "@trellis/inference-trt-bridge";
import { parseModelConfig } from "@trellis/protocol";
import { defineStage, type Stage, tensor } from "@trellis/stage";
import { float16ArrayToFloat32, float32ArrayToFloat16, float32ToFloat16Bits } from "@trellis/stage/backend";

const config = parseModelConfig(`
name: "echo" max_batch_size: 256
input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]`);

function echoStage(): Stage {
  return defineStage({ config, compute: (req) => req.inputs.map((t) => ({ ...t, name: "output" })) });
}

const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;

const image = 3 * 224 * 224;
const big = Float32Array.from({ length: 64 * image }, (_, i) => Math.sin(i) * 3);
/** The baseline: the scalar conversion called per element in a plain loop (the loop's code before it had its own). */
const perElement = (src: Float32Array) => {
  const out = new Uint16Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = float32ToFloat16Bits(src[i] as number);
  return out;
};
/** Best of 5, in ms. */
const best = (f: () => unknown) => {
  f();
  let min = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 5; i++) {
    const t = process.hrtime.bigint();
    f();
    min = Math.min(min, ms(t));
  }
  return min;
};
const half = float32ArrayToFloat16(big);
const narrow = best(() => float32ArrayToFloat16(big));
const narrowBaseline = best(() => perElement(big));
const widen = best(() => float16ArrayToFloat32(half));
const mb = big.byteLength / 1e6;
console.log(
  `fp16 (batch 64 x 3x224x224, ${mb.toFixed(1)} MB FP32): FP32->FP16 ${(mb / (narrow / 1e3)).toFixed(0)} MB/s, ` +
    `${(narrowBaseline / narrow).toFixed(2)}x the per-element conversion (${(mb / (narrowBaseline / 1e3)).toFixed(0)} MB/s); ` +
    `FP16->FP32 ${(mb / (widen / 1e3)).toFixed(0)} MB/s of FP32 out`,
);
let t0: bigint;

const server = await listenStage(echoStage());
const bridge = await createTrtBridge({
  config: { ...config, name: "echo_bridge" },
  endpoint: server.url,
  modelName: "echo",
});
const direct = echoStage();
for (const batch of [1, 16, 64]) {
  const req = { inputs: [tensor("input", "FP32", [batch, 3, 224, 224], big.subarray(0, batch * image))] };
  const n = batch === 64 ? 10 : 30;
  for (let i = 0; i < 3; i++) await bridge.infer(req);
  t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await bridge.infer(req);
  const viaBridge = ms(t0) / n;
  t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await direct.infer(req);
  const inProcess = ms(t0) / n;
  console.log(
    `bridge round trip, batch ${batch} (${((batch * image * 4) / 1e6).toFixed(1)} MB each way): ${viaBridge.toFixed(2)} ms/request vs ${inProcess.toFixed(3)} ms in process (${n} requests)`,
  );
}
await bridge.close();
await server.close();
