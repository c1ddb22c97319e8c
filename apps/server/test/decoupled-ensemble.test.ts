/**
 * An ensemble with a decoupled step, black-box: countdown (N, N-1, ..., 1) then
 * a step multiplying each by ten. The ensemble is decoupled in turn (its config
 * says so, as Triton's does): each countdown response runs the step after it and
 * goes out as one ensemble response, over gRPC ModelStreamInfer and HTTP
 * generate_stream; one-answer endpoints refuse it.
 */
import { grpcJsInferenceClient, removeDir, type ServerProcess, startServerProcess, streamAll } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { countingModels, jsonOf, makeRepository, postJson } from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    ...countingModels(),
  });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

describe("an ensemble with a decoupled step", () => {
  it("streams one response per response of its decoupled step over ModelStreamInfer, then the empty final one", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const answers = await streamAll(client, [
        {
          model_name: "counting",
          id: "e",
          inputs: [{ name: "N", datatype: "INT32", shape: [1] }],
          raw_input_contents: [Buffer.from(Int32Array.of(3).buffer)],
          parameters: { triton_enable_empty_final_response: { bool_param: true } },
        },
      ]);
      expect(
        answers.map((a) => [
          a.error_message,
          a.infer_response.id,
          a.infer_response.raw_output_contents[0]?.readInt32LE(0),
          (a.infer_response.parameters.triton_final_response as { bool_param: boolean }).bool_param,
        ]),
      ).toEqual([
        ["", "e", 30, false],
        ["", "e", 20, false],
        ["", "e", 10, false],
        ["", "e", undefined, true],
      ]);
    } finally {
      client.close();
    }
  });

  it("streams over HTTP generate_stream, says it is decoupled in its config, and refuses infer (501)", async () => {
    const res = await fetch(`${server.http}/v2/models/counting/generate_stream`, {
      method: "POST",
      body: JSON.stringify({ N: 2 }),
    });
    const events = (await res.text())
      .split("\n\n")
      .filter(Boolean)
      .map((e) => JSON.parse(e.slice("data: ".length)));
    expect(events.map((e) => e.TENS)).toEqual([20, 10]);
    const config = await jsonOf(await fetch(`${server.http}/v2/models/counting/config`));
    expect(config.model_transaction_policy).toEqual({ decoupled: true });
    const once = await postJson(`${server.http}/v2/models/counting/infer`, {
      inputs: [{ name: "N", datatype: "INT32", shape: [1], data: [2] }],
    });
    expect(once.status).toBe(501);
    // The steps count their own requests: countdown once per ensemble request, the tenfold step once per response.
    const stats = async (model: string) =>
      (await jsonOf(await fetch(`${server.http}/v2/models/${model}/stats`))).model_stats[0].inference_count;
    expect([await stats("countdown"), await stats("tenfold_int")]).toEqual([2, 5]);
  });
});
