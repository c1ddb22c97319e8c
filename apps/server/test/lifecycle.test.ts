/**
 * Model control and process lifecycle, black-box: explicit load/unload over
 * HTTP and gRPC, unload with requests in flight, SIGTERM with requests in
 * flight, and a model that fails to load on request.
 */
import { existsSync, readFileSync } from "node:fs";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus, ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  addModel,
  CHAIN_CONFIG,
  echoConfig,
  explicitModels,
  floats,
  grpcClientOf,
  makeRepository,
  metricValue,
  postJson,
  scrape,
  TENFOLD_CONFIG,
} from "./helpers.js";

const slowRequest = (delayMs: number, values = [1, 2, 3, 4]) => ({
  inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: values }],
  parameters: { delay_ms: delayMs },
});

/** Polls `check` until it holds (the server's own state, read over its API). */
async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

const pending = async (server: ServerProcess, model: string) =>
  metricValue(await scrape(server), "nv_inference_pending_request_count", model);

describe("explicit model control", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
      chain: { config: CHAIN_CONFIG },
      // A second ensemble sharing chain's step echo10: what unload_dependents must leave loaded.
      tenfold: { config: TENFOLD_CONFIG },
      other: { config: echoConfig("other", { params: { scale: "2" } }) },
      serial: { config: echoConfig("serial", { params: { serial: "1" } }) },
      broken: { config: echoConfig("broken", { params: { module: "./missing.js" } }) },
    });
    server = await startServerProcess(explicitModels(repo, "chain"));
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  const index = async () =>
    (await postJson(`${server.http}/v2/repository/index`, {})).json as {
      name: string;
      version?: string;
      state?: string;
      reason?: string;
    }[];

  it("loads only --load-model at start, an ensemble's steps first", async () => {
    const loaded = server.logs.filter((l) => l.msg === "model loaded").map((l) => l.model);
    expect(loaded.indexOf("chain")).toBe(loaded.length - 1);
    expect([...loaded].sort()).toEqual(["chain", "echo", "echo10"]);
    expect(await index()).toEqual([
      { name: "broken" },
      { name: "chain", version: "1", state: "READY" },
      { name: "echo", version: "1", state: "READY" },
      { name: "echo10", version: "1", state: "READY" },
      { name: "other" },
      { name: "serial" },
      { name: "tenfold" },
    ]);
    const res = await postJson(`${server.http}/v2/models/other/infer`, slowRequest(0));
    // 404, as Triton since server PR #6713 (see parity-codes.test.ts).
    expect(res.status).toBe(404);
    expect(res.json.error).toBe("Request for unknown model: 'other' is not found");
  });

  it("loads over HTTP and unloads over gRPC", async () => {
    expect((await postJson(`${server.http}/v2/repository/models/other/load`, {})).status).toBe(200);
    const ok = await postJson(`${server.http}/v2/models/other/infer`, slowRequest(0));
    expect(ok.json.outputs[0].data).toEqual([2, 4, 6, 8]);

    const client = grpcClientOf(server);
    await client.repositoryModelUnload({ modelName: "other" });
    expect((await index()).find((m) => m.name === "other")).toEqual({
      name: "other",
      version: "1",
      state: "UNAVAILABLE",
      reason: "unloaded",
    });
    const gone = await postJson(`${server.http}/v2/models/other/infer`, slowRequest(0));
    expect(gone.status).toBe(404);
    expect(gone.json.error).toContain("'other' has no available versions");
    await client.repositoryModelLoad({ modelName: "other" });
    expect((await client.modelReady({ name: "other" })).ready).toBe(true);
  });

  it("reports a model that fails to load, with its reason, and stays up, not ready until it is unloaded", async () => {
    const failed = await postJson(`${server.http}/v2/repository/models/broken/load`, {});
    expect(failed.status).toBe(400);
    expect(failed.json.error).toContain("missing.js");
    const unknown = await postJson(`${server.http}/v2/repository/models/nothing/load`, {});
    // Triton's INTERNAL "failed to poll from model repository" (qa/L0_lifecycle/lifecycle_test.py).
    expect(unknown.status).toBe(500);
    const broken = (await index()).find((m) => m.name === "broken");
    expect(broken?.state).toBe("UNAVAILABLE");
    expect(broken?.reason).toContain("missing.js");
    expect((await fetch(`${server.http}/v2/health/live`)).status).toBe(200);
    // As Triton's strict readiness: a model asked for that failed keeps the server not ready; unloaded, it does not.
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(400);
    expect((await postJson(`${server.http}/v2/repository/models/broken/unload`, {})).status).toBe(200);
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
  });

  it("counts a stage's queued requests as pending, not the one executing (a stage without a queue: those in flight)", async () => {
    expect((await postJson(`${server.http}/v2/repository/models/serial/load`, {})).status).toBe(200);
    const requests = [1, 2, 3].map((i) =>
      postJson(`${server.http}/v2/models/serial/infer`, slowRequest(600, [i, i, i, i])),
    );
    await until(async () => (await pending(server, "serial")) === 2, "2 requests queued on serial");
    const answers = await Promise.all(requests);
    answers.forEach((a, k) => {
      expect(a.status).toBe(200);
      expect(a.json.outputs[0].data).toEqual([k + 1, k + 1, k + 1, k + 1]);
    });
    expect(await pending(server, "serial")).toBe(0);
  });

  it("lets in-flight requests finish when their model is unloaded, refusing new ones meanwhile", async () => {
    const inflight = [1, 2, 3].map((i) =>
      postJson(`${server.http}/v2/models/echo/infer`, slowRequest(1500, [i, i, i, i])),
    );
    await until(async () => (await pending(server, "echo")) === 3, "3 requests in flight on echo");

    const unloading = postJson(`${server.http}/v2/repository/models/echo/unload`, {});
    await until(
      async () => (await index()).find((m) => m.name === "echo")?.state === "UNLOADING",
      "echo to be UNLOADING",
    );
    const refused = await postJson(`${server.http}/v2/models/echo/infer`, slowRequest(0));
    expect(refused.status).toBe(404);
    expect(refused.json.error).toContain("'echo' has no available versions");

    const answers = await Promise.all(inflight);
    answers.forEach((a, k) => {
      expect(a.status).toBe(200);
      expect(a.json.outputs[0].data).toEqual([k + 1, k + 1, k + 1, k + 1]);
    });
    expect((await unloading).status).toBe(200);
    expect((await index()).find((m) => m.name === "echo")).toMatchObject({ state: "UNAVAILABLE", reason: "unloaded" });
    // The ensemble's step is gone, so the ensemble answers UNAVAILABLE until echo is back.
    const chain = await postJson(`${server.http}/v2/models/chain/infer`, {
      inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 1, 1, 1] }],
    });
    expect(chain.status).not.toBe(200);
    expect((await postJson(`${server.http}/v2/repository/models/echo/load`, {})).status).toBe(200);
    const back = await postJson(`${server.http}/v2/models/chain/infer`, {
      inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 1, 1, 1] }],
    });
    expect(back.json.outputs[0].data).toEqual([10, 10, 10, 10]);
  });

  it("with unload_dependents unloads an ensemble's steps too, except those another loaded model calls", async () => {
    const state = async (name: string) => (await index()).find((m) => m.name === name)?.state;
    const states = async () =>
      Object.fromEntries(
        await Promise.all(["chain", "tenfold", "echo", "echo10"].map(async (n) => [n, await state(n)])),
      );
    expect((await postJson(`${server.http}/v2/repository/models/tenfold/load`, {})).status).toBe(200);
    expect(await states()).toEqual({ chain: "READY", tenfold: "READY", echo: "READY", echo10: "READY" });

    // Over HTTP: chain and echo go; echo10 stays, tenfold still calling it.
    const unload = (name: string, parameters: unknown) =>
      postJson(`${server.http}/v2/repository/models/${name}/unload`, { parameters });
    expect((await unload("chain", { unload_dependents: true })).status).toBe(200);
    expect(await states()).toEqual({ chain: "UNAVAILABLE", tenfold: "READY", echo: "UNAVAILABLE", echo10: "READY" });
    const tenfold = await postJson(`${server.http}/v2/models/tenfold/infer`, {
      inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
    expect(tenfold.json.outputs[0].data).toEqual([10, 20, 30, 40]);

    // Over gRPC: tenfold's last caller gone, echo10 goes with it.
    const client = grpcClientOf(server);
    const flag = (value: boolean) => ({ parameterChoice: { case: "boolParam" as const, value } });
    await client.repositoryModelUnload({ modelName: "tenfold", parameters: { unload_dependents: flag(true) } });
    expect(await states()).toEqual({
      chain: "UNAVAILABLE",
      tenfold: "UNAVAILABLE",
      echo: "UNAVAILABLE",
      echo10: "UNAVAILABLE",
    });

    // Without it (or false), the steps stay, as in Triton.
    expect((await postJson(`${server.http}/v2/repository/models/chain/load`, {})).status).toBe(200);
    await client.repositoryModelUnload({ modelName: "chain", parameters: { unload_dependents: flag(false) } });
    expect(await states()).toMatchObject({ chain: "UNAVAILABLE", echo: "READY", echo10: "READY" });

    // A value that is not a bool is refused, naming the parameter, and unloads nothing.
    expect((await postJson(`${server.http}/v2/repository/models/chain/load`, {})).status).toBe(200);
    const bad = await unload("chain", { unload_dependents: "yes" });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toBe(`Unable to parse 'unload_dependents': expected a boolean, got "yes"`);
    await expect(
      client.repositoryModelUnload({
        modelName: "chain",
        parameters: { unload_dependents: { parameterChoice: { case: "int64Param", value: 1n } } },
      }),
    ).rejects.toMatchObject({
      code: Code.InvalidArgument,
      // The same words as over HTTP: both frontends read the parameter in @trellis/kserve's control.
      rawMessage: "Unable to parse 'unload_dependents': expected a boolean, got 1",
    });
    expect(await states()).toMatchObject({ chain: "READY", echo: "READY", echo10: "READY" });
  });
});

describe("explicit model control: versions and failed warmup", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({});
    // Its overrides change a stage's parameters, which only an operator who opted in allows.
    server = await startServerProcess([
      ...["--model-repository", repo, "--model-control-mode", "explicit"],
      "--allow-unsafe-load-overrides",
    ]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });
  const load = (model: string) => postJson(`${server.http}/v2/repository/models/${model}/load`, {});
  const infer = (model: string) =>
    postJson(`${server.http}/v2/models/${model}/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });

  it("a load after a new version folder appears serves the new version and succeeds, the old one unloaded", async () => {
    await addModel(repo, "versioned", { config: echoConfig("versioned", { params: { scale_by_version: "1" } }) });
    expect((await load("versioned")).status).toBe(200);
    expect((await infer("versioned")).json.outputs[0].data).toEqual([1, 2, 3, 4]);

    // Default policy latest 1: version 2 replaces version 1, which is unloaded on purpose, not a failure.
    await mkdir(join(repo, "versioned", "2"));
    const reload = await load("versioned");
    expect(reload.status, JSON.stringify(reload.json)).toBe(200);
    expect((await infer("versioned")).json.outputs[0].data).toEqual([2, 4, 6, 8]);
    const rows = (await postJson(`${server.http}/v2/repository/index`, {})).json as { name: string }[];
    expect(rows.filter((r) => r.name === "versioned")).toEqual([
      { name: "versioned", version: "1", state: "UNAVAILABLE", reason: "unloaded" },
      { name: "versioned", version: "2", state: "READY" },
    ]);
  });

  it("reloads a READY model whose config changed, without a gap; a failed reload keeps the loaded one", async () => {
    await addModel(repo, "tuned", { config: echoConfig("tuned", { params: { scale: "2" } }) });
    expect((await load("tuned")).status).toBe(200);
    expect((await infer("tuned")).json.outputs[0].data).toEqual([2, 4, 6, 8]);
    const reloads = () => server.logs.filter((l) => l.model === "tuned" && l.msg === "model reloaded").length;

    // Unchanged: a load is a no-op.
    expect((await load("tuned")).status).toBe(200);
    expect(reloads()).toBe(0);

    // Changed: the new config serves once loaded; a request already running on the old one finishes on it.
    const slow = postJson(`${server.http}/v2/models/tuned/infer`, slowRequest(800));
    await until(async () => (await pending(server, "tuned")) === 1, "the slow request to be running on tuned");
    await writeFile(join(repo, "tuned", "config.pbtxt"), echoConfig("tuned", { params: { scale: "3" } }));
    expect((await load("tuned")).status).toBe(200);
    expect(reloads()).toBe(1);
    expect((await infer("tuned")).json.outputs[0].data).toEqual([3, 6, 9, 12]);
    expect((await slow).json.outputs[0].data).toEqual([2, 4, 6, 8]);

    // A reload that fails is reported, and the loaded model goes on serving.
    await writeFile(
      join(repo, "tuned", "config.pbtxt"),
      echoConfig("tuned", { params: { scale: "4", module: "./missing.js" } }),
    );
    const failed = await load("tuned");
    expect(failed.status).toBe(400);
    expect(failed.json.error).toContain("missing.js");
    expect((await infer("tuned")).json.outputs[0].data).toEqual([3, 6, 9, 12]);
    const rows = (await postJson(`${server.http}/v2/repository/index`, {})).json as { name: string }[];
    expect(rows.filter((r) => r.name === "tuned")).toEqual([{ name: "tuned", version: "1", state: "READY" }]);
  });

  it("loads with a JSON 'config' parameter as Triton does, over HTTP and gRPC; a plain load goes back to config.pbtxt", async () => {
    await addModel(repo, "overridden", { config: echoConfig("overridden", { params: { scale: "2" } }) });
    expect((await load("overridden")).status).toBe(200);
    expect((await infer("overridden")).json.outputs[0].data).toEqual([2, 4, 6, 8]);

    // As tritonclient users do: read the config, change it, load with it.
    const config = (await (await fetch(`${server.http}/v2/models/overridden/config`)).json()) as {
      parameters: Record<string, { string_value: string }>;
    };
    const scaled = (scale: string) =>
      JSON.stringify({ ...config, parameters: { ...config.parameters, scale: { string_value: scale } } });
    const loadWith = (parameters: Record<string, unknown>) =>
      postJson(`${server.http}/v2/repository/models/overridden/load`, { parameters });
    expect((await loadWith({ config: scaled("5") })).status).toBe(200);
    expect((await infer("overridden")).json.outputs[0].data).toEqual([5, 10, 15, 20]);
    const served = (await (await fetch(`${server.http}/v2/models/overridden/config`)).json()) as typeof config;
    expect(served.parameters.scale?.string_value).toBe("5");

    const client = grpcClientOf(server);
    await client.repositoryModelLoad({
      modelName: "overridden",
      parameters: { config: { parameterChoice: { case: "stringParam", value: scaled("7") } } },
    });
    expect((await infer("overridden")).json.outputs[0].data).toEqual([7, 14, 21, 28]);

    expect((await load("overridden")).status).toBe(200);
    expect((await infer("overridden")).json.outputs[0].data).toEqual([2, 4, 6, 8]);

    // Refused, naming why; the loaded model goes on serving.
    const notJson = await loadWith({ config: "{max_batch_size: 8" });
    expect(notJson.status).toBe(400);
    expect(notJson.json.error).toMatch(
      /^failed to load 'overridden': the load request's 'config' parameter is not JSON: /,
    );
    const wrongName = await loadWith({ config: JSON.stringify({ ...config, name: "other" }) });
    expect(wrongName).toEqual({
      status: 400,
      json: { error: "failed to load 'overridden': the 'config' parameter names model 'other'" },
    });
    const badField = await loadWith({ config: JSON.stringify({ ...config, max_batch_size: "many" }) });
    expect(badField.status).toBe(400);
    expect(badField.json.error).toMatch(/'config' parameter is not a model config: .*max_batch_size/);
    expect((await loadWith({ config: { max_batch_size: 8 } })).json).toEqual({
      error: "load parameter 'config' must be a string (the model config as JSON)",
    });
    expect((await infer("overridden")).json.outputs[0].data).toEqual([2, 4, 6, 8]);

    // File overrides: the model's folder made of the request's files (see load-files.test.ts).
    const notes = Buffer.from("loaded from the request").toString("base64");
    expect((await loadWith({ config: scaled("3"), "file:1/notes.txt": notes })).status).toBe(200);
    expect((await infer("overridden")).json.outputs[0].data).toEqual([3, 6, 9, 12]);
    expect((await load("overridden")).status).toBe(200); // and back to the repository's
    expect((await infer("overridden")).json.outputs[0].data).toEqual([2, 4, 6, 8]);
  });

  it("closes a stage that loaded but failed its warmup", async () => {
    // A self-contained model.js: loads, then fails its readiness check; close() leaves a marker file.
    const marker = join(repo, "cold", "1", "closed");
    await addModel(repo, "cold", {
      config: `name: "cold"\nbackend: "typescript"\nmax_batch_size: 0\n`,
      files: {
        "1/model.js": `import { writeFileSync } from "node:fs";
export function createStage({ config, version }) {
  return {
    name: config.name, version, config,
    isReady: async () => { throw new Error("warmup failed: no device"); },
    metadata: () => ({ name: config.name, versions: [version], platform: "", inputs: [], outputs: [] }),
    infer: async () => { throw new Error("never ready"); },
    statistics: () => { throw new Error("never ready"); },
    close: async () => writeFileSync(${JSON.stringify(marker)}, "closed"),
  };
}
`,
      },
    });
    const failed = await load("cold");
    expect(failed.status).toBe(400);
    expect(failed.json.error).toContain("warmup failed: no device");
    expect(existsSync(marker)).toBe(true);
  });
});

/** A health Watch stream on `server`, after checking it starts SERVING. */
async function watchHealth(server: ServerProcess) {
  const health = createClient(Health, createGrpcTransport({ baseUrl: server.grpc }));
  const watch = health.watch({})[Symbol.asyncIterator]();
  expect((await watch.next()).value?.status).toBe(HealthCheckResponse_ServingStatus.SERVING);
  return {
    next: () => watch.next(),
    /** Reads to the end, so the stream ending (the server going away) does not surface as an unhandled rejection. */
    async drain() {
      for (let r = await watch.next().catch(() => ({ done: true })); !r.done; ) {
        r = await watch.next().catch(() => ({ done: true }));
      }
    },
  };
}

describe("graceful shutdown", () => {
  it("does not wait on open gRPC health Watch streams", async () => {
    const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const server = await startServerProcess(["--model-repository", repo, "--exit-timeout-secs", "20"]);
    try {
      const watch = await watchHealth(server);
      const drained = watch.drain();
      expect(await server.stop("SIGTERM")).toBe(0);
      await drained;
      expect(server.logs.find((l) => l.msg === "stopped")).toMatchObject({ timedOut: false });
    } finally {
      await server.stop("SIGKILL");
      await removeDir(repo);
    }
  });

  it("reports NOT_SERVING as soon as shutdown begins, while in-flight requests finish", async () => {
    const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const server = await startServerProcess(["--model-repository", repo, "--exit-timeout-secs", "20"]);
    try {
      const watch = await watchHealth(server);
      const slow = postJson(`${server.http}/v2/models/echo/infer`, slowRequest(2000, [7, 0, 0, 0]));
      await until(async () => (await pending(server, "echo")) === 1, "1 request in flight");
      const exitCode = server.stop("SIGTERM");
      const next = await watch.next();
      expect(next.value?.status).toBe(HealthCheckResponse_ServingStatus.NOT_SERVING);
      expect((await slow).status).toBe(200);
      await watch.drain();
      expect(await exitCode).toBe(0);
    } finally {
      await server.stop("SIGKILL");
      await removeDir(repo);
    }
  });

  it("on SIGTERM finishes in-flight HTTP and gRPC requests, then exits 0", async () => {
    const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const server = await startServerProcess(["--model-repository", repo, "--exit-timeout-secs", "20"]);
    try {
      const client = grpcClientOf(server);
      const viaHttp = [1, 2].map((i) =>
        postJson(`${server.http}/v2/models/echo/infer`, slowRequest(1500, [i, 0, 0, 0])),
      );
      const viaGrpc = [3, 4].map((i) =>
        client.modelInfer(
          create(ModelInferRequestSchema, {
            modelName: "echo",
            inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
            rawInputContents: [new Uint8Array(new Float32Array([i, 0, 0, 0]).buffer)],
            parameters: { delay_ms: { parameterChoice: { case: "int64Param", value: 1500n } } },
          }),
        ),
      );
      await until(async () => (await pending(server, "echo")) === 4, "4 requests in flight");
      const exitCode = server.stop("SIGTERM");
      const http = await Promise.all(viaHttp);
      expect(http.map((r) => [r.status, r.json.outputs[0].data[0]])).toEqual([
        [200, 1],
        [200, 2],
      ]);
      const grpc = await Promise.all(viaGrpc);
      expect(grpc.map((r) => floats(r.rawOutputContents[0] as Uint8Array)[0])).toEqual([3, 4]);
      expect(await exitCode).toBe(0);
      expect(server.logs.some((l) => l.msg === "waiting for in-flight requests to complete")).toBe(true);
      expect(server.logs.find((l) => l.msg === "stopped")).toMatchObject({ timedOut: false });
    } finally {
      await server.stop("SIGKILL");
      await removeDir(repo);
    }
  });
});

describe("poll mode over two repositories", () => {
  let first: string;
  let second: string;
  let server: ServerProcess;
  beforeAll(async () => {
    first = await makeRepository({
      echo: { config: echoConfig("echo", { params: { scale: "2" } }) },
      twin: { config: echoConfig("twin", { params: { scale: "5" } }) },
    });
    second = await makeRepository({
      twin: { config: echoConfig("twin", { params: { scale: "7" } }) },
      other: { config: echoConfig("other", { params: { scale: "3" } }) },
    });
    server = await startServerProcess([
      "--model-repository",
      first,
      "--model-repository",
      second,
      "--model-control-mode",
      "poll",
      "--repository-poll-secs",
      "0.2",
      // "twin" is in both repositories and fails to load: the rest is served.
      "--exit-on-error=false",
    ]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(first);
    await removeDir(second);
  });
  const infer = async (model: string) =>
    postJson(`${server.http}/v2/models/${model}/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
  const output = async (model: string) => (await infer(model)).json.outputs?.[0]?.data;

  it("refuses a model name found in both repositories and serves the rest; loads it once it is in one", async () => {
    expect(await output("echo")).toEqual([2, 4, 6, 8]);
    expect(await output("other")).toEqual([3, 6, 9, 12]);
    const twin = (await postJson(`${server.http}/v2/repository/index`, {})).json.find(
      (m: { name: string }) => m.name === "twin",
    );
    expect(twin).toMatchObject({ name: "twin", state: "UNAVAILABLE" });
    expect(twin.reason).toBe(
      'model "twin" is in more than one repository (repositories #1, #2): none of them is loaded',
    );
    // Not loaded: 404, as Triton's infer on a model it cannot find (see parity-codes.test.ts).
    expect((await infer("twin")).status).toBe(404);
    // A model that failed to load keeps the server not ready (strict readiness), until it loads.
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(400);

    await rm(join(second, "twin"), { recursive: true });
    await until(async () => (await infer("twin")).status === 200, "twin to load from the first repository");
    expect(await output("twin")).toEqual([5, 10, 15, 20]);
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
  });

  it("reloads a model whose config changed without refusing a request meanwhile", async () => {
    await writeFile(join(first, "echo", "config.pbtxt"), echoConfig("echo", { params: { scale: "4" } }));
    const seen = new Set<string>();
    await until(async () => {
      const res = await infer("echo");
      seen.add(res.status === 200 ? JSON.stringify(res.json.outputs[0].data) : `status ${res.status}`);
      return res.status === 200 && res.json.outputs[0].data[0] === 4;
    }, "echo to serve scale 4");
    // Every answer came from the old or the new config: no refusal while the new one loaded.
    expect([...seen].every((x) => x === "[2,4,6,8]" || x === "[4,8,12,16]")).toBe(true);
    expect(server.logs.some((l) => l.model === "echo" && l.msg === "model reloaded")).toBe(true);
  });
});

describe("which listeners open (--allow-http / --allow-grpc / --allow-metrics)", () => {
  let repo: string;
  beforeAll(async () => {
    repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  });
  afterAll(() => removeDir(repo));

  it("opens only the allowed ports, and refuses to start with neither HTTP nor gRPC", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      "--allow-http",
      "false",
      "--allow-metrics",
      "false",
    ]);
    try {
      const listening = server.logs.filter((l) => l.msg === "listening").map((l) => l.protocol);
      expect(listening).toEqual(["grpc"]);
      const client = grpcClientOf(server);
      expect((await client.serverLive({})).live).toBe(true);
    } finally {
      expect(await server.stop()).toBe(0);
    }
    const none = await startupRefusal(["--model-repository", repo, "--allow-http", "false", "--allow-grpc", "false"]);
    expect(String(none)).toContain("trellis-server: nothing to serve: --allow-http and --allow-grpc are both false");
  });
});

describe("--strict-readiness, --exit-on-error and per-listener addresses", () => {
  let repo: string;
  let gate: string;
  beforeAll(async () => {
    repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      broken: { config: echoConfig("broken", { params: { module: "./missing.js" } }) },
    });
    // A model that reports ready only once the test creates its gate file: its load waits until then.
    gate = join(repo, "slow-gate");
    await addModel(repo, "slow", {
      config: `name: "slow"\nbackend: "typescript"\nmax_batch_size: 0\n`,
      files: {
        "1/model.js": `import { existsSync } from "node:fs";
export function createStage({ config, version }) {
  return {
    name: config.name, version, config,
    isReady: async () => existsSync(${JSON.stringify(gate)}),
    metadata: () => ({ name: config.name, versions: [version], platform: "", inputs: [], outputs: [] }),
    infer: async () => { throw new Error("no inputs"); },
    statistics: () => ({}),
    close: async () => {},
  };
}
`,
      },
    });
  });
  afterAll(() => removeDir(repo));

  const explicit = (extra: string[]) => startServerProcess([...explicitModels(repo), ...extra]);
  const ready = async (server: ServerProcess) => (await fetch(`${server.http}/v2/health/ready`)).status;

  it("is not ready while a model loads, unless --strict-readiness false", async () => {
    const strict = await explicit([]);
    const lax = await explicit(["--strict-readiness", "false"]);
    try {
      await rm(gate, { force: true });
      const loads = [strict, lax].map((s) => postJson(`${s.http}/v2/repository/models/slow/load`, {}));
      await until(
        async () =>
          (await postJson(`${strict.http}/v2/repository/index`, {})).json.some(
            (m: { name: string; state?: string }) => m.name === "slow" && m.state === "LOADING",
          ),
        "slow to be loading",
      );
      expect(await ready(strict)).toBe(400);
      expect(await ready(lax)).toBe(200);
      await writeFile(gate, "");
      for (const load of await Promise.all(loads)) expect(load.status).toBe(200);
      expect(await ready(strict)).toBe(200);
    } finally {
      expect(await strict.stop()).toBe(0);
      expect(await lax.stop()).toBe(0);
    }
  });

  it("exits 1 when a model fails to load at start (--exit-on-error, Triton's default); with --exit-on-error=false, serves the rest", async () => {
    const exits = await explicit(["--load-model", "echo", "--load-model", "broken"]).catch((e: Error) => e);
    expect(String(exits)).toMatch(/server exited with 1 before starting/);
    const serves = await explicit(["--load-model", "echo", "--load-model", "broken", "--exit-on-error=false"]);
    try {
      expect((await postJson(`${serves.http}/v2/models/echo/infer`, slowRequest(0))).status).toBe(200);
    } finally {
      expect(await serves.stop()).toBe(0);
    }
  });

  it("binds each listener to its own --*-address", async () => {
    const server = await explicit(["--host", "127.0.0.1", "--metrics-address", "0.0.0.0"]);
    try {
      const hosts = Object.fromEntries(
        server.logs.filter((l) => l.msg === "listening").map((l) => [l.protocol as string, l.host]),
      );
      expect(hosts).toEqual({ grpc: "127.0.0.1", http: "127.0.0.1", metrics: "0.0.0.0" });
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });
});

describe("--log-file", () => {
  it("writes the logs there instead of stdout, reports it as log_file, and refuses a file it cannot write", async () => {
    const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const logFile = join(repo, "server.log");
    const server = await startServerProcess(["--model-repository", repo, "--log-file", logFile], { logFile });
    let stdout = "";
    server.proc.stdout?.on("data", (d) => {
      stdout += String(d);
    });
    try {
      expect(server.logs.filter((l) => l.msg === "listening").map((l) => l.protocol)).toEqual([
        "grpc",
        "http",
        "metrics",
      ]);
      const settings = (await (await fetch(`${server.http}/v2/logging`)).json()) as { log_file: string };
      expect(settings.log_file).toBe(logFile);
      expect(await postJson(`${server.http}/v2/logging`, { log_file: join(repo, "elsewhere.log") })).toEqual({
        status: 501,
        json: {
          error:
            "log file location can not be updated through network protocol: it is set when the server starts (--log-file <path>)",
        },
      });
    } finally {
      expect(await server.stop()).toBe(0);
    }
    // Everything up to the last line of the shutdown is in the file; nothing went to stdout.
    const lines = readFileSync(logFile, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { msg: string });
    expect(lines.at(-1)?.msg).toBe("stopped");
    expect(stdout).toBe("");
    const refused = await startupRefusal(["--model-repository", repo, "--log-file", join(repo, "no", "x.log")]);
    expect(String(refused)).toContain(`trellis-server: --log-file ${join(repo, "no", "x.log")}: ENOENT`);
    await removeDir(repo);
  });
});
