/**
 * Throughput of the seed ensemble in-process (preprocess -> ONNX Runtime with
 * the shared MobileNetV2 -> postprocess), against:
 *  - each stage alone (the bottleneck bounds any pipeline),
 *  - the sum-of-stage-costs ceiling 1 / sum(1 / stage throughput): the three
 *    stages share the CPUs, so a request costs the sum of its stages,
 *  - "client-side preprocessing, then inference-only": the same three stages
 *    called one after the other by the caller, no ensemble in between.
 * Every measurement runs CONCURRENCY requests in flight, one photo each.
 * Run: pnpm bench (after pnpm build). Env: BENCH_SECONDS, BENCH_CONCURRENCY, BENCH_ROUNDS,
 * BENCH_WARMUP_SECONDS (uncounted time before each measurement, default 0.5).
 */
import { cpus } from "node:os";
import { createEnsemble } from "@trellis/ensemble-runner";
import { loadStage, scanRepository } from "@trellis/model-repository";
import { parseModelConfig } from "@trellis/protocol";
import { defineStage, type InferRequest, type Stage, type Tensor, tensor } from "@trellis/stage";
import { closedLoop, fixturePhotos, makeSeedRepository, median, readFixtureImage, removeDir } from "@trellis/testing";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const PAIRS = Number(process.env.BENCH_PAIRS ?? 6);
/** Uncounted seconds before each measurement: every stage's queue fills up first. */
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 0.5);

/** Requests per second with `CONCURRENCY` callers looping over `requests` for SECONDS. */
async function throughput(
  run: (req: InferRequest) => Promise<unknown>,
  requests: InferRequest[],
  seconds = SECONDS,
): Promise<number> {
  const r = await closedLoop((i) => run(requests[i % requests.length]!), CONCURRENCY, seconds, {
    warmupSeconds: WARMUP_SECONDS,
  });
  return r.calls / r.seconds;
}

const single = (name: string, t: Tensor): Tensor => ({ ...t, name });

/** A stage that renames its input to its output: what is left is the runner's own cost. */
function passThrough(name: string): Stage {
  const config = parseModelConfig(`name: "${name}" backend: "typescript" max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]`);
  return defineStage({ config, compute: (req) => [{ ...req.inputs[0]!, name: "OUT" }] });
}

/** Microseconds the ensemble adds per request over calling three no-op stages directly. */
async function runnerOverhead(): Promise<{ ensembleUs: number; directUs: number }> {
  const steps = ["s0", "s1", "s2"].map(passThrough);
  const config = parseModelConfig(`name: "noop" platform: "ensemble" max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    ensemble_scheduling { step [
      { model_name: "s0" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "a" } },
      { model_name: "s1" model_version: -1 input_map { key: "IN" value: "a" } output_map { key: "OUT" value: "b" } },
      { model_name: "s2" model_version: -1 input_map { key: "IN" value: "b" } output_map { key: "OUT" value: "Y" } } ] }`);
  const ensemble = await createEnsemble({ config, resolveStep: (m) => steps[Number(m.slice(1))]! });
  const req = { inputs: [tensor("X", "FP32", [1, 4], new Float32Array(4))] };
  const direct = async (r: InferRequest) => {
    let t = r.inputs[0]!;
    for (const s of steps) t = (await s.infer({ inputs: [{ ...t, name: "IN" }] })).outputs[0]!;
    return t;
  };
  const time = async (f: (r: InferRequest) => Promise<unknown>) => {
    const n = 50_000;
    for (let i = 0; i < 5_000; i++) await f(req);
    const t0 = performance.now();
    for (let i = 0; i < n; i++) await f(req);
    return ((performance.now() - t0) * 1000) / n;
  };
  const ensembleUs = median([
    await time((r) => ensemble.infer(r)),
    await time((r) => ensemble.infer(r)),
    await time((r) => ensemble.infer(r)),
  ]);
  const directUs = median([await time(direct), await time(direct), await time(direct)]);
  return { ensembleUs, directUs };
}

async function main() {
  const repo = await makeSeedRepository({ prefix: "trellis-bench-" });
  try {
    const { models } = await scanRepository([repo]);
    const load = (name: string) => {
      const m = models.find((x) => x.name === name)!;
      return loadStage(m, { version: "1" });
    };
    const [pre, inf, post] = await Promise.all([
      load("resnet50_preprocess"),
      load("resnet50_inference"),
      load("resnet50_postprocess"),
    ]);
    const byName: Record<string, Stage> = {
      resnet50_preprocess: pre,
      resnet50_inference: inf,
      resnet50_postprocess: post,
    };
    // The ensemble runs the very stage instances measured alone.
    const ensembleModel = models.find((x) => x.name === "resnet50_ensemble")!;
    const ensemble = await loadStage(ensembleModel, { version: "1", resolveStep: (m) => byName[m]! });

    const raw = fixturePhotos().map(readFixtureImage);
    const rawRequests = raw.map((b) => ({ inputs: [tensor("RAW_IMAGE", "BYTES", [1, 1], [b])] }));
    // Inputs for the later stages alone: what the earlier stages produce for the same photos.
    const pixels = await Promise.all(rawRequests.map(async (r) => (await pre.infer(r)).outputs[0]!));
    const logits = await Promise.all(
      pixels.map(async (p) => (await inf.infer({ inputs: [single("input", p)] })).outputs[0]!),
    );
    const infRequests = pixels.map((p) => ({ inputs: [single("input", p)] }));
    const postRequests = logits.map((l) => ({ inputs: [single("LOGITS", l)] }));

    const chain = async (req: InferRequest) => {
      const p = await pre.infer(req);
      const l = await inf.infer({ inputs: [single("input", p.outputs[0]!)] });
      return post.infer({ inputs: [single("LOGITS", l.outputs[0]!)] });
    };
    const cases: [string, () => Promise<number>][] = [
      ["preprocess alone", () => throughput((r) => pre.infer(r), rawRequests)],
      ["inference alone", () => throughput((r) => inf.infer(r), infRequests)],
      ["postprocess alone", () => throughput((r) => post.infer(r), postRequests)],
      ["ensemble (in-process)", () => throughput((r) => ensemble.infer(r), rawRequests)],
      ["client-side preprocess, then inference-only (+ postprocess)", () => throughput(chain, rawRequests)],
    ];
    // Warm up every path once, then take the median of ROUNDS interleaved rounds (the machine is shared).
    await Promise.all(rawRequests.map((r) => ensemble.infer(r)));
    const samples = new Map<string, number[]>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, measure] of cases) {
        const rps = await measure();
        samples.set(name, [...(samples.get(name) ?? []), rps]);
        console.error(`round ${round + 1}: ${name}: ${rps.toFixed(1)} req/s`);
      }
    }
    // Ensemble vs the caller's own chain, measured back to back in short pairs so load drift cancels out.
    const pairRatios: number[] = [];
    for (let i = 0; i < PAIRS; i++) {
      const e = await throughput((r) => ensemble.infer(r), rawRequests, 1.5);
      const c = await throughput(chain, rawRequests, 1.5);
      pairRatios.push(e / c);
    }
    const get = (n: string) => median(samples.get(n)!);
    const stagesAlone = ["preprocess alone", "inference alone", "postprocess alone"].map(get);
    const bottleneck = Math.min(...stagesAlone);
    const ceiling = 1 / stagesAlone.reduce((s, t) => s + 1 / t, 0);
    const ens = get("ensemble (in-process)");

    console.log(
      `\nseed ensemble, MobileNetV2 int8 stand-in, 1 photo/request, ${CONCURRENCY} in flight, median of ${ROUNDS} x ${SECONDS}s, ${cpus().length} CPUs, node ${process.version}\n`,
    );
    console.log("| measurement | req/s (median) | min..max | ensemble ÷ this |");
    console.log("| --- | ---: | ---: | ---: |");
    for (const [name] of cases) {
      const xs = samples.get(name)!;
      const range = `${Math.min(...xs).toFixed(1)}..${Math.max(...xs).toFixed(1)}`;
      console.log(`| ${name} | ${get(name).toFixed(1)} | ${range} | ${(ens / get(name)).toFixed(3)} |`);
    }
    console.log(`| bottleneck stage alone | ${bottleneck.toFixed(1)} | | ${(ens / bottleneck).toFixed(3)} |`);
    console.log(`| sum-of-stage-costs ceiling | ${ceiling.toFixed(1)} | | ${(ens / ceiling).toFixed(3)} |`);
    console.log(
      `\nensemble / ceiling = ${(ens / ceiling).toFixed(3)} (target >= 0.97); ensemble / client-side chain, ${PAIRS} back-to-back pairs: median ${median(pairRatios).toFixed(3)} [${pairRatios.map((r) => r.toFixed(2)).join(", ")}]`,
    );
    const { ensembleUs, directUs } = await runnerOverhead();
    console.log(
      `runner overhead, 3 no-op steps, sequential: ensemble ${ensembleUs.toFixed(1)} us/request vs direct calls ${directUs.toFixed(1)} us/request (+${(ensembleUs - directUs).toFixed(1)} us)`,
    );
    await ensemble.close();
    await Promise.all([pre.close(), inf.close(), post.close()]);
  } finally {
    await removeDir(repo);
  }
}

await main();
