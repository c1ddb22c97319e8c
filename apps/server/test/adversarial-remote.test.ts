/**
 * Adversarial: a remote ensemble step (--endpoints) that hangs or restarts. The step's server
 * is a child process; SIGSTOP freezes it (its kernel still accepts connections and bytes, it
 * answers nothing), SIGKILL and a restart on the same port replace it. The front must keep
 * answering readiness from what it last knew, fail a request to the frozen step with
 * DEADLINE_EXCEEDED (its --endpoints-timeout-secs) or UNAVAILABLE (its keepalive ping going
 * unanswered) naming the step and not its address, and never call the ensemble unknown (404)
 * while the step's server is away or has not loaded the step yet.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  echoConfig,
  explicitModels,
  freePort,
  grpcClientOf,
  makeRepository,
  postJson,
  TENFOLD_CONFIG,
} from "./helpers.js";

/** The step deadline the front under test gets (--endpoints-timeout-secs). */
const STEP_DEADLINE_S = 2;
/** How long an answer that must not wait on the frozen step may take: generous, and far below any hang. */
const PROMPT_MS = 10_000;

let repo: string;
let remotePort: number;
/** The step's server (echo10), on a port picked here so a restart can take it again. */
let remote: ServerProcess | undefined;
let stopped = false;
/** Front with a short step deadline and the default keepalive. */
let front: ServerProcess;
/** Front with a long step deadline and a fast keepalive: it finds the frozen step by its unanswered ping. */
let pinging: ServerProcess;
const fronts: ServerProcess[] = [];

const explicit = (model?: string) => [...explicitModels(repo), ...(model ? ["--load-model", model] : [])];

const startRemote = (model?: string) => startServerProcess([...explicit(model), "--grpc-port", String(remotePort)]);

beforeAll(async () => {
  repo = await makeRepository({
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    tenfold: { config: TENFOLD_CONFIG },
  });
  remotePort = await freePort();
  remote = await startRemote("echo10");
  const endpoints = join(repo, "endpoints.json");
  await writeFile(endpoints, JSON.stringify({ echo10: remote.grpc }));
  const started = await Promise.allSettled([
    startServerProcess([
      ...explicit("tenfold"),
      "--endpoints",
      endpoints,
      "--endpoints-timeout-secs",
      String(STEP_DEADLINE_S),
    ]),
    startServerProcess([
      ...explicit("tenfold"),
      "--endpoints",
      endpoints,
      "--endpoints-timeout-secs",
      "600",
      "--endpoints-keepalive-time",
      "500",
      "--endpoints-keepalive-timeout",
      "1000",
    ]),
  ]);
  for (const s of started) if (s.status === "fulfilled") fronts.push(s.value);
  const failed = started.find((s) => s.status === "rejected");
  if (failed) throw failed.reason;
  [front, pinging] = fronts as [ServerProcess, ServerProcess];
}, 180_000);

afterAll(async () => {
  // A frozen process ignores SIGTERM until it runs again.
  if (remote?.proc.pid !== undefined && stopped) process.kill(remote.proc.pid, "SIGCONT");
  for (const s of fronts) await s.stop();
  await remote?.stop("SIGKILL");
  await removeDir(repo);
}, 60_000);

const grpc = (server: ServerProcess) => grpcClientOf(server);

const inferRequest = {
  modelName: "tenfold",
  inputs: [{ name: "IN", datatype: "FP32", shape: [1n, 4n] }],
  rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
};

/** A gRPC ModelInfer on `server`: its answer's values, or the error it failed with, and how long it took. */
async function grpcInfer(
  server: ServerProcess,
  options: { timeoutMs?: number; headers?: Record<string, string> } = {},
): Promise<{ values?: number[]; error?: ConnectError; ms: number }> {
  const started = Date.now();
  try {
    const res = await grpc(server).modelInfer(inferRequest, options);
    const raw = res.rawOutputContents[0] as Uint8Array;
    const values = Array.from(new Float32Array(Uint8Array.from(raw).buffer));
    return { values, ms: Date.now() - started };
  } catch (err) {
    return { error: ConnectError.from(err), ms: Date.now() - started };
  }
}

/** An HTTP infer on `server`: status and body. */
async function httpInfer(server: ServerProcess) {
  return postJson(`${server.http}/v2/models/tenfold/infer`, {
    inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
  });
}

/** Each readiness answer the front gives, each bounded by PROMPT_MS (a hung one fails the test). */
async function readiness(server: ServerProcess) {
  const bounded = { signal: AbortSignal.timeout(PROMPT_MS) };
  const client = grpc(server);
  const [serverReady, modelReady, grpcServerReady, grpcModelReady, health] = await Promise.all([
    fetch(`${server.http}/v2/health/ready`, bounded).then((r) => r.status),
    fetch(`${server.http}/v2/models/tenfold/ready`, bounded).then((r) => r.status),
    client.serverReady({}, { timeoutMs: PROMPT_MS }).then((r) => r.ready),
    client.modelReady({ name: "tenfold" }, { timeoutMs: PROMPT_MS }).then((r) => r.ready),
    createClient(Health, createGrpcTransport({ baseUrl: server.grpc }))
      .check({}, { timeoutMs: PROMPT_MS })
      .then((r) => r.status === HealthCheckResponse_ServingStatus.SERVING),
  ]);
  return { serverReady, modelReady, grpcServerReady, grpcModelReady, health };
}

const READY = { serverReady: 200, modelReady: 200, grpcServerReady: true, grpcModelReady: true, health: true };
const NOT_READY = { serverReady: 400, modelReady: 400, grpcServerReady: false, grpcModelReady: false, health: false };

/** Polls the front's readiness (each answer bounded) until it is `want`: at most 80 tries, 250 ms apart. */
async function readinessBecomes(server: ServerProcess, want: typeof READY): Promise<void> {
  let last: Awaited<ReturnType<typeof readiness>> | undefined;
  for (let i = 0; i < 80; i++) {
    last = await readiness(server);
    if (JSON.stringify(last) === JSON.stringify(want)) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  expect(last).toEqual(want);
}

/** The client sees the step's name, never where it lives. */
function expectNamesStepOnly(message: string): void {
  expect(message).toContain("echo10");
  expect(message).not.toContain("127.0.0.1");
  expect(message).not.toContain(String(remotePort));
  expect(message).not.toMatch(/https?:\/\//);
}

describe("a remote step that hangs (SIGSTOP)", () => {
  it("serves through the remote step while it is healthy", async () => {
    for (const s of fronts) {
      expect(await readiness(s)).toEqual(READY);
      expect((await grpcInfer(s)).values).toEqual([10, 20, 30, 40]);
    }
  });

  it("readiness on the front answers at once from the last known state, then reports not ready", async () => {
    process.kill((remote as ServerProcess).proc.pid as number, "SIGSTOP");
    stopped = true;
    // Each answer comes within PROMPT_MS (today: none comes while the step is frozen).
    await readiness(front);
    // The background check of the step times out: the front says not ready, still at once.
    await readinessBecomes(front, NOT_READY);
  }, 60_000);

  it("fails a request DEADLINE_EXCEEDED naming the step within --endpoints-timeout-secs, not its address", async () => {
    const viaGrpc = await grpcInfer(front, { timeoutMs: 30_000 });
    expect(viaGrpc.values).toBeUndefined();
    expect(viaGrpc.error?.code).toBe(Code.DeadlineExceeded);
    expectNamesStepOnly(viaGrpc.error?.rawMessage ?? "");
    expect(viaGrpc.error?.rawMessage).toContain(`no answer within ${STEP_DEADLINE_S} s`);
    // Far below the client's own 30 s: the step's deadline ended it.
    expect(viaGrpc.ms).toBeLessThan(20_000);

    const viaHttp = await httpInfer(front);
    expect(viaHttp.status).toBe(503);
    expectNamesStepOnly(viaHttp.json.error);
    expect(viaHttp.json.error).toContain("DEADLINE_EXCEEDED");

    // The log has where the step is.
    const warned = front.logs.filter((l) => l.msg === "remote model failing");
    expect(warned).toContainEqual(
      expect.objectContaining({ model: "echo10", endpoint: `http://127.0.0.1:${remotePort}` }),
    );
  }, 60_000);

  it("a client's own shorter deadline still applies", async () => {
    // grpc-timeout set by hand: the client keeps no timer of its own, so the answer is the server's.
    const res = await grpcInfer(front, { headers: { "grpc-timeout": "300m" } });
    expect(res.error?.code).toBe(Code.DeadlineExceeded);
    // The front's answer (a status it sent), and not the step deadline's.
    expect(res.error?.metadata.get("grpc-status")).toBe(String(Code.DeadlineExceeded));
    expect(res.error?.rawMessage).not.toContain("no answer within");
  }, 30_000);

  it("finds the frozen step by its unanswered keepalive ping: UNAVAILABLE naming the step", async () => {
    // This front's step deadline is 600 s: only the ping can end the call this soon.
    const res = await grpcInfer(pinging, { timeoutMs: 120_000 });
    expect(res.error?.code).toBe(Code.Unavailable);
    expectNamesStepOnly(res.error?.rawMessage ?? "");
    expect(res.error?.rawMessage).toContain("keepalive ping went unanswered");
    expect(res.ms).toBeLessThan(60_000);
  }, 150_000);

  it("answers correctly once the step runs again, and is ready again", async () => {
    process.kill((remote as ServerProcess).proc.pid as number, "SIGCONT");
    stopped = false;
    for (const s of fronts) {
      expect((await grpcInfer(s, { timeoutMs: 30_000 })).values).toEqual([10, 20, 30, 40]);
      await readinessBecomes(s, READY);
    }
  }, 60_000);
});

describe("a remote step that restarts", () => {
  it("is UNAVAILABLE naming the step (never 404 for the ensemble) while its server is down or has not loaded it, then serves again", async () => {
    await (remote as ServerProcess).stop("SIGKILL");
    // Down: nothing listens on its port.
    const down = await grpcInfer(front, { timeoutMs: 30_000 });
    expect(down.error?.code).toBe(Code.Unavailable);
    expectNamesStepOnly(down.error?.rawMessage ?? "");
    const downHttp = await httpInfer(front);
    expect(downHttp.status).toBe(503);
    expectNamesStepOnly(downHttp.json.error);
    await readinessBecomes(front, NOT_READY);

    // Back on its port but without the step loaded yet (as while a restarted server loads its models).
    remote = await startRemote();
    const notLoaded = await grpcInfer(front, { timeoutMs: 30_000 });
    expect(notLoaded.error?.code).toBe(Code.Unavailable);
    expectNamesStepOnly(notLoaded.error?.rawMessage ?? "");
    const notLoadedHttp = await httpInfer(front);
    expect(notLoadedHttp.status).toBe(503);
    expectNamesStepOnly(notLoadedHttp.json.error);

    const load = await postJson(`${remote.http}/v2/repository/models/echo10/load`, {});
    expect(load.status).toBe(200);
    expect((await grpcInfer(front, { timeoutMs: 30_000 })).values).toEqual([10, 20, 30, 40]);
    expect((await httpInfer(front)).json.outputs[0].data).toEqual([10, 20, 30, 40]);
    await readinessBecomes(front, READY);
  }, 120_000);
});
