/**
 * The TensorRT bridge (@trellis/inference-trt-bridge) against a remote whose model never
 * becomes ready, black-box: two real servers. The remote is a Trellis server standing in for
 * Triton, started with --exit-on-error=false so it stays up with its failed model listed in
 * RepositoryIndex (state and reason, as Triton's); the front server loads bridge models
 * pointing at it and at a port nothing listens on (a Triton that exited, as its default
 * --exit-on-error=true makes it on a model that fails to load).
 */
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, makeRepository, postJson } from "./helpers.js";

// The engine's config says FP16 where the model is FP32: the remote refuses the model, as
// Triton refuses a TensorRT plan whose config type disagrees with the engine.
const ENGINE_CONFIG = `name: "engine"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP16 dims: [ 4 ] } ]
output [ { name: "X_out" data_type: TYPE_FP16 dims: [ 4 ] } ]
`;

const bridgeConfig = (name: string, endpoint: string) => `name: "${name}"
backend: "typescript"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "X_out" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "module" value: { string_value: "@trellis/inference-trt-bridge" } }
parameters { key: "endpoint" value: { string_value: "${endpoint}" } }
parameters { key: "remote_model_name" value: { string_value: "engine" } }
parameters { key: "ready_timeout_ms" value: { string_value: "1500" } }
`;

const repos: string[] = [];
const servers: ServerProcess[] = [];
let front: ServerProcess;
let remoteRepo: string;

beforeAll(async () => {
  remoteRepo = await makeRepository({
    engine: {
      config: ENGINE_CONFIG,
      files: { "1/model.onnx": identityModel([{ name: "X", type: "float32", shape: ["N", 4] }]) },
    },
  });
  repos.push(remoteRepo);
  const remote = await startServerProcess(["--model-repository", remoteRepo, "--exit-on-error=false"]);
  servers.push(remote);
  const gone = `http://127.0.0.1:${await freePort()}`;
  const frontRepo = await makeRepository({
    to_failed: { config: bridgeConfig("to_failed", remote.grpc) },
    to_gone: { config: bridgeConfig("to_gone", gone) },
  });
  repos.push(frontRepo);
  front = await startServerProcess(["--model-repository", frontRepo, "--exit-on-error=false"]);
  servers.push(front);
});

afterAll(async () => {
  for (const s of servers.reverse()) expect(await s.stop()).toBe(0);
  for (const r of repos) await removeDir(r);
});

/** The reason the front server gives a client for a model's failed load (its RepositoryIndex). */
async function reasonOf(model: string): Promise<string> {
  const { status, json } = await postJson(`${front.http}/v2/repository/index`, {});
  expect(status).toBe(200);
  const entry = json.find((m: { name: string }) => m.name === model);
  expect(entry).toMatchObject({ name: model, state: "UNAVAILABLE" });
  return String(entry.reason);
}

describe("bridge to a remote model that never becomes ready", () => {
  it("shows the remote's own load-failure reason (RepositoryIndex) and mentions --exit-on-error", async () => {
    const reason = await reasonOf("to_failed");
    expect(reason).toContain("not ready after waiting 1500 ms");
    // The remote's reason, as its RepositoryIndex gives it.
    expect(reason).toContain("the server lists model engine version 1 UNAVAILABLE: ");
    expect(reason).toContain("input X: config datatype FP16, model datatype FP32");
    expect(reason).toContain("--exit-on-error");
    // Nothing of where either server keeps its files.
    expect(reason).not.toContain(remoteRepo);
    expect(reason).not.toMatch(/\/tmp\//);
    // The operator's log has the same reason.
    const logged = front.logs.find((l) => l.msg === "model failed to load" && l.model === "to_failed");
    expect(String(logged?.reason)).toContain("input X: config datatype FP16, model datatype FP32");
  });

  it("for a remote that refuses connections, suggests Triton's log and --exit-on-error", async () => {
    const reason = await reasonOf("to_gone");
    expect(reason).toContain("not ready after waiting 1500 ms");
    expect(reason).toMatch(/ECONNREFUSED/);
    expect(reason).toContain("Is Triton running?");
    expect(reason).toContain("check Triton's log");
    expect(reason).toContain("--exit-on-error");
  });
});
