/**
 * The repository manager in-process, with the production loader: what the
 * black-box tests cannot see from outside the server process.
 */
import http from "node:http";
import { gzipSync } from "node:zlib";
import { ConnectError, createClient } from "@connectrpc/connect";
import { httpStatus, listenStage } from "@trellis/frontends";
import { grpcTransport } from "@trellis/kserve";
import { ManagedStage, modelLoader, RepositoryManager } from "@trellis/model-repository";
import { GRPCInferenceService, parseModelConfig } from "@trellis/protocol";
import { Code, type Stage, tensor } from "@trellis/stage";
import { removeDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createMetrics } from "../src/observability/metrics.js";
import { type ServerOptions, startServer } from "../src/server.js";
import { createStage as createEchoStage } from "./fixtures/echo-stage.js";
import { CHAIN_CONFIG, echoConfig, makeRepository } from "./helpers.js";

const quiet = { info() {}, warn() {}, error() {}, debug() {} };

/** The test repository (mode none) behind a server on ephemeral ports, with `limits`. */
async function serveRepository(limits: Pick<ServerOptions, "httpMaxInputBytes" | "grpcMaxInputBytes">) {
  const manager = new RepositoryManager({ repositories: [repo], loader: modelLoader(), logger: quiet });
  await manager.start();
  return startServer(manager, { httpPort: 0, grpcPort: 0, metricsPort: 0, logger: quiet, ...limits });
}

let repo: string;
beforeAll(async () => {
  repo = await makeRepository({
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    chain: { config: CHAIN_CONFIG },
  });
});
afterAll(() => removeDir(repo));

describe("remote ensemble steps", () => {
  it("share one connection across ensemble reloads", async () => {
    // "echo" lives in another server only; the chain reaches it through the endpoint map.
    const echo = await createEchoStage({ config: parseModelConfig(echoConfig("echo")), version: "1" });
    const remote = await listenStage(echo);
    const loader = modelLoader();
    let connects = 0;
    const manager = new RepositoryManager({
      repositories: [repo],
      loader: {
        ...loader,
        connectRemote: (name, url, version) => {
          connects += 1;
          return loader.connectRemote(name, url, version);
        },
      },
      mode: "explicit",
      endpoints: { echo: remote.url },
      logger: quiet,
    });
    try {
      await manager.start();
      const run = async () => {
        const res = await manager.resolve("chain").infer({
          inputs: [tensor("IN", "FP32", [1, 4], Float32Array.from([1, 2, 3, 4]))],
        });
        return Array.from(res.outputs[0]?.data as Float32Array);
      };
      await manager.load("chain");
      expect(await run()).toEqual([10, 20, 30, 40]);
      await manager.unload("chain");
      await manager.load("chain");
      expect(await run()).toEqual([10, 20, 30, 40]);
      expect(connects).toBe(1);
    } finally {
      await manager.close();
      await remote.close();
    }
  });
});

describe("HTTP inference", () => {
  it("holds the model it found when the request came: an unload during the upload waits, and that version answers", async () => {
    const manager = new RepositoryManager({
      repositories: [repo],
      loader: modelLoader(),
      mode: "explicit",
      loadModels: ["echo10"],
      logger: quiet,
    });
    await manager.start();
    const server = await startServer(manager, { httpPort: 0, grpcPort: 0, metricsPort: 0, logger: quiet });
    try {
      const body = JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] });
      const order: string[] = [];
      const answer = new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = http.request(
          {
            host: "127.0.0.1",
            port: server.httpPort,
            method: "POST",
            path: "/v2/models/echo10/infer",
            headers: { "content-length": Buffer.byteLength(body) },
          },
          (res) => {
            let text = "";
            res.on("data", (d) => {
              text += String(d);
            });
            res.on("end", () => {
              order.push("answered");
              resolve({ status: res.statusCode ?? 0, text });
            });
          },
        );
        req.on("error", reject);
        req.write(body.slice(0, 10));
        // The server has the request (and holds its model) before the rest of the body comes.
        setTimeout(() => {
          const unloading = manager.unload("echo10").then(() => order.push("unloaded"));
          // The unload waits for the held request while its body is incomplete (new requests are
          // refused meanwhile, as Triton's are during an unload).
          setTimeout(() => {
            order.push(order.includes("unloaded") ? "unloaded early" : "unload waiting");
            req.end(body.slice(10));
            unloading.catch(reject);
          }, 300);
        }, 200);
      });
      const { status, text } = await answer;
      expect(status, text).toBe(200);
      expect(JSON.parse(text).outputs[0].data).toEqual([10, 20, 30, 40]);
      // Unloaded once the request that held it was answered; now refused by name.
      await vi.waitFor(() => expect(order).toContain("unloaded"));
      expect(order.slice(0, 1)).toEqual(["unload waiting"]);
      expect(() => manager.resolve("echo10")).toThrow(/echo10/);
    } finally {
      await server.shutdown(5000);
    }
  });

  it("refuses a body over --http-max-input-size with 400 naming the limit", async () => {
    const server = await serveRepository({ httpMaxInputBytes: 200 });
    try {
      const post = (id: string) =>
        fetch(`http://127.0.0.1:${server.httpPort}/v2/models/echo10/infer`, {
          method: "POST",
          body: JSON.stringify({
            id,
            inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
          }),
        });
      expect((await post("small")).status).toBe(200);
      const big = await post("x".repeat(200));
      expect(big.status).toBe(400);
      expect(((await big.json()) as { error: string }).error).toMatch(
        /^request JSON size of \d+ bytes exceeds the maximum allowed input size of 200 bytes. Use --http-max-input-size/,
      );
    } finally {
      await server.shutdown(5000);
    }
  });

  it("refuses a compressed body that inflates past --http-max-input-size", async () => {
    const server = await serveRepository({ httpMaxInputBytes: 300 });
    try {
      const body = (id: string) =>
        gzipSync(
          JSON.stringify({ id, inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
        );
      const post = (id: string) =>
        fetch(`http://127.0.0.1:${server.httpPort}/v2/models/echo10/infer`, {
          method: "POST",
          body: body(id),
          headers: { "content-encoding": "gzip" },
        });
      expect((await post("small")).status).toBe(200);
      // Under 300 bytes on the wire, 10 kB once inflated.
      expect(body("x".repeat(10_000)).byteLength).toBeLessThan(300);
      const bomb = await post("x".repeat(10_000));
      expect(bomb.status).toBe(400);
      expect(((await bomb.json()) as { error: string }).error).toBe(
        "Decompressed data size exceeds the maximum allowed value of 300 bytes. Use --http-max-input-size to increase the limit.",
      );
      expect((await post("after")).status).toBe(200);
    } finally {
      await server.shutdown(5000);
    }
  });

  it("refuses a gRPC message over --grpc-max-input-size with RESOURCE_EXHAUSTED, and serves the next one", async () => {
    const server = await serveRepository({ grpcMaxInputBytes: 300 });
    const transport = grpcTransport(`http://127.0.0.1:${server.grpcPort}`);
    try {
      const client = createClient(GRPCInferenceService, transport);
      const infer = (id: string) =>
        client.modelInfer({
          modelName: "echo10",
          id,
          inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
          rawInputContents: [new Uint8Array(new Float32Array([1, 2, 3, 4]).buffer)],
        });
      const big = await infer("x".repeat(300)).catch((e: unknown) => ConnectError.from(e));
      expect(big).toBeInstanceOf(ConnectError);
      expect((big as ConnectError).code).toBe(Code.ResourceExhausted);
      expect((big as ConnectError).rawMessage).toMatch(
        /^request message of \d+ bytes exceeds the maximum allowed value of 300 bytes; use --grpc-max-input-size to increase the limit$/,
      );
      const ok = await infer("small");
      expect(new Float32Array(ok.rawOutputContents[0]!.slice().buffer)).toEqual(new Float32Array([10, 20, 30, 40]));
    } finally {
      transport.close();
      await server.shutdown(5000);
    }
  });

  it("answers a full queue (RESOURCE_EXHAUSTED) with 503, as Triton does for its UNAVAILABLE queue-full error", () => {
    expect(httpStatus(Code.ResourceExhausted)).toBe(503);
    expect(httpStatus(Code.InvalidArgument)).toBe(400);
  });
});

describe("metrics", () => {
  it("still answers when one model's statistics cannot be read, leaving only that model out", async () => {
    const echo = await createEchoStage({ config: parseModelConfig(echoConfig("echo")), version: "1" });
    const down: Stage = {
      ...echo,
      name: "remote_down",
      version: "1",
      config: echo.config,
      statistics: async () => {
        throw new Error("remote model remote_down: connection refused");
      },
    };
    const warnings: object[] = [];
    const metrics = createMetrics(
      { list: () => [new ManagedStage(echo), new ManagedStage(down)] },
      { warn: (obj) => warnings.push(obj) },
    );
    await echo.infer({ inputs: [tensor("INPUT", "FP32", [1, 4], Float32Array.from([1, 2, 3, 4]))] });
    const text = await metrics.scrape();
    expect(text).toContain('nv_inference_request_success{model="echo",version="1"} 1');
    expect(text).not.toContain('model="remote_down"');
    expect(warnings).toEqual([
      { model: "remote_down", version: "1", err: "Error: remote model remote_down: connection refused" },
    ]);
  });
});
