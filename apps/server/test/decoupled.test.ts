/**
 * Decoupled models (model_transaction_policy { decoupled: true }), black-box:
 * a TypeScript stage sending several responses per request, over
 * ModelStreamInfer with our Connect client and with grpc-js; Triton's
 * triton_enable_empty_final_response flags; a failure mid-request; the
 * one-answer endpoints refusing; statistics; an unload waiting for a request
 * still sending.
 */
import { fromJson, toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ModelInferRequestSchema, ModelStreamInferResponseSchema } from "@trellis/protocol";
import {
  grpcJsInferenceClient,
  pythonGrpcCalls,
  pythonGrpcRequired,
  removeDir,
  type ServerProcess,
  startServerProcess,
  streamAll,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  boolParam as bool,
  COUNTDOWN_CONFIG,
  countdownRequest as countdown,
  explicitModels,
  grpcClientOf,
  int64Param as int64,
  makeRepository,
  postJson,
  readStreamAnswer as read,
} from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({ countdown: { config: COUNTDOWN_CONFIG } });
  server = await startServerProcess(explicitModels(repo, "countdown"));
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

const client = () => grpcClientOf(server);

describe("a decoupled model over ModelStreamInfer", () => {
  it("sends each request's responses as the model sends them, and an empty final one when asked", async () => {
    async function* requests() {
      yield countdown("plain", 3);
      yield countdown("flagged", 2, { triton_enable_empty_final_response: bool(true) });
      yield countdown("none", 0, { triton_enable_empty_final_response: bool(true) });
    }
    const answers: string[] = [];
    for await (const a of client().modelStreamInfer(requests())) answers.push(read(a));
    // Requests run at once, so their answers interleave; each request's are in order.
    const of = (id: string) => answers.filter((a) => a.startsWith(`${id} `));
    expect(of("plain")).toEqual(["plain 3", "plain 2", "plain 1"]);
    expect(of("flagged")).toEqual(["flagged 2 final=false", "flagged 1 final=false", "flagged empty final=true"]);
    // A request the model answers with no response at all still gets its final flag.
    expect(of("none")).toEqual(["none empty final=true"]);
    expect(answers).toHaveLength(7);
  });

  it("answers a failure mid-request with its error after what was sent, and the stream goes on", async () => {
    async function* requests() {
      yield countdown("failing", 4, { fail_at: int64(2n), triton_enable_empty_final_response: bool(true) });
      yield countdown("after", 1);
    }
    const answers: string[] = [];
    for await (const a of client().modelStreamInfer(requests())) answers.push(read(a));
    expect(answers.filter((a) => a.startsWith("failing "))).toEqual([
      "failing 4 final=false",
      "failing 3 final=false",
      "failing error: countdown: asked to fail at 2 final=true",
    ]);
    expect(answers.filter((a) => a.startsWith("after "))).toEqual(["after 1"]);
  });

  it("streams to grpc-js, a foreign client, alike", async () => {
    const foreign = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const answers = await streamAll(foreign, [
        {
          model_name: "countdown",
          id: "js",
          inputs: [{ name: "IN", datatype: "INT32", shape: [1] }],
          raw_input_contents: [Buffer.from(Int32Array.of(2).buffer)],
          parameters: { triton_enable_empty_final_response: { bool_param: true } },
        },
      ]);
      expect(
        answers.map((a) => [
          a.error_message,
          a.infer_response.raw_output_contents[0]?.readInt32LE(0),
          (a.infer_response.parameters.triton_final_response as { bool_param: boolean }).bool_param,
        ]),
      ).toEqual([
        ["", 2, false],
        ["", 1, false],
        ["", undefined, true],
      ]);
    } finally {
      foreign.close();
    }
  });
});

describe.runIf(pythonGrpcRequired())("a decoupled model to a C-core client (grpcio, as tritonclient.grpc)", () => {
  it("reaches grpcio's stream response by response, the empty final one last", async () => {
    const [stream] = await pythonGrpcCalls(`127.0.0.1:${server.grpcPort}`, [
      {
        method: "ModelStreamInfer",
        requests: [
          toJson(ModelInferRequestSchema, countdown("py", 3, { triton_enable_empty_final_response: bool(true) })),
        ],
      },
    ]);
    expect(stream?.error).toBeUndefined();
    const answers = (stream?.responses ?? []).map((r) => read(fromJson(ModelStreamInferResponseSchema, r)));
    expect(answers).toEqual(["py 3 final=false", "py 2 final=false", "py 1 final=false", "py empty final=true"]);
  });
});

describe("the one-answer endpoints", () => {
  it("refuse a decoupled model: gRPC ModelInfer UNIMPLEMENTED, HTTP 501, saying where its responses go", async () => {
    const why =
      "countdown: the model is decoupled (model_transaction_policy): it sends its responses over the ModelStreamInfer stream, not one per call";
    const unary = await client()
      .modelInfer(countdown("unary", 2))
      .catch((e: unknown) => e);
    expect(unary).toBeInstanceOf(ConnectError);
    expect((unary as ConnectError).code).toBe(Code.Unimplemented);
    expect((unary as ConnectError).rawMessage).toBe(why);
    const http = await postJson(`${server.http}/v2/models/countdown/infer`, {
      inputs: [{ name: "IN", datatype: "INT32", shape: [1], data: [2] }],
    });
    expect(http.status).toBe(501);
    expect(http.json.error).toBe(why);
  });
});

describe("statistics and unload", () => {
  it("counts one success per request that sent all its responses, one failure per request that failed", async () => {
    const stats = async () =>
      (
        (await (await fetch(`${server.http}/v2/models/countdown/stats`)).json()) as {
          model_stats: { inference_stats: { success: { count: number }; fail: { count: number } } }[];
        }
      ).model_stats[0]!.inference_stats;
    const before = await stats();
    async function* requests() {
      yield countdown("a", 2);
      yield countdown("b", 3);
      yield countdown("c", 2, { fail_at: int64(1n) });
    }
    for await (const _ of client().modelStreamInfer(requests())) {
      // drained
    }
    const after = await stats();
    expect(after.success.count - before.success.count).toBe(2);
    expect(after.fail.count - before.fail.count).toBe(1);
  });

  it("lets a request still sending finish before the model unloads", async () => {
    // One timeline of what the client saw: the answers, and when the unload call returned.
    const events: string[] = [];
    const streaming = (async () => {
      async function* requests() {
        yield countdown("slow", 3, { delay_ms: int64(150n) });
      }
      for await (const a of client().modelStreamInfer(requests())) events.push(read(a));
    })();
    while (events.length === 0) await new Promise((r) => setTimeout(r, 20));
    const unloaded = postJson(`${server.http}/v2/repository/models/countdown/unload`, {}).then((res) => {
      events.push(`unloaded ${res.status}`);
    });
    await Promise.all([streaming, unloaded]);
    // The unload returns once the request sent its last response (which may reach this client a moment later).
    expect(events.filter((e) => e.startsWith("slow "))).toEqual(["slow 3", "slow 2", "slow 1"]);
    expect(events.indexOf("unloaded 200")).toBeGreaterThan(events.indexOf("slow 2"));
    // Unloaded: no version to ask, 404 as Triton (core TRITONSERVER_ServerModelIsReady fails in GetModel).
    expect((await fetch(`${server.http}/v2/models/countdown/ready`)).status).toBe(404);
    expect((await postJson(`${server.http}/v2/repository/models/countdown/load`, {})).status).toBe(200);
  });
});
