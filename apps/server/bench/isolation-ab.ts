/**
 * Isolation without amplification (issue 45): what two clients whose every request fails a
 * whole onnxruntime run cost the good clients beside them. One server process, gatherModel
 * (@trellis/testing: three MatMuls, then GatherElements on a client-chosen column; dynamic
 * batching, max_batch_size 64, one instance, 2 ms delay). ISOLATION_AB_GOOD (24) closed-loop
 * good clients over HTTP/JSON, beside A: 2 more good clients (the control), or B: 2 clients
 * sending an out-of-range index. Same server, same run, interleaved rounds with the order
 * alternating (A B, B A, …), ISOLATION_AB_SECONDS (8) each after 1 s of warm-up; reported: the
 * good clients' req/s, p50 and p99 per round, B/A throughput per round with its median (target
 * ≥ 0.8) and B/A p99 (target ≤ 1.5), and the model's re-runs and quarantined requests. A 3 s
 * unmeasured warm-up comes first.
 * Run (after pnpm build): pnpm --filter @trellis/server bench:isolation
 */
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  closedLoop,
  GATHER_WIDTH,
  gatherConfig,
  gatherModel,
  interleavedRounds,
  median,
  percentile,
  removeDir,
  startServerProcess,
} from "@trellis/testing";

const SECONDS = Number(process.env.ISOLATION_AB_SECONDS ?? 8);
const ROUNDS = Number(process.env.ISOLATION_AB_ROUNDS ?? 4);
const GOOD = Number(process.env.ISOLATION_AB_GOOD ?? 24);
const MODEL = "gather";

const repo = await mkdtemp(join(tmpdir(), "trellis-isolation-ab-"));
await mkdir(join(repo, MODEL, "1"), { recursive: true });
await writeFile(join(repo, MODEL, "config.pbtxt"), gatherConfig(MODEL));
await writeFile(join(repo, MODEL, "1", "model.onnx"), gatherModel());
const server = await startServerProcess(["--model-repository", repo]);
const url = `${server.http}/v2/models/${MODEL}/infer`;

/** One row's request body; `index` out of [0, 64) fails the whole run it is merged into. */
function body(seed: number, index: number): string {
  const x = Array.from({ length: GATHER_WIDTH }, (_, i) => ((seed * 7 + i) % 17) / 8 - 1);
  return JSON.stringify({
    inputs: [
      { name: "x", datatype: "FP32", shape: [1, GATHER_WIDTH], data: x },
      { name: "idx", datatype: "INT64", shape: [1, 1], data: [index] },
    ],
  });
}

let goodFailed = 0;
async function post(payload: string, ok: boolean): Promise<void> {
  const res = await fetch(url, { method: "POST", body: payload, headers: { "content-type": "application/json" } });
  await res.arrayBuffer();
  if (ok && res.status !== 200) goodFailed++;
}

interface Phase {
  label: string;
  /** The two extra clients' request: good (the control) or failing. */
  extra: (n: number) => string;
  extraOk: boolean;
  rates: number[];
  p50s: number[];
  p99s: number[];
}

const phases: Phase[] = [
  {
    label: "A: + 2 good clients",
    extra: (n) => body(n, n % GATHER_WIDTH),
    extraOk: true,
    rates: [],
    p50s: [],
    p99s: [],
  },
  { label: "B: + 2 bad clients", extra: (n) => body(n, 1000 + (n % 2)), extraOk: false, rates: [], p50s: [], p99s: [] },
];

async function measure(phase: Phase, round: number): Promise<void> {
  let running = true;
  const extras = [0, 1].map(async (client) => {
    for (let n = client; running; n += 2) await post(phase.extra(n), phase.extraOk);
  });
  const r = await closedLoop((k) => post(body(k, k % GATHER_WIDTH), true), GOOD, SECONDS, { warmupSeconds: 1 });
  running = false;
  await Promise.all(extras);
  const rate = r.calls / r.seconds;
  phase.rates.push(rate);
  phase.p50s.push(median(r.latencies));
  phase.p99s.push(percentile(r.latencies, 99));
  console.log(
    `round ${round + 1} ${phase.label}: ${rate.toFixed(0)} good req/s, p50 ${median(r.latencies).toFixed(1)} ms, p99 ${percentile(r.latencies, 99).toFixed(1)} ms`,
  );
}

const metric = (text: string, name: string) =>
  Number(
    text
      .split("\n")
      .find((l) => l.startsWith(`${name}{`) && l.includes(`model="${MODEL}"`))
      ?.split(" ")
      .pop() ?? 0,
  );

try {
  // Unmeasured: the first executions (onnxruntime's, the JIT's) are slower than the rest.
  await closedLoop((k) => post(body(k, k % GATHER_WIDTH), true), GOOD, 3);
  await interleavedRounds(phases, ROUNDS, measure);
  const [a, b] = phases as [Phase, Phase];
  const ratios = b.rates.map((rate, i) => rate / a.rates[i]!);
  const p99Ratios = b.p99s.map((p99, i) => p99 / a.p99s[i]!);
  const metrics = await (await fetch(`${server.metrics}/metrics`)).text();
  console.log(
    `\nisolation A/B: ${GOOD} good clients over HTTP/JSON, ${ROUNDS} rounds of ${SECONDS} s; gatherModel (bs 64, 1 instance, 2 ms delay)`,
  );
  console.log("| phase | good throughput | good p50 / p99 |\n|---|---|---|");
  for (const p of phases) {
    console.log(
      `| ${p.label} | ${median(p.rates).toFixed(0)}/s | ${median(p.p50s).toFixed(1)} / ${median(p.p99s).toFixed(1)} ms |`,
    );
  }
  console.log(
    `B/A good throughput per round: ${ratios.map((r) => r.toFixed(3)).join(", ")}; median ${median(ratios).toFixed(3)}`,
  );
  console.log(
    `B/A good p99 per round: ${p99Ratios.map((r) => r.toFixed(3)).join(", ")}; median ${median(p99Ratios).toFixed(3)}`,
  );
  console.log(
    `good requests failed: ${goodFailed}; re-runs ${metric(metrics, "trellis_inference_rerun_count")}, quarantined ${metric(metrics, "trellis_inference_quarantined_count")}, executions ${metric(metrics, "nv_inference_exec_count")}, inferences ${metric(metrics, "nv_inference_count")}`,
  );
} finally {
  await server.stop();
  await removeDir(repo);
}
