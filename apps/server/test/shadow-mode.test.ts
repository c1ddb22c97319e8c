/**
 * Shadow mode on live traffic (issue 42): a model whose config names `shadow_model` sends 1 in
 * `shadow_sample_every` of its requests to that model too and compares the answers; the running
 * agreement is in /metrics. Echo models stand in for a model and its replacement (the seed's
 * Python models are in python-models.test.ts); counts are asserted, never timings.
 */
import { modelLoader, RepositoryManager, SHADOW_MAX_IN_FLIGHT, shadowAgreementOf } from "@trellis/model-repository";
import { removeDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningServer, startServer } from "../src/server.js";
import { echoConfig, makeRepository, postJson } from "./helpers.js";

const quiet = { info() {}, warn() {}, error() {}, debug() {} };
const shadowOf = (model: string, every?: string) => ({
  shadow_model: model,
  ...(every ? { shadow_sample_every: every } : {}),
});

let repo: string;
let manager: RepositoryManager;
let server: RunningServer;
let http: string;
let metricsUrl: string;

beforeAll(async () => {
  repo = await makeRepository({
    reference: { config: echoConfig("reference", { params: { scale: "2" } }) },
    // The same answers, every other request compared.
    replacement: { config: echoConfig("replacement", { params: { scale: "2", ...shadowOf("reference", "2") } }) },
    // Other answers: every request compared, every one differs.
    wrong: { config: echoConfig("wrong", { params: { scale: "3", ...shadowOf("reference") } }) },
    eager: { config: echoConfig("eager", { params: { scale: "2", ...shadowOf("reference") } }) },
    orphan: { config: echoConfig("orphan", { params: shadowOf("absent") }) },
    everyzero: { config: echoConfig("everyzero", { params: shadowOf("reference", "0") }) },
    narcissus: { config: echoConfig("narcissus", { params: shadowOf("narcissus") }) },
  });
  manager = new RepositoryManager({ repositories: [repo], loader: modelLoader(), logger: quiet });
  await manager.start();
  server = await startServer(manager, { httpPort: 0, grpcPort: 0, metricsPort: 0, logger: quiet });
  http = `http://127.0.0.1:${server.httpPort}`;
  metricsUrl = `http://127.0.0.1:${server.metricsPort}/metrics`;
});
afterAll(async () => {
  await server?.shutdown(5000);
  await removeDir(repo);
});

const infer = (model: string, values: number[], parameters?: Record<string, unknown>) =>
  postJson(`${http}/v2/models/${model}/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: values }],
    ...(parameters ? { parameters } : {}),
  });

/** Every sample of `model` settled (the comparisons run after the answers). */
async function settled(model: string, expected: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const a = shadowAgreementOf(manager.resolve(model));
    if (a && a.sampled + a.skipped >= expected) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`${model}: ${expected} samples never settled`);
}

/** `name{labels…} value` lines of one metric, as { "k=v,…": value }. */
async function metric(name: string, model: string): Promise<Record<string, number>> {
  const text = await (await fetch(metricsUrl)).text();
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) || !line.includes(`model="${model}"`)) continue;
    const labels = line.slice(line.indexOf("{") + 1, line.lastIndexOf("}"));
    const keep = labels
      .split(",")
      .filter((l) => /^(result|output|shadow)=/.test(l))
      .join(",");
    out[keep] = Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return out;
}

describe("shadow mode on live traffic", () => {
  it("compares 1 in N requests with the shadow model, and /metrics shows the agreement", async () => {
    for (let i = 0; i < 10; i++) expect((await infer("replacement", [i, 1, 2, 3])).status).toBe(200);
    await settled("replacement", 5);
    expect(shadowAgreementOf(manager.resolve("replacement"))).toMatchObject({
      shadow: "reference",
      every: 2,
      sampled: 5,
      agreed: 5,
      differed: 0,
      shadowFailed: 0,
      skipped: 0,
      outputs: [{ output: "replacement.OUTPUT", requests: 5, elements: 20, mismatching: 0, maxAbsDelta: 0 }],
    });
    expect(await metric("trellis_shadow_request_count", "replacement")).toMatchObject({
      'shadow="reference",result="agreed"': 5,
      'shadow="reference",result="differed"': 0,
    });
    expect(await metric("trellis_shadow_output_mismatch_count", "replacement")).toEqual({
      'shadow="reference",output="OUTPUT"': 0,
    });
  });

  it("counts a replacement that answers otherwise: mismatching elements and max |Δ|; the client gets its own answer", async () => {
    const answer = await infer("wrong", [1, 2, 3, 4]);
    expect(answer.json.outputs[0].data).toEqual([3, 6, 9, 12]);
    await infer("wrong", [0, 0, 0, 1]);
    await settled("wrong", 2);
    expect(shadowAgreementOf(manager.resolve("wrong"))).toMatchObject({
      sampled: 2,
      agreed: 0,
      differed: 2,
      outputs: [{ requests: 2, elements: 8, mismatching: 5, maxAbsDelta: 4 }],
    });
    expect(await metric("trellis_shadow_output_max_abs_delta", "wrong")).toEqual({
      'shadow="reference",output="OUTPUT"': 4,
    });
    expect(await metric("trellis_shadow_output_mismatch_count", "wrong")).toEqual({
      'shadow="reference",output="OUTPUT"': 5,
    });
  });

  it("never lets the shadow touch the client: a missing shadow model is counted, the request answered", async () => {
    const answer = await infer("orphan", [1, 1, 1, 1]);
    expect(answer.status).toBe(200);
    await settled("orphan", 1);
    expect(shadowAgreementOf(manager.resolve("orphan"))).toMatchObject({ sampled: 1, shadowFailed: 1, agreed: 0 });
    // A request the model itself fails is not compared.
    const failed = await infer("eager", [1, 1, 1, 1], { fail: true });
    expect(failed.status).toBe(400);
    await settled("eager", 1);
    expect(shadowAgreementOf(manager.resolve("eager"))).toMatchObject({ sampled: 0, skipped: 1 });
  });

  it(`has at most ${SHADOW_MAX_IN_FLIGHT} shadow requests in flight per model; samples beyond are skipped`, async () => {
    const before = shadowAgreementOf(manager.resolve("eager"))!;
    const burst = 2 * SHADOW_MAX_IN_FLIGHT;
    const answers = await Promise.all(
      Array.from({ length: burst }, (_, i) => infer("eager", [i, 0, 0, 0], { delay_ms: 300 })),
    );
    expect(answers.map((a) => a.status)).toEqual(Array(burst).fill(200));
    await settled("eager", before.sampled + before.skipped + burst);
    const after = shadowAgreementOf(manager.resolve("eager"))!;
    expect(after.sampled - before.sampled).toBe(SHADOW_MAX_IN_FLIGHT);
    expect(after.skipped - before.skipped).toBe(SHADOW_MAX_IN_FLIGHT);
    expect(after.agreed - before.agreed).toBe(SHADOW_MAX_IN_FLIGHT);
  });

  it("refuses to load a model whose shadow settings are wrong, naming the setting", () => {
    const reasons = Object.fromEntries(
      manager
        .index(false)
        .filter((m) => m.name === "everyzero" || m.name === "narcissus")
        .map((m) => [m.name, m.reason]),
    );
    expect(reasons.everyzero).toContain("shadow_sample_every must be an integer from 1 to 1000000, got 0");
    expect(reasons.narcissus).toContain("shadow_model names the model itself");
  });
});
