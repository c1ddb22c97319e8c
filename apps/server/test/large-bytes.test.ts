/**
 * Triton's large-BYTES check (its gRPC tests send one BYTES tensor of 10,485,760
 * elements, ~50 MiB, through an identity model): two, then four such requests at
 * once over gRPC to an ONNX identity model. Each is answered with its own bytes
 * or refused with RESOURCE_EXHAUSTED; the server stays up, its peak memory well
 * below where V8 gave up before (BYTES elements were one object each), and it
 * answers a small request afterwards.
 */
import { readFileSync } from "node:fs";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService } from "@trellis/protocol";
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRepository } from "./helpers.js";

const ELEMENTS = 10_485_760;
const CONFIG = `name: "ident_bytes"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "IN_out" data_type: TYPE_STRING dims: [ -1 ] } ]
`;

/** `count` one-letter elements in KServe's BYTES framing. */
function framed(count: number): Buffer {
  const raw = Buffer.alloc(count * 5);
  for (let i = 0; i < count; i++) {
    raw.writeUInt32LE(1, i * 5);
    raw[i * 5 + 4] = 97 + (i % 26);
  }
  return raw;
}

const request = (raw: Uint8Array, count: number) => ({
  modelName: "ident_bytes",
  inputs: [{ name: "IN", datatype: "BYTES", shape: [BigInt(count)] }],
  rawInputContents: [raw],
});

/** The server's peak resident memory so far (VmHWM), in MiB. */
const peakRssMiB = (server: ServerProcess) =>
  Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${server.proc.pid}/status`, "utf8"))?.[1]) / 1024;

let repo: string;
let server: ServerProcess;
let client: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
const big = framed(ELEMENTS);

beforeAll(async () => {
  repo = await makeRepository({
    ident_bytes: {
      config: CONFIG,
      files: { "1/model.onnx": identityModel([{ name: "IN", type: "string", shape: ["N"] }]) },
    },
  });
  server = await startServerProcess(["--model-repository", repo]);
  client = createClient(
    GRPCInferenceService,
    createGrpcTransport({ baseUrl: server.grpc, readMaxBytes: 2 ** 30, writeMaxBytes: 2 ** 30 }),
  );
});

afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

/** n large requests at once: how many came back right, how many were refused with RESOURCE_EXHAUSTED. */
async function concurrently(n: number): Promise<{ right: number; exhausted: number }> {
  const outcomes = await Promise.all(
    Array.from({ length: n }, () =>
      client.modelInfer(request(big, ELEMENTS), { timeoutMs: 300_000 }).then(
        (r) =>
          r.outputs[0]?.shape[0] === BigInt(ELEMENTS) && Buffer.compare(r.rawOutputContents[0]!, big) === 0
            ? "right"
            : "wrong",
        (err) => (ConnectError.from(err).code === Code.ResourceExhausted ? "exhausted" : `failed: ${String(err)}`),
      ),
    ),
  );
  const wrong = outcomes.filter((o) => o !== "right" && o !== "exhausted");
  expect(wrong).toEqual([]);
  return {
    right: outcomes.filter((o) => o === "right").length,
    exhausted: outcomes.filter((o) => o === "exhausted").length,
  };
}

describe("10,485,760-element BYTES requests over gRPC", () => {
  it("two, then four at once: each answered right or RESOURCE_EXHAUSTED; the server lives on", {
    timeout: 300_000,
  }, async () => {
    for (const n of [2, 4]) {
      const { right, exhausted } = await concurrently(n);
      console.log(
        `${n} at once: ${right} answered, ${exhausted} RESOURCE_EXHAUSTED; server VmHWM ${peakRssMiB(server).toFixed(0)} MiB`,
      );
      expect(right + exhausted).toBe(n);
      expect(right).toBeGreaterThanOrEqual(1);
      expect(server.proc.exitCode).toBeNull();
    }
    // Well below the ~4 GB heap at which two of these killed the server.
    expect(peakRssMiB(server)).toBeLessThan(3 * 1024);
    const small = framed(3);
    const r = await client.modelInfer(request(small, 3));
    expect(Buffer.compare(r.rawOutputContents[0]!, small)).toBe(0);
  });
});
