/**
 * The seed ensemble split across three server processes, as GUIDE.md
 * documents it: a preprocess service, an inference service, and an
 * ensemble front reaching them as remote steps through --endpoints.
 */
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { frameBytes } from "@trellis/kserve/wire";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { binaryRequest, classifyOverHttp, explicitModels, jsonOf, postBinary, postJson } from "./helpers.js";

let repo: string;
const servers: ServerProcess[] = [];

beforeAll(async () => {
  repo = await makeSeedRepository();
  const explicit = (model: string) => [...explicitModels(repo), "--load-model", model];
  const started = await Promise.allSettled([
    startServerProcess(explicit("resnet50_preprocess")),
    startServerProcess(explicit("resnet50_inference")),
  ]);
  // Keep whichever started, so afterAll stops it even if the other failed.
  for (const s of started) if (s.status === "fulfilled") servers.push(s.value);
  const failed = started.find((s) => s.status === "rejected");
  if (failed) throw failed.reason;
  const [pre, inf] = servers as [ServerProcess, ServerProcess];
  const endpoints = join(repo, "endpoints.json");
  await writeFile(endpoints, JSON.stringify({ resnet50_preprocess: pre?.grpc, resnet50_inference: inf?.grpc }));
  servers.push(
    await startServerProcess([
      ...explicit("resnet50_ensemble"),
      "--endpoints",
      endpoints,
      // Off until a test turns it on; each trace written as it completes.
      "--trace-config",
      `triton,file=${join(repo, "front-trace.json")}`,
      "--trace-config",
      "triton,log-frequency=1",
    ]),
  );
});
afterAll(async () => {
  // Front first: it holds connections to the other two. Stop every one before asserting, so none is left running.
  const exitCodes: (number | null)[] = [];
  for (const s of [...servers].reverse()) exitCodes.push(await s.stop());
  await removeDir(repo);
  expect(exitCodes).toEqual(servers.map(() => 0));
});

describe("three-process split", () => {
  it("each service holds only its model; the front classifies through the remote steps", async () => {
    const [pre, inf, front] = servers as [ServerProcess, ServerProcess, ServerProcess];
    const ready = async (s: ServerProcess) =>
      ((await postJson(`${s.http}/v2/repository/index`, { ready: true })).json as { name: string }[]).map(
        (m) => m.name,
      );
    expect(await ready(pre)).toEqual(["resnet50_preprocess"]);
    expect(await ready(inf)).toEqual(["resnet50_inference"]);
    expect(await ready(front)).toEqual(["resnet50_ensemble", "resnet50_postprocess"]);

    const images = ["chelsea.jpg", "coffee.jpg"];
    const bytes = images.map(readFixtureImage);
    const res = await postBinary(
      `${front.http}/v2/models/resnet50_ensemble/infer`,
      { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [2, 1] }] },
      [frameBytes(bytes)],
    );
    expect(res.status).toBe(200);
    const answers = (await jsonOf(res)).outputs[0].data as string[];
    expect(answers.map((a) => JSON.parse(a).top5_labels[0])).toEqual(["Egyptian cat", "espresso"]);

    // The work really happened in the other processes.
    const count = async (s: ServerProcess, model: string) =>
      (await jsonOf(await fetch(`${s.http}/v2/models/${model}/stats`))).model_stats[0].inference_count;
    expect(await count(pre, "resnet50_preprocess")).toBe(2);
    expect(await count(inf, "resnet50_inference")).toBe(2);
  });

  it("traces a request through the remote steps: each a child trace, stamped as it is sent and answered", async () => {
    const front = servers[2] as ServerProcess;
    const on = await postJson(`${front.http}/v2/trace/setting`, { trace_level: ["TIMESTAMPS"], trace_rate: "1" });
    expect(on.status).toBe(200);
    const res = await postBinary(
      `${front.http}/v2/models/resnet50_ensemble/infer`,
      { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([readFixtureImage("chelsea.jpg")])],
    );
    expect(res.status).toBe(200);
    await postJson(`${front.http}/v2/trace/setting`, { trace_level: ["OFF"] });
    const file = join(repo, "front-trace.json.0");
    for (let i = 0; i < 100 && !existsSync(file); i++) await new Promise((r) => setTimeout(r, 50));
    const entries = JSON.parse(await readFile(file, "utf8")) as {
      id: number;
      model_name?: string;
      parent_id?: number;
      timestamps?: { name: string }[];
    }[];
    const names = new Map(entries.filter((e) => e.model_name).map((e) => [e.id, e.model_name]));
    const steps = entries
      .filter((e) => e.timestamps && entries.some((h) => h.id === e.id && h.parent_id !== undefined))
      .map((e) => [names.get(e.id), e.timestamps?.map((t) => t.name)]);
    expect(steps).toEqual([
      ["resnet50_preprocess", ["REQUEST_START", "REQUEST_END"]],
      ["resnet50_inference", ["REQUEST_START", "REQUEST_END"]],
      [
        "resnet50_postprocess",
        [
          "REQUEST_START",
          "QUEUE_START",
          "COMPUTE_START",
          "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START",
          "COMPUTE_END",
          "REQUEST_END",
        ],
      ],
    ]);
  });

  it("fails only the bad images of a burst through the remote steps; the remote merges and isolates", async () => {
    const [pre, , front] = servers as [ServerProcess, ServerProcess, ServerProcess];
    const good = ["chelsea.jpg", "coffee.jpg"].map((name) => ({ name, bytes: readFixtureImage(name) }));
    const bad = readFixtureImage(TRUNCATED_PHOTO);
    const alone = new Map<string, string>();
    for (const g of good) alone.set(g.name, JSON.parse(await classifyOverHttp(front.http, g.bytes)).top5_labels[0]);
    const stats = async () => {
      const m = (await jsonOf(await fetch(`${pre.http}/v2/models/resnet50_preprocess/stats`))).model_stats[0];
      return { inferences: Number(m.inference_count), executions: Number(m.execution_count) };
    };
    // Bursts of 24 good and 6 bad at once, until the remote preprocess merged some (at most 5 bursts).
    for (let burst = 0; burst < 5; burst++) {
      const before = await stats();
      const calls = Array.from({ length: 30 }, (_, i) => {
        if (i % 5 === 4)
          return classifyOverHttp(front.http, bad).then(
            (answer) => ({ ok: true as const, answer, name: TRUNCATED_PHOTO }),
            (err: Error) => ({ ok: false as const, answer: err.message, name: TRUNCATED_PHOTO }),
          );
        const g = good[i % 2]!;
        return classifyOverHttp(front.http, g.bytes).then(
          (answer) => ({ ok: true as const, answer, name: g.name }),
          (err: Error) => ({ ok: false as const, answer: err.message, name: g.name }),
        );
      });
      const outcomes = await Promise.all(calls);
      for (const o of outcomes) {
        if (o.name === TRUNCATED_PHOTO) {
          expect(o.ok).toBe(false);
          expect(o.answer).toMatch(
            /^HTTP 400: .*step 0 resnet50_preprocess: INVALID_ARGUMENT: .*element 0: truncated or corrupt/,
          );
        } else {
          expect(o.ok, o.answer).toBe(true);
          expect(JSON.parse(o.answer).top5_labels[0]).toBe(alone.get(o.name));
        }
      }
      const after = await stats();
      if (after.executions - before.executions < after.inferences - before.inferences) return;
    }
    throw new Error("the remote preprocess never merged requests in 5 bursts: isolation not exercised");
  });

  it("one request's kept trace holds the remote steps' own queue and compute, inside the front's call", async () => {
    const front = servers[2] as ServerProcess;
    const { body, headerLength } = binaryRequest(
      { id: "split-trace-1", inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([readFixtureImage("chelsea.jpg")])],
    );
    const res = await fetch(`${front.http}/v2/models/resnet50_ensemble/infer`, {
      method: "POST",
      body,
      headers: { "inference-header-content-length": String(headerLength), "trellis-trace": "1" },
    });
    expect(res.status).toBe(200);
    // The remote's reply is the front's business only: the client's answer carries no trace parameter.
    expect(JSON.stringify((await jsonOf(res)).parameters ?? {})).not.toContain("trellis_trace");
    const list = await jsonOf(await fetch(`${front.http}/v2/traces?request_id=split-trace-1`));
    const trace = await jsonOf(await fetch(`${front.http}/v2/traces/${list.traces[0].id}`));
    type Span = { model: string; remote?: boolean; times: Record<string, number>; children: Span[] };
    const steps = (trace.root as Span).children;
    expect(steps.map((s) => s.model)).toEqual(["resnet50_preprocess", "resnet50_inference", "resnet50_postprocess"]);
    for (const step of steps.slice(0, 2)) {
      // The front's call (client side), and under it the remote server's own span of the same model.
      expect(step.remote).toBeUndefined();
      expect(step.children).toHaveLength(1);
      const remote = step.children[0]!;
      expect(remote).toMatchObject({ model: step.model, remote: true });
      const t = remote.times;
      for (const name of ["QUEUE_START", "COMPUTE_START", "COMPUTE_END"]) expect(t[name]).toBeTypeOf("number");
      expect(t.COMPUTE_START! - t.QUEUE_START!).toBeGreaterThanOrEqual(0);
      expect(t.COMPUTE_END! - t.COMPUTE_START!).toBeGreaterThan(0);
      // Placed inside the call: the rest of the call is the network and the two frontends.
      expect(t.REQUEST_START!).toBeGreaterThanOrEqual(step.times.REQUEST_START!);
      expect(t.REQUEST_END!).toBeLessThanOrEqual(step.times.REQUEST_END!);
    }
    // The local step has no remote part.
    expect(steps[2]!.children).toEqual([]);
  });
});
