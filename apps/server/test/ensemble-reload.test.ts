/**
 * An ensemble's step reloaded to a new version, or unloaded, while ensemble requests are in
 * flight: each request is answered wholly by one version of the step or refused with a clear
 * error, never half by one and half by the other; the step's statistics and a trace name the
 * version that ran. The step `addv` adds 1 (version 1) or 100 (version 2), and the ensemble
 * `pipe` calls it twice: X+2 is wholly version 1, X+200 wholly version 2, X+101 half-and-half.
 * Version 1 waits at a gate (process-wide, on globalThis) that the model `gate` closes, opens
 * and reports on, so the test waits on states (calls held, versions ready), never on time.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterEach, describe, expect, it } from "vitest";
import { explicitModels, floats, grpcClientOf, jsonOf, makeRepository, postJson } from "./helpers.js";

/** Shared by both versions of addv and by gate: calls held, calls run per version, and the gate. */
const GATE_STATE = `const g = (globalThis.__addvGate ??= { waiting: 0, calls: {}, promise: null, open: () => {} });`;
const addv = (add: number, gated: boolean) => `${GATE_STATE}
export function createStage({ config, version }) {
  return { config, version, async compute(request) {
    ${gated ? "while (g.promise) { g.waiting++; try { await g.promise; } finally { g.waiting--; } }" : ""}
    g.calls[version] = (g.calls[version] ?? 0) + 1;
    const x = request.inputs[0];
    return [{ name: "Y", datatype: "FP32", shape: x.shape, data: Float32Array.from(x.data, (v) => v + ${add}) }];
  } };
}
`;
/** CMD 1 closes the gate, 2 opens it (for good), 0 reads; STATE = [held, calls on v1, calls on v2]. */
const GATE = `${GATE_STATE}
export function createStage({ config, version }) {
  return { config, version, compute(request) {
    const cmd = request.inputs[0].data[0];
    if (cmd === 1 && !g.promise) g.promise = new Promise((r) => { g.open = () => { g.promise = null; r(); }; });
    if (cmd === 2) g.open();
    return [{ name: "STATE", datatype: "FP32", shape: [3], data: Float32Array.of(g.waiting, g.calls[1] ?? 0, g.calls[2] ?? 0) }];
  } };
}
`;
const tsModel = (name: string, input: string, output: string, outDims: number) => `name: "${name}"
backend: "typescript"
max_batch_size: 0
input [ { name: "${input}" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "${output}" data_type: TYPE_FP32 dims: [ ${outDims} ] } ]
`;
const PIPE = `name: "pipe"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "addv" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "A" } },
  { model_name: "addv" model_version: -1 input_map { key: "X" value: "A" } output_map { key: "Y" value: "Y" } }
] }
`;

const N = 8; // early requests, held at the gate inside step 0 on version 1 (the last two over gRPC)
const M = 4; // late requests, sent once version 2 is ready (the last one over gRPC)
/** A refusal is clear when it is an error status whose text names the ensemble, the step and its model. */
function expectClearRefusal(o: Outcome, text = /^pipe: step [01] addv: [A-Z_]+: .*'addv'/): void {
  expect.soft(typeof o.status === "string" || (o.status as number) >= 400, `${o.id}'s status ${o.status}`).toBe(true);
  expect.soft(o.error, `refusal of ${o.id} (${o.status}) is clear`).toMatch(text);
}

interface Outcome {
  id: string;
  x: number;
  y?: number;
  /** HTTP status, or the gRPC code's name, of a refusal. */
  status?: number | string;
  error?: string;
}
/** Which version answered: wholly v1, wholly v2, half-and-half, refused, or something else. */
const verdict = (o: Outcome) =>
  o.y === undefined
    ? "refused"
    : o.y === o.x + 2
      ? "v1"
      : o.y === o.x + 200
        ? "v2"
        : o.y === o.x + 101
          ? "half-and-half"
          : `other (${o.y})`;

/** The repository index's rows of `model`, one per version. */
async function indexRows(s: ServerProcess, model: string): Promise<{ name: string; state?: string }[]> {
  const rows = (await postJson(`${s.http}/v2/repository/index`, {})).json as { name: string; state?: string }[];
  return rows.filter((r) => r.name === model);
}

/** No answer computed half by one version of addv and half by the other (or by neither). */
function expectNoMixedVersions(seen: string[]): void {
  expect
    .soft(
      seen.filter((v) => /half|other/.test(v)),
      "no answer mixes versions",
    )
    .toEqual([]);
}

let server: ServerProcess | undefined;
let repo: string | undefined;
afterEach(async () => {
  if (server) await gate(2).catch(() => undefined); // a failed test leaves nothing held at the gate
  expect(await server?.stop()).toBe(0);
  if (repo) await removeDir(repo);
  server = repo = undefined;
});

async function start(): Promise<ServerProcess> {
  repo = await makeRepository({
    addv: { config: tsModel("addv", "X", "Y", 1), files: { "1/model.mjs": addv(1, true) } },
    gate: { config: tsModel("gate", "CMD", "STATE", 3), files: { "1/model.mjs": GATE } },
    pipe: { config: PIPE },
  });
  server = await startServerProcess(explicitModels(repo, "addv", "gate", "pipe"));
  return server;
}

/** Sends the gate a command; its state: [calls held at the gate, calls run on v1, calls run on v2]. */
async function gate(cmd: 0 | 1 | 2): Promise<number[]> {
  const res = await postJson(`${server?.http}/v2/models/gate/infer`, {
    inputs: [{ name: "CMD", datatype: "FP32", shape: [1], data: [cmd] }],
  });
  if (res.status !== 200) throw new Error(`gate answered ${res.status}: ${JSON.stringify(res.json)}`);
  return res.json.outputs[0].data;
}

/** Polls `check` until it holds (a state, not a time: the cap only turns a hang into a failure). */
async function until(check: () => Promise<boolean>, cap = 600): Promise<boolean> {
  for (let i = 0; i < cap; i++) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return false;
}

/** One ensemble request over HTTP (traced on demand when `traced`) or gRPC. */
async function ask(s: ServerProcess, id: string, x: number, via: "http" | "grpc", traced = false): Promise<Outcome> {
  if (via === "grpc") {
    try {
      const res = await grpcClientOf(s).modelInfer({
        modelName: "pipe",
        id,
        inputs: [{ name: "X", datatype: "FP32", shape: [1n] }],
        rawInputContents: [new Uint8Array(Float32Array.of(x).buffer)],
      });
      return { id, x, y: floats(res.rawOutputContents[0] as Uint8Array)[0] };
    } catch (err) {
      const e = ConnectError.from(err);
      return { id, x, status: Code[e.code], error: e.rawMessage };
    }
  }
  const res = await fetch(`${s.http}/v2/models/pipe/infer`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(traced ? { "trellis-trace": "1" } : {}) },
    body: JSON.stringify({ id, inputs: [{ name: "X", datatype: "FP32", shape: [1], data: [x] }] }),
  });
  const json = await jsonOf(res);
  return res.status === 200 ? { id, x, y: json.outputs[0].data[0] } : { id, x, status: res.status, error: json.error };
}

/** The early requests: X = 10, 20, ...; early-0 traced; the last two over gRPC. */
const sendEarly = (s: ServerProcess) =>
  Array.from({ length: N }, (_, i) => ask(s, `early-${i}`, 10 * (i + 1), i >= N - 2 ? "grpc" : "http", i === 0));

/** A kept trace's steps: "model version ran|failed" of each child of the ensemble's span. */
async function stepsOfTrace(s: ServerProcess, requestId: string): Promise<string[]> {
  const list = await jsonOf(await fetch(`${s.http}/v2/traces?request_id=${requestId}`));
  expect(list.traces, `one kept trace of ${requestId}`).toHaveLength(1);
  const { root } = await jsonOf(await fetch(`${s.http}/v2/traces/${list.traces[0].id}`));
  expect(root.model).toBe("pipe");
  return root.children.map((c: { model: string; version: string; failed: boolean }) =>
    [c.model, c.version, c.failed ? "failed" : "ran"].join(" "),
  );
}

/** inference_stats success/fail counts of one model version. */
async function counts(s: ServerProcess, model: string, version: string) {
  const res = await fetch(`${s.http}/v2/models/${model}/versions/${version}/stats`);
  if (res.status !== 200) return { status: res.status };
  const st = (await jsonOf(res)).model_stats[0];
  return { version: st.version, success: st.inference_stats.success.count, fail: st.inference_stats.fail.count };
}

const ready = async (s: ServerProcess, path: string) => (await fetch(`${s.http}/v2/models/${path}/ready`)).status;
/** Each outcome's verdict; a refusal's with its status and text. */
const verdicts = (outcomes: Outcome[]) =>
  outcomes.map((o) => `${o.id}: ${verdict(o)}${o.y === undefined ? ` ${o.status} "${o.error}"` : ""}`);

/** Starts a server, checks the models answer, closes the gate, and holds N requests in step 0 on v1. */
async function holdEarly(): Promise<{ s: ServerProcess; early: Promise<Outcome>[] }> {
  const s = await start();
  expect(await gate(0)).toEqual([0, 0, 0]);
  expect(await ask(s, "warm-up", 1, "http")).toEqual({ id: "warm-up", x: 1, y: 3 }); // wholly v1, gate open
  await gate(1);
  const early = sendEarly(s);
  expect(await until(async () => (await gate(0))[0] === N), "N requests held at the gate").toBe(true);
  expect(await gate(0)).toEqual([N, 2, 0]); // held in step 0: no call on v1 finished since the warm-up
  return { s, early };
}

describe("an ensemble's step changes while ensemble requests are in flight", () => {
  it("reloaded to version 2: held requests finish wholly on v1, later ones run wholly on v2", async () => {
    const { s, early } = await holdEarly();
    await mkdir(join(repo as string, "addv", "2"));
    await writeFile(join(repo as string, "addv", "2", "model.mjs"), addv(100, false));
    const loading = postJson(`${s.http}/v2/repository/models/addv/load`, {});
    const v2Ready = await until(async () => (await ready(s, "addv/versions/2")) === 200);
    expect.soft(v2Ready, "addv version 2 became ready while requests were held on version 1").toBe(true);

    const late = Array.from({ length: M }, (_, i) =>
      ask(s, `late-${i}`, 1000 + 10 * i, i === M - 1 ? "grpc" : "http", i === 0),
    );
    let lateDone = 0;
    for (const p of late) void p.then(() => lateDone++);
    const lateFirst = await until(async () => lateDone === M);
    expect.soft(lateFirst, "the late requests were answered while the early ones were still held").toBe(true);
    const held = await gate(0);
    await gate(2);
    const outcomes = [...(await Promise.all(early)), ...(await Promise.all(late))];
    const load = await loading;

    // Soft from here on: one run reports every way the server falls short.
    const seen = verdicts(outcomes);
    expectNoMixedVersions(seen);
    for (const o of outcomes.filter((o) => o.y === undefined)) expectClearRefusal(o);
    expect.soft(held, "held / calls on v1 / calls on v2, just before the release").toEqual([N, 2, 2 * M]);
    expect
      .soft(seen, "the held requests wholly on v1, the later ones wholly on v2, none refused")
      .toEqual([
        ...Array.from({ length: N }, (_, i) => `early-${i}: v1`),
        ...Array.from({ length: M }, (_, i) => `late-${i}: v2`),
      ]);
    expect.soft(load.status, JSON.stringify(load.json)).toBe(200);
    expect.soft(await gate(0), "held / calls on v1 / calls on v2, at the end").toEqual([0, 2 + 2 * N, 2 * M]);
    expect.soft(await stepsOfTrace(s, "early-0"), "early-0's steps").toEqual(["addv 1 ran", "addv 1 ran"]);
    expect.soft(await stepsOfTrace(s, "late-0"), "late-0's steps").toEqual(["addv 2 ran", "addv 2 ran"]);
    expect.soft(await counts(s, "pipe", "1"), "pipe's statistics").toMatchObject({ success: 1 + N + M, fail: 0 });
    expect
      .soft(await counts(s, "addv", "2"), "addv v2's statistics")
      .toEqual({ version: "2", success: 2 * M, fail: 0 });
    // Version 1 goes once its last request is answered (the state waited on, not a time).
    const addvRows = () => indexRows(s, "addv");
    await until(async () => JSON.stringify(await addvRows()).includes('"UNAVAILABLE"'));
    expect(await addvRows()).toEqual([
      { name: "addv", version: "1", state: "UNAVAILABLE", reason: "unloaded" },
      { name: "addv", version: "2", state: "READY" },
    ]);
    expect(await ready(s, "addv/versions/1")).not.toBe(200);
  });

  it("unloaded: held requests finish wholly on v1, new ones are refused naming the step", async () => {
    const { s, early } = await holdEarly();
    const unloading = postJson(`${s.http}/v2/repository/models/addv/unload`, {});
    const state = async () => (await indexRows(s, "addv"))[0]?.state;
    expect(await until(async () => (await state()) === "UNLOADING"), "addv UNLOADING").toBe(true);

    const refusedAsks = [ask(s, "new-0", 500, "http"), ask(s, "new-1", 600, "http"), ask(s, "new-2", 700, "grpc")];
    let refusedDone = 0;
    for (const p of refusedAsks) void p.then(() => refusedDone++);
    const answeredFirst = await until(async () => refusedDone === refusedAsks.length);
    expect.soft(answeredFirst, "new requests were answered at once, not held").toBe(true);
    await gate(2);
    const refused = await Promise.all(refusedAsks);
    const answers = await Promise.all(early);
    const unload = await unloading;

    // Today's text: "pipe: step 0 addv: NOT_FOUND: Request for unknown model: 'addv' has no available versions".
    expect
      .soft(refused.map(verdict), `new requests refused: ${verdicts(refused)}`)
      .toEqual(["refused", "refused", "refused"]);
    for (const o of refused) expectClearRefusal(o, /^pipe: step 0 addv: [A-Z_]+: .*'addv'/);
    const seen = verdicts(answers);
    expectNoMixedVersions(seen);
    for (const o of answers.filter((o) => o.y === undefined)) expectClearRefusal(o);
    expect
      .soft(seen, "the held requests, answered wholly on v1")
      .toEqual(Array.from({ length: N }, (_, i) => `early-${i}: v1`));
    expect.soft(unload.status, JSON.stringify(unload.json)).toBe(200);
    expect.soft(await gate(0), "held / calls on v1 / calls on v2, at the end").toEqual([0, 2 + 2 * N, 0]);
    expect.soft(await stepsOfTrace(s, "early-0"), "early-0's steps").toEqual(["addv 1 ran", "addv 1 ran"]);
    expect.soft((await counts(s, "pipe", "1")).success, "pipe's successes").toBe(1 + N);
    expect(await state()).toBe("UNAVAILABLE");
    expect(await ready(s, "addv")).not.toBe(200);
  });
});
