import { readFileSync } from "node:fs";
import http2, { type ServerHttp2Session } from "node:http2";
import { ConnectError, type Interceptor } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { type ListeningServer, type ListenOptions, listenStage, serveStage } from "@trellis/frontends";
import { type ModelInferRequest, parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, type Stage, tensor } from "@trellis/stage";
import { float32ToFloat16Bits } from "@trellis/stage/backend";
import { rejectionOf, TLS_CERT_PATH, TLS_KEY_PATH } from "@trellis/testing";
import { afterEach, describe, expect, it, vi } from "vitest";
import { bridgeDefinition, createStage, createTrtBridge } from "../src/index.js";
import { scaleConfig, scaleStage } from "./fixtures/test-stage.mjs";
import { type Child, freePort, listenH2, spawnServer } from "./helpers.js";

const cleanup: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function serve(stage: Stage, options: ListenOptions = {}): Promise<ListeningServer> {
  const server = await listenStage(stage, options);
  cleanup.push(() => server.close());
  return server;
}

async function child(kind: "scale" | "hold", port = 0): Promise<Child> {
  const c = await spawnServer(kind, port);
  cleanup.push(() => c.kill());
  return c;
}

/** The local ensemble step: same tensors as the remote, its own name. */
const localConfig = (opts: Parameters<typeof scaleConfig>[0] = {}) => scaleConfig({ name: "scale_bridge", ...opts });

const batch = (n: number, width = 4) =>
  tensor(
    "x",
    "FP32",
    [n, width],
    Float32Array.from({ length: n * width }, (_, i) => i * 0.25 - 1),
  );

describe("bridge over real gRPC", () => {
  it("gives the direct stage's outputs and keeps per-request statistics", async () => {
    const remote = scaleStage(scaleConfig());
    const server = await serve(remote);
    const bridge = await createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "scale" });
    const request = { id: "r1", inputs: [batch(3)] };
    const direct = await remote.infer(request);
    const bridged = await bridge.infer(request);
    expect(bridged.modelName).toBe("scale_bridge");
    expect(bridged.id).toBe("r1");
    expect(bridged.outputs.map((t) => [t.name, t.datatype, t.shape])).toEqual([["y", "FP32", [3, 4]]]);
    expect(Array.from(bridged.outputs[0]?.data as Float32Array)).toEqual(
      Array.from(direct.outputs[0]?.data as Float32Array),
    );
    await bridge.infer({ inputs: [batch(5)] });
    const stats = await bridge.statistics();
    expect(stats.name).toBe("scale_bridge");
    expect(stats.inferenceCount).toBe(8n);
    expect(stats.executionCount).toBe(2n);
    expect(stats.inferenceStats?.success?.count).toBe(2n);
    expect(stats.inferenceStats?.computeInfer?.ns).toBeGreaterThan(0n);
    expect(stats.batchStats.map((b) => b.batchSize)).toEqual([3n, 5n]);
    expect(await bridge.isReady()).toBe(true);
    expect((await bridge.metadata()).inputs).toEqual([{ name: "x", datatype: "FP32", shape: [-1, 4] }]);
  });

  it("loads from config parameters through createStage, sending header:<Name> parameters", async () => {
    const remote = scaleStage(scaleConfig());
    const seen: string[] = [];
    const server = http2.createServer(
      connectNodeAdapter({
        routes: serveStage(remote),
        interceptors: [
          (next) => (req) => {
            seen.push(req.header.get("triton-grpc-protocol-infer") ?? "");
            return next(req);
          },
        ],
      }),
    );
    const { port, close } = await listenH2(server);
    cleanup.push(close);
    const config = parseModelConfig(`
name: "scale_bridge"
backend: "typescript"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "module" value: { string_value: "@trellis/inference-trt-bridge" } }
parameters { key: "endpoint" value: { string_value: "http://127.0.0.1:${port}" } }
parameters { key: "remote_model_name" value: { string_value: "scale" } }
parameters { key: "remote_model_version" value: { string_value: "1" } }
parameters { key: "timeout_ms" value: { string_value: "5000" } }
parameters { key: "header:triton-grpc-protocol-infer" value: { string_value: "infer-key" } }
`);
    const bridge = defineStage(
      await createStage({ config, modelDir: "/nonexistent", version: "1", versionDir: "/nonexistent/1" }),
    );
    const res = await bridge.infer({ inputs: [batch(2)] });
    expect(Array.from(res.outputs[0]?.data as Float32Array)).toEqual(
      Array.from(batch(2).data as Float32Array, (v) => v * 2),
    );
    expect(seen.length).toBeGreaterThan(0);
    expect(new Set(seen)).toEqual(new Set(["infer-key"]));
  });

  it("rejects bad parameters with the parameter's name", async () => {
    const config = localConfig();
    await expect(createStage({ config, modelDir: ".", version: "1", versionDir: "1" })).rejects.toThrow(
      /parameter endpoint is required/,
    );
    const withParams = (extra: string) =>
      parseModelConfig(`
name: "scale_bridge"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "endpoint" value: { string_value: "http://127.0.0.1:1" } }
${extra}`);
    const zero = await rejectionOf(
      createStage({
        config: withParams(`parameters { key: "timeout_ms" value: { string_value: "0" } }`),
        modelDir: ".",
        version: "1",
        versionDir: "1",
      }),
      ConnectError,
    );
    expect(zero.code).toBe(Code.InvalidArgument);
    expect(zero.message).toContain('parameter timeout_ms: expected a whole number ≥ 1, got "0"');
    const noCa = await rejectionOf(
      createStage({
        config: withParams(`parameters { key: "tls_ca_file" value: { string_value: "missing-ca.pem" } }`),
        modelDir: "/nonexistent",
        version: "1",
        versionDir: "/nonexistent/1",
      }),
      ConnectError,
    );
    expect(noCa.code).toBe(Code.InvalidArgument);
    expect(noCa.message).toMatch(/parameter tls_ca_file: cannot read \/nonexistent\/missing-ca\.pem: ENOENT/);
  });

  it("ends its HTTP/2 connection on close, and after a load that fails", async () => {
    const server = await serve(scaleStage(scaleConfig()));
    const sessions: ServerHttp2Session[] = [];
    server.server.on("session", (s) => sessions.push(s));
    const ended = (s: ServerHttp2Session | undefined) =>
      new Promise((resolve) => (s?.closed ? resolve(undefined) : s?.once("close", resolve)));
    const bridge = await createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "scale" });
    await bridge.infer({ inputs: [batch(1)] });
    expect(sessions).toHaveLength(1);
    await bridge.close();
    await ended(sessions[0]);

    const mismatch = await rejectionOf(
      createTrtBridge({ config: localConfig({ dims: [5] }), endpoint: server.url, modelName: "scale" }),
      ConnectError,
    );
    expect(mismatch.code).toBe(Code.InvalidArgument);
    expect(sessions).toHaveLength(2);
    await ended(sessions[1]);
  });

  it("speaks TLS when given a CA", async () => {
    const remote = scaleStage(scaleConfig());
    const key = readFileSync(TLS_KEY_PATH);
    const cert = readFileSync(TLS_CERT_PATH);
    const server = await serve(remote, { tls: { cert, key } });
    const endpoint = server.url;
    expect(endpoint).toMatch(/^https:/);
    const bridge = await createTrtBridge({ config: localConfig(), endpoint, modelName: "scale", tls: { ca: cert } });
    const res = await bridge.infer({ inputs: [batch(1)] });
    expect(Array.from(res.outputs[0]?.data as Float32Array)).toEqual([-2, -1.5, -1, -0.5]);
    // Without trusting the CA the handshake fails, so the load cannot succeed.
    const err = await rejectionOf(
      createTrtBridge({ config: localConfig(), endpoint, modelName: "scale", readyTimeoutMs: 300 }),
      ConnectError,
    );
    expect(err.code).toBe(Code.Unavailable);
    expect(err.message).toMatch(/certificate/i);
  });
});

/**
 * Triton's gRPC frontend's checks on request parameters (server src/grpc/infer_handler.cc,
 * SetInferenceRequestMetadata): its own keys with their wire types, `triton_*` keys refused
 * but for the one it reserves (src/common.h TRITON_RESERVED_REQUEST_PARAMS), others passed to
 * the backend when int64, bool, string or double. Records what each ModelInfer carried.
 */
function tritonParameterChecks(seen: Record<string, { case?: string; value?: unknown }>[]): Interceptor {
  const types: Record<string, string[]> = {
    sequence_id: ["int64Param", "stringParam"],
    sequence_start: ["boolParam"],
    sequence_end: ["boolParam"],
    priority: ["int64Param", "uint64Param"],
    timeout: ["int64Param"],
  };
  return (next) => async (req) => {
    if (req.method.name !== "ModelInfer" || req.stream) return next(req);
    const msg = req.message as ModelInferRequest;
    const params = Object.fromEntries(Object.entries(msg.parameters).map(([k, v]) => [k, v.parameterChoice]));
    seen.push(params);
    for (const [key, choice] of Object.entries(params)) {
      const allowed = types[key] ?? ["int64Param", "boolParam", "stringParam", "doubleParam"];
      if (key.startsWith("triton_") && key !== "triton_enable_empty_final_response") {
        throw new ConnectError(
          "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with 'triton_' are allowed: triton_enable_empty_final_response",
          Code.InvalidArgument,
        );
      }
      if (!allowed.includes(String(choice.case))) {
        throw new ConnectError(`invalid value type for '${key}' parameter`, Code.InvalidArgument);
      }
    }
    return next(req);
  };
}

describe("request parameters", () => {
  /** A bridge to a server that applies Triton's parameter checks and records what arrived. */
  async function bridgeToParameterChecks() {
    const seen: Record<string, { case?: string; value?: unknown }>[] = [];
    const server = http2.createServer(
      connectNodeAdapter({
        routes: serveStage(scaleStage(scaleConfig())),
        interceptors: [tritonParameterChecks(seen)],
      }),
    );
    const { port, close } = await listenH2(server);
    cleanup.push(close);
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint: `http://127.0.0.1:${port}`,
      modelName: "scale",
    });
    cleanup.push(() => bridge.close());
    return { seen, bridge };
  }

  it("forwards Triton's own and the backend's parameters, and drops the triton_* keys Triton refuses", async () => {
    const { seen, bridge } = await bridgeToParameterChecks();
    const res = await bridge.infer({
      inputs: [batch(1)],
      parameters: {
        sequence_id: 42n,
        sequence_start: true,
        sequence_end: false,
        priority: 2,
        timeout: 5_000_000,
        triton_enable_empty_final_response: true,
        triton_unknown_key: "from a client",
        custom: "for the backend",
      },
    });
    expect(res.outputs[0]?.shape).toEqual([1, 4]);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toEqual({
      sequence_id: { case: "int64Param", value: 42n },
      sequence_start: { case: "boolParam", value: true },
      sequence_end: { case: "boolParam", value: false },
      priority: { case: "int64Param", value: 2n },
      timeout: { case: "int64Param", value: 5_000_000n },
      custom: { case: "stringParam", value: "for the backend" },
    });
    // A string sequence id passes as Triton's string_param.
    await bridge.infer({ inputs: [batch(1)], parameters: { sequence_id: "session-7", sequence_start: true } });
    expect(seen[1]).toEqual({
      sequence_id: { case: "stringParam", value: "session-7" },
      sequence_start: { case: "boolParam", value: true },
    });
  });

  it("refuses a Triton parameter of the wrong type with INVALID_ARGUMENT naming it, before sending", async () => {
    const { seen, bridge } = await bridgeToParameterChecks();
    const err = await rejectionOf(
      bridge.infer({ inputs: [batch(1)], parameters: { sequence_start: "yes" } }),
      ConnectError,
    );
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toContain("request parameter 'sequence_start' must be a boolean");
    expect(seen).toHaveLength(0);
  });
});

describe("load-time checks", () => {
  const cases: [string, Parameters<typeof scaleConfig>[0], RegExp][] = [
    ["dims", { dims: [5] }, /input x: shape expected \[-1,5\], got \[-1,4\]/],
    ["datatype", { datatype: "TYPE_INT32" }, /input x: datatype expected INT32, got FP32/],
    ["max_batch_size", { maxBatchSize: 16 }, /max_batch_size: expected at least 16, got 8/],
    ["batching", { maxBatchSize: 0, dims: [9, 4] }, /input x: leading dim 9 sent as the batch, got max_batch_size 8/],
    ["rank", { maxBatchSize: 0, dims: [4] }, /input x: shape expected \[4\], got \[-1,4\]/],
  ];
  for (const [what, opts, message] of cases) {
    it(`names the tensor, expected and got on a ${what} mismatch`, async () => {
      const server = await serve(scaleStage(scaleConfig()));
      const err = await rejectionOf(
        createTrtBridge({ config: localConfig(opts), endpoint: server.url, modelName: "scale" }),
        ConnectError,
      );
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.message).toMatch(message);
      expect(err.message).toContain(`remote model scale at ${server.url}`);
    });
  }

  it("names a missing tensor and the remote's tensors", async () => {
    const server = await serve(scaleStage(scaleConfig()));
    const config = parseModelConfig(`
name: "b" max_batch_size: 8
input [ { name: "images" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]`);
    const err = await rejectionOf(createTrtBridge({ config, endpoint: server.url, modelName: "scale" }), ConnectError);
    expect(err.message).toMatch(/input images: expected a remote input named images, got \[x\]/);
  });

  it("refuses an FP16 engine unless conversion is allowed, then converts both ways", async () => {
    const server = await serve(scaleStage(scaleConfig({ datatype: "TYPE_FP16" })));
    const err = await rejectionOf(
      createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "scale" }),
      ConnectError,
    );
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toMatch(/input x: datatype expected FP32, got FP16 .*fp16_conversion/);
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint: server.url,
      modelName: "scale",
      allowFp16Conversion: true,
    });
    // Values exact in FP16, plus one that rounds (1/3) and one that overflows once doubled.
    const x = Float32Array.from([0.5, -3.25, 1 / 3, 40000]);
    const res = await bridge.infer({ inputs: [tensor("x", "FP32", [1, 4], x)] });
    const y = res.outputs[0];
    expect(y?.datatype).toBe("FP32");
    const third = float32ToFloat16Bits(1 / 3);
    expect(third).toBe(0x3555);
    expect(Array.from(y?.data as Float32Array)).toEqual([1, -6.5, 2 * 0.333251953125, Number.POSITIVE_INFINITY]);
  });

  it("waits, bounded, for a server that is down, then says what it waited for", async () => {
    const port = await freePort();
    const endpoint = `http://127.0.0.1:${port}`;
    const started = Date.now();
    const err = await rejectionOf(
      createTrtBridge({ config: localConfig(), endpoint, modelName: "scale", readyTimeoutMs: 700 }),
      ConnectError,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(700);
    expect(err.code).toBe(Code.Unavailable);
    expect(err.message).toContain(`remote model scale at ${endpoint} not ready after waiting 700 ms`);
    expect(err.message).toMatch(/ECONNREFUSED/);
  });

  it("loads once a late server comes up within the wait", async () => {
    const port = await freePort();
    const late = new Promise<Child>((resolve) => setTimeout(() => resolve(child("scale", port)), 300));
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint: `http://127.0.0.1:${port}`,
      modelName: "scale",
      readyTimeoutMs: 20_000,
    });
    await late;
    const res = await bridge.infer({ inputs: [batch(1)] });
    expect(res.outputs[0]?.shape).toEqual([1, 4]);
  });

  it("reports a model the server does not host as not ready", async () => {
    const server = await serve(scaleStage(scaleConfig()));
    // Long enough for its first polls to answer while turbo runs every suite on 2 cores (300 ms
    // once read "server is not ready", 2 s once "deadline exceeded").
    const err = await rejectionOf(
      createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "resnet50_trt", readyTimeoutMs: 5000 }),
      ConnectError,
    );
    expect(err.message).toMatch(
      /remote model resnet50_trt at .* not ready .*server is ready but model resnet50_trt is not/,
    );
  });
});

describe("failures while running", () => {
  it("refuses in process, in Triton's words, what the local config does not accept", async () => {
    const server = await serve(scaleStage(scaleConfig()));
    const bridge = await createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "scale" });
    const bad = tensor("x", "INT32", [1, 4], Int32Array.from([1, 2, 3, 4]));
    const err = await rejectionOf(bridge.infer({ inputs: [bad] }), ConnectError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toContain("inference input 'x' data-type is 'INT32', but model 'scale_bridge' expects 'FP32'");
    expect((await bridge.statistics()).inferenceStats?.fail?.count).toBe(1n);
    await bridge.close();
  });

  it("keeps the remote's error code and says the remote raised it", async () => {
    const server = await serve(scaleStage(scaleConfig()));
    // What the bridge computes, without the local checks in front: the remote refuses.
    const bridge = defineStage(
      await bridgeDefinition({ config: localConfig(), endpoint: server.url, modelName: "scale" }),
    );
    const bad = tensor("x", "INT32", [1, 4], Int32Array.from([1, 2, 3, 4]));
    const err = await rejectionOf(bridge.infer({ inputs: [bad] }), ConnectError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toContain(`remote model scale at ${server.url}`);
    expect(err.message).toContain("input x: expected FP32, got INT32");
    expect((await bridge.statistics()).inferenceStats?.fail?.count).toBe(1n);
  });

  it("forwards cancellation to the remote", async () => {
    let aborted = false;
    const server = await serve(scaleStage(scaleConfig(), { hold: true, onAbort: () => (aborted = true) }));
    const bridge = await createTrtBridge({ config: localConfig(), endpoint: server.url, modelName: "scale" });
    const ctl = new AbortController();
    const pending = bridge.infer({ inputs: [batch(1)] }, { signal: ctl.signal });
    await new Promise((r) => setTimeout(r, 100));
    ctl.abort();
    const err = await rejectionOf(pending, ConnectError);
    expect(err.code).toBe(Code.Canceled);
    await vi.waitFor(() => expect(aborted).toBe(true));
  });

  it("enforces the per-request deadline", async () => {
    const remote = scaleStage(scaleConfig(), { hold: true });
    const server = await serve(remote);
    cleanup.push(() => remote.release());
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint: server.url,
      modelName: "scale",
      timeoutMs: 300,
    });
    const err = await rejectionOf(bridge.infer({ inputs: [batch(1)] }), ConnectError);
    expect(err.code).toBe(Code.DeadlineExceeded);
    expect(err.message).toMatch(/no response within 300 ms/);
  });

  it("fails a request in flight with UNAVAILABLE when the server dies, never resends it, and recovers on restart", async () => {
    let server = await child("hold");
    const port = server.port;
    const endpoint = `http://127.0.0.1:${port}`;
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint,
      modelName: "scale",
      retries: { max: 5, baseDelayMs: 50 },
    });
    const failed = rejectionOf(bridge.infer({ inputs: [batch(2)] }), ConnectError);
    await server.receivedAtLeast(1);
    await server.kill();
    const err = await failed;
    expect(err.code).toBe(Code.Unavailable);
    expect(err.message).toContain(`remote model scale at ${endpoint}: connection lost with the request in flight`);
    expect(await bridge.isReady()).toBe(false);

    // Down: nothing can be sent, so the bridge retries and then says so.
    const down = await rejectionOf(bridge.infer({ inputs: [batch(1)] }), ConnectError);
    expect(down.code).toBe(Code.Unavailable);
    expect(down.message).toMatch(/unreachable after 6 attempt\(s\).*ECONNREFUSED/);

    // Back on the same port: the same bridge reconnects, and the request that
    // died with the old server was not replayed to the new one.
    server = await child("scale", port);
    const res = await bridge.infer({ inputs: [batch(2)] });
    expect(Array.from(res.outputs[0]?.data as Float32Array)).toEqual(
      Array.from(batch(2).data as Float32Array, (v) => v * 2),
    );
    // The child reports what it received over IPC, which may trail the gRPC answer.
    await server.receivedAtLeast(1);
    expect(server.received).toBe(1);
    expect(await bridge.isReady()).toBe(true);
  });

  it("retries a request refused at connect until the server is back", async () => {
    const port = await freePort();
    const first = await child("scale", port);
    const bridge = await createTrtBridge({
      config: localConfig(),
      endpoint: `http://127.0.0.1:${port}`,
      modelName: "scale",
      // 51 s of retries in all: a child process may take seconds to listen on a loaded machine.
      retries: { max: 10, baseDelayMs: 50 },
    });
    await first.kill();
    const restarted = child("scale", port);
    const res = await bridge.infer({ inputs: [batch(1)] });
    expect(res.outputs[0]?.shape).toEqual([1, 4]);
    expect((await restarted).received).toBe(1);
  });
});
