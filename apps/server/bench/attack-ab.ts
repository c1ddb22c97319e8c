/**
 * Issue 52's attacks (items 2–4), each measured as what two attacking clients cost the good
 * clients beside them, against two extra good clients (the control). One server process, one
 * repository: `gather` (gatherModel from @trellis/testing: an out-of-range index fails the whole
 * onnxruntime run it is merged into) and `twice` (a Python model, Y = 2·X, dynamic batching, one
 * instance; X[0] = 66 exits the process, 13 hangs past --python-execute-timeout-secs, 77 answers
 * X[1] MiB, ATTACK_AB_ANSWER_MIB (32) in the attack). Attacks:
 *   python-large-answer  good → gather, attack → twice answering 32 MiB each (item 2); a lone
 *                        answer's latency is printed first
 *   constant-large-answer  the same answers from `constant`, a TypeScript model answering one
 *                        32 MiB array made at load: the cost of sending such answers at all
 *   python-crash         good → twice, attack → twice with an input that exits model.py (item 3)
 *   python-hang          good → twice, attack → twice with an input that hangs model.py (item 3)
 *   onnx-bad-constant    good → gather, attack → gather with the same bad index (item 4)
 *   onnx-bad-changing    good → gather, attack → gather, a bad index on new content each time (item 4)
 * For each: interleaved rounds (A B, B A, …) of ATTACK_AB_SECONDS (6) after 1 s of warm-up each;
 * reported: good req/s per phase (median round), B/A per round with its median (target ≥ 0.8),
 * good requests failed, and the server's re-runs, quarantined runs and Python restarts.
 * The two extra clients (attack or control) run in a process of their own at the lowest CPU
 * priority (attack-worker.ts): on one 2-core machine that stands in for clients elsewhere, so the
 * ratio is what their requests cost the server, not what their own reading of 32 MiB answers or
 * looping on instant refusals costs the good clients' process (which, with the server, already
 * fills both cores). Also reported per phase: the extra clients' requests/s and the server's
 * CPU (its process and the Python stubs it started).
 * Run (after pnpm build): pnpm --filter @trellis/server bench:attacks [attack…]
 * (ATTACK_AB_ROUNDS 3, ATTACK_AB_GOOD 16; PYTHON=<python3 with numpy>, default /usr/bin/python3)
 */

import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  closedLoop,
  gatherConfig,
  gatherModel,
  interleavedRounds,
  median,
  removeDir,
  startServerProcess,
} from "@trellis/testing";
import { ANSWER_MIB, ATTACKS, type Attack, goodBody, type Target, twiceBody } from "./attack-bodies.js";

const SECONDS = Number(process.env.ATTACK_AB_SECONDS ?? 6);
const ROUNDS = Number(process.env.ATTACK_AB_ROUNDS ?? 3);
const GOOD = Number(process.env.ATTACK_AB_GOOD ?? 16);
const PYTHON = process.env.PYTHON ?? "/usr/bin/python3";

const TWICE_CONFIG = `name: "twice"
backend: "python"
max_batch_size: 64
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
`;

const TWICE_MODEL = `import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0][0] == 66:
                os._exit(1)
            if x[0][0] == 13:
                time.sleep(3600)
            if x[0][0] == 77:
                y = np.zeros((x.shape[0], int(x[0][1]) * 256 * 1024), dtype=np.float32)
            else:
                y = x * 2
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
`;

const CONSTANT_CONFIG = `name: "constant"
backend: "typescript"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1, 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1, -1 ] } ]
`;

/** Y: one ANSWER_MIB zero array, made once: every answer is the same memory. */
const CONSTANT_MODEL = `import { defineStage } from "@trellis/stage";
const y = new Float32Array(${ANSWER_MIB} * 256 * 1024);
export function createStage({ config, version }) {
  return defineStage({ config, version, compute() {
    return [{ name: "Y", datatype: "FP32", shape: [1, y.length], data: y }];
  } });
}
`;

const chosen = process.argv.slice(2);
const attacks = chosen.length > 0 ? ATTACKS.filter((a) => chosen.includes(a.name)) : ATTACKS;

const repo = await mkdtemp(join(tmpdir(), "trellis-attack-ab-"));
await mkdir(join(repo, "gather", "1"), { recursive: true });
await writeFile(join(repo, "gather", "config.pbtxt"), gatherConfig("gather"));
await writeFile(join(repo, "gather", "1", "model.onnx"), gatherModel());
await mkdir(join(repo, "twice", "1"), { recursive: true });
await writeFile(join(repo, "twice", "config.pbtxt"), TWICE_CONFIG);
await writeFile(join(repo, "twice", "1", "model.py"), TWICE_MODEL);
await mkdir(join(repo, "constant", "1"), { recursive: true });
await writeFile(join(repo, "constant", "config.pbtxt"), CONSTANT_CONFIG);
await writeFile(join(repo, "constant", "1", "model.mjs"), CONSTANT_MODEL);
const server = await startServerProcess([
  "--model-repository",
  repo,
  "--python-executable",
  PYTHON,
  "--python-execute-timeout-secs",
  "2",
]);

let goodFailed = 0;
async function post(model: Target, body: string, good: boolean): Promise<void> {
  const res = await fetch(`${server.http}/v2/models/${model}/infer`, {
    method: "POST",
    body,
    headers: { "content-type": "application/json" },
  });
  await res.arrayBuffer();
  if (good && res.status !== 200) goodFailed++;
}

async function metricsSum(name: string): Promise<number> {
  const text = await (await fetch(`${server.metrics}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((n, l) => n + Number(l.split(" ").pop()), 0);
}

interface Phase {
  label: string;
  /** The two extra clients send good requests (the control) or the attack's. */
  attacking: boolean;
  rates: number[];
  extraRates: number[];
}

/** CPU seconds used so far by `pid` and its descendants (utime + stime, reaped children included). */
async function cpuSeconds(pid: number): Promise<number> {
  const tick = 100; // USER_HZ on Linux
  let total = 0;
  const visit = async (p: number, withChildren: boolean) => {
    const stat = await readFile(`/proc/${p}/stat`, "utf8").catch(() => "");
    if (!stat) return;
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // fields[11..14]: utime stime cutime cstime (stat fields 14–17)
    total +=
      (Number(fields[11]) + Number(fields[12]) + (withChildren ? Number(fields[13]) + Number(fields[14]) : 0)) / tick;
    const children = await readFile(`/proc/${p}/task/${p}/children`, "utf8").catch(() => "");
    for (const child of children.split(" ").filter(Boolean)) await visit(Number(child), withChildren);
  };
  await visit(pid, true);
  return total;
}

/** The two extra clients, in a process of their own at the lowest priority, until stop() is called. */
function extraClients(attack: Attack, attacking: boolean) {
  const child = spawn(
    "nice",
    [
      "-n",
      "19",
      process.execPath,
      new URL("./attack-worker.js", import.meta.url).pathname,
      server.http,
      attack.name,
      attacking ? "attack" : "control",
    ],
    { stdio: ["ignore", "inherit", "inherit", "ipc"] },
  );
  const done = new Promise<{ sent: number; failedGood: number }>((resolve, reject) => {
    child.once("message", (m) => resolve(m as { sent: number; failedGood: number }));
    child.once("exit", (code) => reject(new Error(`the extra clients' process exited (${code}) before reporting`)));
  });
  return {
    stop: async () => {
      child.send("stop");
      const { sent, failedGood } = await done;
      goodFailed += failedGood;
      return sent;
    },
  };
}

async function runAttack(attack: Attack): Promise<string> {
  const phases: Phase[] = [
    { label: "A: + 2 good clients", attacking: false, rates: [], extraRates: [] },
    { label: "B: + 2 attacking clients", attacking: true, rates: [], extraRates: [] },
  ];
  const failedBefore = goodFailed;
  const counters = ["trellis_inference_rerun_count", "trellis_inference_quarantined_count"];
  const before = await Promise.all(counters.map(metricsSum));
  await closedLoop((k) => post(attack.good, goodBody(attack.good, k), true), GOOD, 2); // warm-up, unmeasured
  await interleavedRounds(phases, ROUNDS, async (phase, round) => {
    const extras = extraClients(attack, phase.attacking);
    const cpu0 = await cpuSeconds(server.proc.pid!);
    const t0 = performance.now();
    const r = await closedLoop((k) => post(attack.good, goodBody(attack.good, k), true), GOOD, SECONDS, {
      warmupSeconds: 1,
    });
    const sent = await extras.stop();
    const cpu = (await cpuSeconds(server.proc.pid!)) - cpu0;
    const wall = (performance.now() - t0) / 1000;
    phase.rates.push(r.calls / r.seconds);
    phase.extraRates.push(sent / wall);
    console.log(
      `  ${attack.name} round ${round + 1} ${phase.label}: ${(r.calls / r.seconds).toFixed(0)} good req/s, extra clients ${(sent / wall).toFixed(0)} req/s, server CPU ${((cpu / wall) * 100).toFixed(0)} %`,
    );
  });
  const after = await Promise.all(counters.map(metricsSum));
  const [a, b] = phases as [Phase, Phase];
  const ratios = b.rates.map((rate, i) => rate / a.rates[i]!);
  return `| ${attack.name} | ${median(a.rates).toFixed(0)}/s | ${median(b.rates).toFixed(0)}/s | ${ratios.map((r) => r.toFixed(2)).join(", ")} | **${median(ratios).toFixed(2)}** | ${median(a.extraRates).toFixed(0)}/s / ${median(b.extraRates).toFixed(0)}/s | ${goodFailed - failedBefore} | ${after[0]! - before[0]!} / ${after[1]! - before[1]!} |`;
}

/**
 * A lone large answer, the machine otherwise idle: its latency (median of 5, read with fetch in
 * this process) and the CPU the server and its Python stub spent on it (mean of the 5): what one
 * attacking request costs.
 */
async function loneLargeAnswer(): Promise<string> {
  const times: number[] = [];
  await post("twice", twiceBody(77, ANSWER_MIB), true);
  const cpu0 = await cpuSeconds(server.proc.pid!);
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    await post("twice", twiceBody(77, ANSWER_MIB), true);
    times.push(performance.now() - t0);
  }
  const cpuMs = (((await cpuSeconds(server.proc.pid!)) - cpu0) * 1000) / 5;
  return `a lone ${ANSWER_MIB} MiB Python answer over HTTP (binary): ${median(times).toFixed(1)} ms, server and stub CPU ${cpuMs.toFixed(0)} ms`;
}

try {
  if (attacks.some((a) => a.name === "python-large-answer")) {
    console.log(await loneLargeAnswer());
  }
  const rows: string[] = [];
  for (const attack of attacks) rows.push(await runAttack(attack));
  console.log(
    `\nattacks A/B: ${GOOD} good closed-loop clients over HTTP/JSON, ${ROUNDS} interleaved rounds of ${SECONDS} s`,
  );
  console.log(
    "| attack | A: + 2 good | B: + 2 attacking | B/A per round | B/A median | extra clients' req/s A / B | good failed | re-runs / quarantined |",
  );
  console.log("|---|---|---|---|---|---|---|---|");
  for (const row of rows) console.log(row);
} finally {
  await server.stop();
  await removeDir(repo);
}
