/**
 * Issue 45, isolation without amplification. An ONNX model (dynamic batching, max_batch_size
 * 64, one instance, a 2 ms delay) runs three MatMuls, then a GatherElements on a column the
 * client chooses: an out-of-range index fails the whole onnxruntime run. Two clients keep
 * sending such a request beside good clients over HTTP: every good request gets its own row,
 * every bad one its own refusal, the good ones keep merging (more than one row per execution),
 * and the re-runs that find the culprits stay within the budget (its burst, then 1 per 16
 * executions) while the rest of the bad requests run alone in the quarantine lane.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import {
  GATHER_WEIGHTS,
  GATHER_WIDTH,
  gatherConfig,
  gatherModel,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRepository, metricValue, postJson, scrape } from "./helpers.js";

const MODEL = "gather";
const WIDTH = GATHER_WIDTH;
const weights = GATHER_WEIGHTS;
const CONFIG = gatherConfig(MODEL);

/** What the model answers for x, column idx (in float64; compared with a tolerance). */
function expected(x: Float32Array, idx: number): number {
  let h: number[] = Array.from(x);
  for (let layer = 0; layer < 3; layer++) {
    const next = new Array<number>(WIDTH).fill(0);
    for (let i = 0; i < WIDTH; i++) for (let j = 0; j < WIDTH; j++) next[j]! += h[i]! * weights[i * WIDTH + j]!;
    h = next;
  }
  return h[idx]!;
}

const rowOf = (client: number, n: number) =>
  Float32Array.from({ length: WIDTH }, (_, i) => ((client * 31 + n * 7 + i) % 17) / 8 - 1);

function inferBody(x: Float32Array, idx: number, id: string) {
  return {
    id,
    inputs: [
      { name: "x", datatype: "FP32", shape: [1, WIDTH], data: Array.from(x) },
      { name: "idx", datatype: "INT64", shape: [1, 1], data: [idx] },
    ],
  };
}

describe("two clients sending a failing row beside good clients", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({ [MODEL]: { config: CONFIG } });
    await writeFile(join(repo, MODEL, "1", "model.onnx"), gatherModel());
    server = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  it("keeps the good requests merging, refuses each bad one on its own, and bounds the re-runs", async () => {
    const url = `${server.http}/v2/models/${MODEL}/infer`;
    const GOOD_CLIENTS = 12;
    const BAD_CLIENTS = 2;
    const PER_CLIENT = 60;
    const wrong: string[] = [];
    let goodOk = 0;
    let badRefused = 0;
    const good = async (client: number) => {
      for (let n = 0; n < PER_CLIENT; n++) {
        const x = rowOf(client, n);
        const idx = (client + n) % WIDTH;
        const id = `g${client}-${n}`;
        const { status, json } = await postJson(url, inferBody(x, idx, id));
        const y = json?.outputs?.[0]?.data?.[0];
        if (status !== 200 || json.id !== id || Math.abs(y - expected(x, idx)) > 1e-3 * (1 + Math.abs(y))) {
          wrong.push(`${id}: ${status} ${JSON.stringify(json).slice(0, 200)}`);
        } else goodOk++;
      }
    };
    const bad = async (client: number) => {
      for (let n = 0; n < PER_CLIENT; n++) {
        const id = `b${client}-${n}`;
        const { status, json } = await postJson(url, inferBody(rowOf(100 + client, 0), 1000 + client, id));
        // onnxruntime's own refusal of the run (INTERNAL, as any failed run), naming the node.
        if (status === 500 && /^gather: onnxruntime: .*GatherElements/.test(json?.error ?? "")) badRefused++;
        else wrong.push(`${id}: ${status} ${JSON.stringify(json).slice(0, 200)}`);
      }
    };
    await Promise.all([
      ...Array.from({ length: GOOD_CLIENTS }, (_, c) => good(c)),
      ...Array.from({ length: BAD_CLIENTS }, (_, c) => bad(c)),
    ]);
    expect(wrong).toEqual([]);
    expect(goodOk).toBe(GOOD_CLIENTS * PER_CLIENT);
    expect(badRefused).toBe(BAD_CLIENTS * PER_CLIENT);

    const stats = (await (await fetch(`${server.http}/v2/models/${MODEL}/stats`)).json()).model_stats[0];
    const executions = Number(stats.execution_count);
    const inferences = Number(stats.inference_count);
    expect(inferences).toBe(GOOD_CLIENTS * PER_CLIENT);
    // The good requests kept merging: more than one row per execution (the eager strategy merges
    // what queued while the instance ran), and batches of several rows among them.
    expect(inferences / executions).toBeGreaterThan(1);
    const sizes = (stats.batch_stats as { batch_size: number }[]).map((b) => Number(b.batch_size));
    expect(Math.max(...sizes)).toBeGreaterThanOrEqual(4);

    const metrics = await scrape(server);
    const reruns = metricValue(metrics, "trellis_inference_rerun_count", MODEL);
    const quarantined = metricValue(metrics, "trellis_inference_quarantined_count", MODEL);
    // The budget: a burst of 16 re-runs, then 1 per 16 executions earned back; one bisection may
    // overdraw it by at most 2·log2(64) = 12 re-runs (it must finish to answer the good rows).
    expect(reruns).toBeGreaterThan(0);
    expect(reruns).toBeLessThanOrEqual(16 + executions / 16 + 12);
    // Without isolation's budget, each of the 120 bad rows would cost a bisection: far more.
    expect(quarantined).toBeGreaterThan((BAD_CLIENTS * PER_CLIENT) / 4);
    expect(quarantined).toBeLessThanOrEqual(BAD_CLIENTS * PER_CLIENT);
    console.log(
      `isolation: ${inferences} good rows in ${executions} executions, ${reruns} re-runs, ${quarantined} quarantined`,
    );
  });
});
