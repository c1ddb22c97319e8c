/**
 * The bridge against a server on C-core gRPC, the gRPC core Triton's own
 * server is built on: python/kserve_grpc.py (grpcio) standing in for Triton
 * hosting an FP16 TensorRT engine, with the ModelConfig Triton reports for one.
 * Not TensorRT itself: no Triton binary or GPU is available where tests run.
 */
import type { JsonObject } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, tensor } from "@trellis/stage";
import { type PythonKServeServer, pythonGrpcRequired, rejectionOf, startPythonKServe } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { bridgeDefinition, createTrtBridge } from "../src/index.js";

/** What Triton's ModelConfig says of a trtexec-built engine: platform tensorrt_plan, FP16 bindings. */
const engineConfig = (name: string): JsonObject => ({
  name,
  platform: "tensorrt_plan",
  backend: "tensorrt",
  maxBatchSize: 8,
  input: [{ name: "x", dataType: "TYPE_FP16", dims: ["4"] }],
  output: [{ name: "y", dataType: "TYPE_FP16", dims: ["4"] }],
});

/** The ensemble step's local config: FP32 tensors, as the rest of the pipeline has them. */
const localConfig = parseModelConfig(`
name: "engine_bridge"
backend: "typescript"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
`);

describe.runIf(pythonGrpcRequired())("bridge to a C-core gRPC server (grpcio standing in for Triton)", () => {
  let server: PythonKServeServer;
  beforeAll(async () => {
    server = await startPythonKServe([
      { config: engineConfig("engine_fp16"), compute: "double_fp16" },
      { config: engineConfig("engine_slow"), compute: "double_fp16", delayMs: 30_000 },
    ]);
  });
  afterAll(async () => {
    await server?.stop();
  });

  const bridgeTo = (modelName: string, extra: { timeoutMs?: number; allowFp16Conversion?: boolean } = {}) =>
    createTrtBridge({ config: localConfig, endpoint: server.url, modelName, allowFp16Conversion: true, ...extra });

  it("reads the engine's FP16 config at load and refuses it unless conversion is allowed", async () => {
    const err = await rejectionOf(bridgeTo("engine_fp16", { allowFp16Conversion: false }), ConnectError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toMatch(/input x: datatype expected FP32, got FP16 .*fp16_conversion/);
  });

  it("converts a batch to FP16 and back, the engine's answers exact", async () => {
    const bridge = await bridgeTo("engine_fp16");
    try {
      // Exact in FP16, ones that round (1/3, -1e-3), a subnormal (1e-7), two that overflow once
      // doubled; expected values from Python's own IEEE half rounding (struct "e").
      const x = Float32Array.from([0.5, -3.25, 1 / 3, 40000, 1, 2, 3, 4, -0, 65504, 1e-7, -1e-3]);
      const res = await bridge.infer({ id: "batch", inputs: [tensor("x", "FP32", [3, 4], x)] });
      const y = res.outputs[0];
      expect(y?.datatype).toBe("FP32");
      expect(y?.shape).toEqual([3, 4]);
      expect(Array.from(y?.data as Float32Array)).toEqual([
        1,
        -6.5,
        2 * 0.333251953125,
        Number.POSITIVE_INFINITY,
        2,
        4,
        6,
        8,
        -0,
        Number.POSITIVE_INFINITY,
        2 * 1.1920928955078125e-7,
        -0.0020008087158203125,
      ]);
    } finally {
      await bridge.close();
    }
  });

  it("keeps the engine server's error code and message, and says the remote raised it", async () => {
    // What the bridge computes, without the local checks createTrtBridge puts in front: the engine refuses.
    const bridge = defineStage(
      await bridgeDefinition({
        config: localConfig,
        endpoint: server.url,
        modelName: "engine_fp16",
        allowFp16Conversion: true,
      }),
    );
    try {
      const err = await rejectionOf(
        bridge.infer({ inputs: [tensor("x", "INT32", [1, 4], Int32Array.from([1, 2, 3, 4]))] }),
        ConnectError,
      );
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.message).toContain(`remote model engine_fp16 at ${server.url}`);
      expect(err.message).toContain("input 'x': expected datatype FP16, got INT32");
    } finally {
      await bridge.close();
    }
  });

  it("ends a call at its deadline and cancels it on the engine server", async () => {
    const bridge = await bridgeTo("engine_slow", { timeoutMs: 300 });
    try {
      const started = Date.now();
      const err = await rejectionOf(
        bridge.infer({ id: "late", inputs: [tensor("x", "FP32", [1, 4], new Float32Array(4))] }),
        ConnectError,
      );
      expect(err.code).toBe(Code.DeadlineExceeded);
      // The engine would answer after 30 s: the deadline, not the answer, ended the call.
      expect(Date.now() - started).toBeLessThan(15_000);
      await vi.waitFor(() => expect(server.cancelled).toContain("late"), { timeout: 15_000 });
    } finally {
      await bridge.close();
    }
  });
});
