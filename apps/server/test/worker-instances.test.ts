/**
 * Worker-thread instances, black-box: a plain model.mjs with instance_group
 * count 2 and parameter worker_threads "true" runs its instances in two worker
 * threads, so two synchronous (CPU-bound) computes run at once; a module that
 * throws at import fails the load naming the model; a StageError thrown in a
 * worker reaches the client with its code and message.
 */
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { explicitModels, makeRepository, postJson } from "./helpers.js";

// The repository is a temporary folder without node_modules: @trellis/stage by its resolved URL.
const STAGE = import.meta.resolve("@trellis/stage");

/**
 * THREAD = the threadId that computed, STARTS = computes started (in any thread) when this one
 * saw a second start or gave up after 10 s. Each compute blocks its thread synchronously while
 * it waits, so on one thread a second compute cannot start until the first gave up.
 * IN < 0: a StageError(INVALID_ARGUMENT).
 */
const BLOCKER = `import { appendFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { threadId } from "node:worker_threads";
import { Code, defineStage, StageError } from "${STAGE}";
export function createStage({ config, version }) {
  const counter = join(config.parameters.counter_dir.stringValue, "starts");
  const pause = new Int32Array(new SharedArrayBuffer(4));
  return defineStage({ config, version, compute(request) {
    if (request.inputs[0].data[0] < 0) throw new StageError(Code.InvalidArgument, config.name, "IN must not be negative");
    appendFileSync(counter, "x");
    const until = Date.now() + 10_000;
    let starts = statSync(counter).size;
    while (starts < 2 && Date.now() < until) {
      Atomics.wait(pause, 0, 0, 5);
      starts = statSync(counter).size;
    }
    return [
      { name: "THREAD", datatype: "INT32", shape: [1], data: Int32Array.of(threadId) },
      { name: "STARTS", datatype: "INT32", shape: [1], data: Int32Array.of(starts) },
    ];
  } });
}
`;

const config = (name: string, counterDir: string) => `name: "${name}"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "THREAD" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "STARTS" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "worker_threads" value: { string_value: "true" } }
parameters { key: "counter_dir" value: { string_value: "${counterDir}" } }
`;

let repo: string;
let counterDir: string;
let server: ServerProcess;
beforeAll(async () => {
  counterDir = await mkdtemp(join(tmpdir(), "trellis-worker-counter-"));
  repo = await makeRepository({
    blocker: { config: config("blocker", counterDir), files: { "1/model.mjs": BLOCKER } },
    broken: {
      config: config("broken", counterDir),
      files: { "1/model.mjs": `throw new Error("refused at import");\n` },
    },
  });
  server = await startServerProcess(explicitModels(repo, "blocker"));
}, 120_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
  await removeDir(counterDir);
});

const infer = (model: string, value: number) =>
  postJson(`${server.http}/v2/models/${model}/infer`, {
    inputs: [{ name: "IN", datatype: "INT32", shape: [1], data: [value] }],
  });
const output = (json: { outputs: { name: string; data: number[] }[] }, name: string) =>
  json.outputs.find((o) => o.name === name)?.data[0];

describe("worker_threads instances", () => {
  it("runs two synchronous computes at once, on two different worker threads", async () => {
    const [a, b] = await Promise.all([infer("blocker", 1), infer("blocker", 2)]);
    expect([a.status, b.status]).toEqual([200, 200]);
    // Each saw the other start while it was still computing.
    expect([output(a.json, "STARTS"), output(b.json, "STARTS")]).toEqual([2, 2]);
    const threads = [output(a.json, "THREAD"), output(b.json, "THREAD")];
    expect(threads.every((t) => typeof t === "number" && t > 0)).toBe(true);
    expect(new Set(threads).size).toBe(2);
  }, 30_000);

  it("answers a StageError thrown in a worker with its code and message", async () => {
    const res = await infer("blocker", -1);
    expect(res.status).toBe(400);
    expect(res.json.error).toContain("IN must not be negative");
    expect(res.json.error).toContain("blocker");
  });

  it("fails the load of a module that throws at import, naming the model", async () => {
    const failed = await postJson(`${server.http}/v2/repository/models/broken/load`, {});
    expect(failed.status).toBe(400);
    expect(failed.json.error).toContain("broken");
    expect(failed.json.error).toContain("refused at import");
    expect(failed.json.error).not.toContain(repo);
    expect((await fetch(`${server.http}/v2/models/broken/ready`)).status).not.toBe(200);
    const index = (await postJson(`${server.http}/v2/repository/index`, {})).json as { name: string; state?: string }[];
    expect(index.find((m) => m.name === "broken")?.state).toBe("UNAVAILABLE");
    // The other model still serves.
    expect((await infer("blocker", -1)).status).toBe(400);
  });
});
