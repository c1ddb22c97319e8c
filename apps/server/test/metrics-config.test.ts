/**
 * Triton's --metrics-config, black-box: latency summaries (quantiles per model)
 * in place of the cumulative latency counters; the first-response histogram of
 * decoupled models.
 */
import { create } from "@bufbuild/protobuf";
import { InferParameterSchema, ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CHAIN_CONFIG,
  COUNTDOWN_CONFIG,
  echoConfig,
  explicitModels,
  grpcClientOf,
  makeRepository,
  metricValue,
  postJson,
  scrape,
} from "./helpers.js";

/** The quantile labels a summary reports for a model. */
const quantilesOf = (text: string, name: string, model: string) =>
  text
    .split("\n")
    .filter((l) => l.startsWith(`${name}{`) && l.includes(`model="${model}"`))
    .map((l) => /quantile="([^"]+)"/.exec(l)?.[1]);

describe("--metrics-config summary_latencies=true, counter_latencies=false, two quantiles", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
      chain: { config: CHAIN_CONFIG },
    });
    server = await startServerProcess([
      ...explicitModels(repo),
      "--load-model",
      "*",
      "--metrics-config",
      "summary_latencies=true",
      "--metrics-config",
      "counter_latencies=false",
      "--metrics-config",
      "summary_quantiles=0.5:0.05,0.99:0.001",
    ]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  it("gives each model's latency quantiles, hearing every request once, an ensemble's steps included", async () => {
    const infer = (model: string) =>
      postJson(`${server.http}/v2/models/${model}/infer`, {
        inputs: [{ name: model === "chain" ? "IN" : "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      });
    for (let i = 0; i < 5; i++) expect((await infer("echo")).status).toBe(200);
    for (let i = 0; i < 3; i++) expect((await infer("chain")).status).toBe(200);

    const text = await scrape(server);
    const count = (model: string) => metricValue(text, "nv_inference_request_summary_us_count", model);
    // echo: 5 of its own and 3 as the chain's first step; the ensemble's per-step copies are not heard again.
    expect([count("echo"), count("echo10"), count("chain")]).toEqual([8, 3, 3]);
    expect(count("echo")).toBe(metricValue(text, "nv_inference_request_success", "echo"));
    expect(metricValue(text, "nv_inference_request_summary_us_sum", "chain")).toBeGreaterThan(0);
    for (const name of ["request", "queue", "compute_input", "compute_infer", "compute_output"]) {
      expect(quantilesOf(text, `nv_inference_${name}_summary_us`, "echo"), name).toEqual(["0.5", "0.99"]);
    }
    expect(text).not.toContain("nv_inference_request_duration_us");
    expect(text).toContain("nv_inference_request_success{"); // the other counters stay
  });

  it("drops an unloaded model's summaries", async () => {
    expect((await postJson(`${server.http}/v2/repository/models/chain/unload`, {})).status).toBe(200);
    const text = await scrape(server);
    expect(quantilesOf(text, "nv_inference_request_summary_us", "chain")).toEqual([]);
    expect(quantilesOf(text, "nv_inference_request_summary_us", "echo")).toEqual(["0.5", "0.99"]);
  });
});

it("refuses to start with a --metrics-config it cannot use, naming it", async () => {
  const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  try {
    const bad = await startupRefusal([
      "--model-repository",
      repo,
      "--metrics-config",
      "summary_quantiles=0.5:0.05,1.5:0.01",
    ]);
    expect(String(bad)).toContain(
      'trellis-server: --metrics-config summary_quantiles=0.5:0.05,1.5:0.01: expected <quantile>:<error>,... with each between 0 and 1, got "1.5:0.01"',
    );
  } finally {
    await removeDir(repo);
  }
});

describe("--metrics-config histogram_latencies=true", () => {
  let repo: string;
  let server: ServerProcess;
  /** The countdown model again, its histogram's buckets set in its config (model_metrics). */
  const tunedConfig = `${COUNTDOWN_CONFIG.replace('name: "countdown"', 'name: "tuned"')}
model_metrics { metric_control: [ { metric_identifier: { family: "nv_inference_first_response_histogram_ms" } histogram_options: { buckets: [ 10, 60000 ] } } ] }
`;
  beforeAll(async () => {
    repo = await makeRepository({
      countdown: { config: COUNTDOWN_CONFIG },
      tuned: { config: tunedConfig },
      echo: { config: echoConfig("echo") },
    });
    server = await startServerProcess(["--model-repository", repo, "--metrics-config", "histogram_latencies=true"]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  /** Each line of the histogram for `model`: "<suffix>{le}" -> value. */
  const histogram = (text: string, model: string) =>
    Object.fromEntries(
      text
        .split("\n")
        .filter((l) => l.startsWith("nv_inference_first_response_histogram_ms_") && l.includes(`model="${model}"`))
        .map((l) => {
          const suffix = /^nv_inference_first_response_histogram_ms_(\w+)/.exec(l)?.[1];
          const le = /le="([^"]+)"/.exec(l)?.[1];
          return [le ? `${suffix}{${le}}` : suffix, Number(l.split(" ").at(-1))];
        }),
    );

  it("times each decoupled request to its first response, in Triton's buckets or the model's own", async () => {
    const client = grpcClientOf(server);
    const request = (model: string, delay: bigint) =>
      create(ModelInferRequestSchema, {
        modelName: model,
        inputs: [{ name: "IN", datatype: "INT32", shape: [1n] }],
        rawInputContents: [new Uint8Array(Int32Array.of(2).buffer)],
        parameters: {
          delay_ms: create(InferParameterSchema, { parameterChoice: { case: "int64Param", value: delay } }),
        },
      });
    async function* requests() {
      // The first response comes after delay_ms: 30 ms each for countdown, 20 ms for tuned.
      for (let i = 0; i < 3; i++) yield request("countdown", 30n);
      yield request("tuned", 20n);
    }
    for await (const _ of client.modelStreamInfer(requests())) {
      // drained
    }
    expect(
      (
        await postJson(`${server.http}/v2/models/echo/infer`, {
          inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
        })
      ).status,
    ).toBe(200);
    const text = await scrape(server);
    const countdown = histogram(text, "countdown");
    // Triton's buckets, cumulative; 30 ms to the first response (timers may fire a shade early).
    expect(Object.keys(countdown).sort()).toEqual(
      ["bucket{+Inf}", "bucket{100}", "bucket{2000}", "bucket{5000}", "bucket{500}", "count", "sum"].sort(),
    );
    expect(countdown).toMatchObject({
      "bucket{500}": 3,
      "bucket{2000}": 3,
      "bucket{5000}": 3,
      "bucket{+Inf}": 3,
      count: 3,
    });
    expect(countdown["bucket{100}"]).toBeLessThanOrEqual(3);
    expect(countdown.sum).toBeGreaterThanOrEqual(3 * 25);
    expect(countdown.sum).toBeLessThan(3 * 500);
    // The model's own buckets: 20 ms is over 10.
    expect(histogram(text, "tuned")).toMatchObject({
      "bucket{10}": 0,
      "bucket{60000}": 1,
      "bucket{+Inf}": 1,
      count: 1,
    });
    // A model that answers once has no first-response histogram, as in Triton.
    expect(histogram(text, "echo")).toEqual({});
  });

  it("is off by default", async () => {
    const plain = await startServerProcess(["--model-repository", repo]);
    try {
      expect(await scrape(plain)).not.toContain("nv_inference_first_response_histogram_ms");
    } finally {
      expect(await plain.stop()).toBe(0);
    }
  });
});
