/**
 * Triton's response cache, black-box: --cache-config local,size=N on the
 * server and response_cache { enable: true } in a model's config.
 */
import { create } from "@bufbuild/protobuf";
import { ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CHAIN_CONFIG,
  echoConfig,
  explicitModels,
  floats,
  grpcClientOf,
  makeRepository,
  metricValue,
  postJson,
  scrape,
} from "./helpers.js";

const CACHED = "response_cache { enable: true }";

const infer = (server: ServerProcess, model: string, values: number[], input = "INPUT") =>
  postJson(`${server.http}/v2/models/${model}/infer`, {
    inputs: [{ name: input, datatype: "FP32", shape: [1, 4], data: values }],
  });

interface Stats {
  execution_count: number;
  inference_stats: { success: { count: number }; cache_hit?: { count: number }; cache_miss?: { count: number } };
}
const stats = async (server: ServerProcess, model: string): Promise<Stats> =>
  ((await (await fetch(`${server.http}/v2/models/${model}/stats`)).json()) as { model_stats: Stats[] })
    .model_stats[0] as Stats;

let repo: string;
beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    cached: { config: echoConfig("cached", { extra: CACHED }) },
    uncached: { config: echoConfig("uncached") },
    chain_cached: { config: `${CHAIN_CONFIG.replace('name: "chain"', 'name: "chain_cached"')}\n${CACHED}` },
  });
});
afterAll(() => removeDir(repo));

describe("with --cache-config local,size=1048576", () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess([
      "--model-repository",
      repo,
      "--cache-config",
      "local,size=1048576",
      // A reload below changes a stage parameter, which only an operator who opted in allows.
      "--allow-unsafe-load-overrides",
      "--model-control-mode",
      "explicit",
      "--load-model",
      "*",
    ]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
  });

  it("answers a repeated request from the cache, over either protocol, without running the model again", async () => {
    const first = await infer(server, "cached", [1, 2, 3, 4]);
    const again = await infer(server, "cached", [1, 2, 3, 4]);
    expect(again).toEqual(first);
    const client = grpcClientOf(server);
    const viaGrpc = await client.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: "cached",
        id: "g",
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
        rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
      }),
    );
    expect(viaGrpc.id).toBe("g");
    expect([...floats(viaGrpc.rawOutputContents[0] as Uint8Array)]).toEqual([1, 2, 3, 4]);
    await infer(server, "cached", [5, 6, 7, 8]); // other data: a miss

    // As Triton counts: every answer a success, hits never executed.
    const s = await stats(server, "cached");
    expect(s.execution_count).toBe(2);
    expect(s.inference_stats.success.count).toBe(4);
    expect(s.inference_stats.cache_hit?.count).toBe(2);
    expect(s.inference_stats.cache_miss?.count).toBe(2);
    const metrics = await scrape(server);
    expect(metricValue(metrics, "nv_cache_num_hits_per_model", "cached")).toBe(2);
    expect(metricValue(metrics, "nv_cache_num_misses_per_model", "cached")).toBe(2);
    expect(metricValue(metrics, "nv_inference_request_success", "cached")).toBe(4);

    // A model whose config does not enable the cache runs every request.
    await infer(server, "uncached", [1, 2, 3, 4]);
    await infer(server, "uncached", [1, 2, 3, 4]);
    expect((await stats(server, "uncached")).execution_count).toBe(2);
    expect(metricValue(await scrape(server), "nv_cache_num_hits_per_model", "uncached")).toBe(0);
  });

  it("caches an ensemble's whole answer: a repeat runs none of its steps", async () => {
    const before = [(await stats(server, "echo")).execution_count, (await stats(server, "echo10")).execution_count];
    const first = await infer(server, "chain_cached", [1, 2, 3, 4], "IN");
    expect(first.json.outputs[0].data).toEqual([10, 20, 30, 40]);
    expect(await infer(server, "chain_cached", [1, 2, 3, 4], "IN")).toEqual(first);
    const after = [(await stats(server, "echo")).execution_count, (await stats(server, "echo10")).execution_count];
    expect(after).toEqual(before.map((n) => n + 1));
  });

  it("never answers from a previous load of the model", async () => {
    const config = (await (await fetch(`${server.http}/v2/models/cached/config`)).json()) as {
      parameters: Record<string, unknown>;
    };
    const tripled = JSON.stringify({ ...config, parameters: { ...config.parameters, scale: { string_value: "3" } } });
    expect((await infer(server, "cached", [1, 1, 1, 1])).json.outputs[0].data).toEqual([1, 1, 1, 1]);
    const load = await postJson(`${server.http}/v2/repository/models/cached/load`, { parameters: { config: tripled } });
    expect(load.status).toBe(200);
    expect((await infer(server, "cached", [1, 1, 1, 1])).json.outputs[0].data).toEqual([3, 3, 3, 3]);
  });
});

describe("without a server cache", () => {
  it("serves a model whose config enables the cache uncached, and says so at load", async () => {
    const server = await startServerProcess(explicitModels(repo, "cached"));
    try {
      expect(
        server.logs.some(
          (l) =>
            l.model === "cached" &&
            String(l.msg).startsWith(
              "response_cache is enabled in the model config, but the server has no response cache",
            ),
        ),
      ).toBe(true);
      await infer(server, "cached", [1, 2, 3, 4]);
      await infer(server, "cached", [1, 2, 3, 4]);
      expect((await stats(server, "cached")).execution_count).toBe(2);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("refuses a --cache-config it cannot use, saying what it expects", async () => {
    const memcached = await startupRefusal(["--model-repository", repo, "--cache-config", "memcached,host=localhost"]);
    expect(String(memcached)).toContain(
      '--cache-config memcached,host=localhost: the caches are local ("local,size=<bytes>") and redis',
    );
    const noSize = await startupRefusal(["--model-repository", repo, "--cache-config", "local,size=lots"]);
    expect(String(noSize)).toContain("--cache-config local,size=lots: expected local,size=<bytes>");
  });
});
