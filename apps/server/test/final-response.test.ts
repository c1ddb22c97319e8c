/**
 * Triton's triton_enable_empty_final_response, black-box over gRPC: a
 * ModelStreamInfer request that sets it gets its answer flagged
 * triton_final_response (what tritonclient's async_stream_infer and
 * streaming clients wait for), and the model never sees the parameter.
 */
import { create } from "@bufbuild/protobuf";
import { frameBytes } from "@trellis/kserve/wire";
import { InferParameterSchema, type ModelInferRequest, ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { echoConfig, grpcClientOf, makeRepository } from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    // Answers with the request parameters it was given, as JSON.
    reflect: {
      config: echoConfig("reflect", { datatype: "TYPE_STRING", dims: [1], params: { reflect_parameters: "1" } }),
    },
  });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

/** One BYTES element on the wire: its length, then its bytes. */
const element = (text: string) => frameBytes([new TextEncoder().encode(text)]);

function reflectRequest(id: string, final?: ReturnType<typeof create<typeof InferParameterSchema>>): ModelInferRequest {
  return create(ModelInferRequestSchema, {
    modelName: "reflect",
    id,
    inputs: [{ name: "INPUT", datatype: "BYTES", shape: [1n, 1n] }],
    rawInputContents: [element("x")],
    parameters: {
      mine: create(InferParameterSchema, { parameterChoice: { case: "stringParam", value: "kept" } }),
      ...(final ? { triton_enable_empty_final_response: final } : {}),
    },
  });
}

it("flags the answer to a stream request that asks for it, keeps the parameter from the model, and refuses a non-bool", async () => {
  const client = grpcClientOf(server);
  const bool = (value: boolean) => create(InferParameterSchema, { parameterChoice: { case: "boolParam", value } });
  async function* requests() {
    yield reflectRequest("asks", bool(true));
    yield reflectRequest("plain");
    yield reflectRequest("declines", bool(false));
    yield reflectRequest("wrong", create(InferParameterSchema, { parameterChoice: { case: "int64Param", value: 1n } }));
  }
  const answers = new Map<string, { flag: unknown; seen?: unknown; error?: string }>();
  for await (const r of client.modelStreamInfer(requests())) {
    const res = r.inferResponse;
    const raw = res?.rawOutputContents[0];
    answers.set(res?.id ?? "", {
      flag: res?.parameters.triton_final_response?.parameterChoice,
      ...(raw ? { seen: JSON.parse(new TextDecoder().decode(raw.subarray(4))) } : {}),
      ...(r.errorMessage ? { error: r.errorMessage } : {}),
    });
  }
  expect(answers.get("asks")).toEqual({ flag: { case: "boolParam", value: true }, seen: { mine: "kept" } });
  expect(answers.get("plain")).toEqual({ flag: undefined, seen: { mine: "kept" } });
  expect(answers.get("declines")).toEqual({ flag: undefined, seen: { mine: "kept" } });
  expect(answers.get("wrong")).toEqual({
    flag: undefined,
    error: "reflect: invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param",
  });
});

it("keeps the parameter from the model on unary ModelInfer too", async () => {
  const client = grpcClientOf(server);
  const res = await client.modelInfer(
    reflectRequest("unary", create(InferParameterSchema, { parameterChoice: { case: "boolParam", value: true } })),
  );
  expect(JSON.parse(new TextDecoder().decode((res.rawOutputContents[0] as Uint8Array).subarray(4)))).toEqual({
    mine: "kept",
  });
  expect(res.parameters.triton_final_response).toBeUndefined();
});
