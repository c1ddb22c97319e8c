/**
 * The seed ensemble split across three server processes, as GUIDE.md
 * documents it: a preprocess service, an inference service, and an
 * ensemble front reaching them as remote steps through --endpoints.
 */
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { frameBytes } from "@trellis/kserve";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { explicitModels, jsonOf, postBinary, postJson } from "./helpers.js";

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
});
