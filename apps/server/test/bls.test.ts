/**
 * Business logic scripting in TypeScript, black-box: model.js stages that call
 * other models of the server as they run (Triton's `pb_utils.InferenceRequest`
 * in a Python model), through the `models` their factory is given: a router
 * picking a model per request, and a collector reading a decoupled model's
 * responses; the called models count the calls in their own statistics.
 */
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { COUNTDOWN_CONFIG, echoConfig, jsonOf, makeRepository, postJson } from "./helpers.js";

// The repository is a temporary folder without node_modules: @trellis/stage by its resolved URL.
const STAGE = import.meta.resolve("@trellis/stage");

/** OUTPUT = doubler(INPUT) when INPUT[0] ≥ 0, else tripler(INPUT); parameter "target" names another model. */
const ROUTER = `import { defineStage } from "${STAGE}";
export const createStage = ({ config, version, models }) => defineStage({ config, version, async compute(request, options) {
  const input = request.inputs.find((t) => t.name === "INPUT");
  const target = request.parameters?.target ?? (input.data[0] >= 0 ? "doubler" : "tripler");
  const answer = await models.infer(target, { inputs: [input] }, options);
  return [{ ...answer.outputs[0], name: "OUTPUT" }];
} });
`;

/** OUT = the sum of countdown's responses to IN (N + ... + 1), read as they come. */
const COLLECTOR = `import { defineStage } from "${STAGE}";
export const createStage = ({ config, version, models }) => defineStage({ config, version, async compute(request, options) {
  let sum = 0;
  for await (const r of models.inferStream("countdown", { inputs: [{ ...request.inputs[0], name: "IN" }] }, options)) sum += r.outputs[0].data[0];
  return [{ name: "OUT", datatype: "INT32", shape: [1], data: Int32Array.of(sum) }];
} });
`;

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    doubler: { config: echoConfig("doubler", { params: { scale: "2" } }) },
    tripler: { config: echoConfig("tripler", { params: { scale: "3" } }) },
    router: {
      config: echoConfig("router").replace(/parameters \{ key: "module"[^\n]*\n/, ""),
      files: { "1/model.js": ROUTER },
    },
    countdown: { config: COUNTDOWN_CONFIG },
    collector: {
      config: COUNTDOWN_CONFIG.replace(`name: "countdown"`, `name: "collector"`)
        .replace("model_transaction_policy { decoupled: true }", "")
        .replace(/parameters \{ key: "module"[^\n]*\n/, ""),
      files: { "1/model.js": COLLECTOR },
    },
  });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

const infer = (model: string, data: number[], parameters?: Record<string, unknown>, datatype = "FP32") =>
  postJson(`${server.http}/v2/models/${model}/infer`, {
    inputs: [
      { name: model === "collector" ? "IN" : "INPUT", datatype, shape: model === "collector" ? [1] : [1, 4], data },
    ],
    ...(parameters ? { parameters } : {}),
  });
const inferenceCount = async (model: string) =>
  (await jsonOf(await fetch(`${server.http}/v2/models/${model}/stats`))).model_stats[0].inference_count;

describe("models calling models (BLS)", () => {
  it("routes each request to the model its stage picks; the called models count the calls", async () => {
    const before = [await inferenceCount("doubler"), await inferenceCount("tripler")];
    const up = await infer("router", [1, 2, 3, 4]);
    const down = await infer("router", [-1, 2, 3, 4]);
    expect([up.status, up.json.outputs[0].data]).toEqual([200, [2, 4, 6, 8]]);
    expect([down.status, down.json.outputs[0].data]).toEqual([200, [-3, 6, 9, 12]]);
    expect(up.json.model_name).toBe("router");
    expect([await inferenceCount("doubler"), await inferenceCount("tripler")]).toEqual([before[0] + 1, before[1] + 1]);
  });

  it("reads a decoupled model's responses as they come", async () => {
    const res = await infer("collector", [4], undefined, "INT32");
    expect([res.status, res.json.outputs[0].data]).toEqual([200, [10]]);
  });

  it("fails the request with the called model's error when it cannot run", async () => {
    const absent = await infer("router", [1, 2, 3, 4], { target: "absent" });
    expect(absent.json.error).toContain("Request for unknown model: 'absent' is not found");
    // The called model's own refusal comes back as it is: countdown answers over a stream only.
    const decoupled = await infer("router", [1, 2, 3, 4], { target: "countdown" });
    expect(decoupled.json.error).toContain("the model is decoupled");
    expect((await infer("router", [5, 5, 5, 5])).json.outputs[0].data).toEqual([10, 10, 10, 10]);
  });
});
