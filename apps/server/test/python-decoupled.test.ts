/**
 * Issue 53, black-box: decoupled Python models as Triton's documentation writes them (execute
 * returns None; a thread sends each response through request.get_response_sender() and closes it
 * with TRITONSERVER_RESPONSE_COMPLETE_FINAL), served by the real server over gRPC ModelStreamInfer;
 * a repository mixing a decoupled model, a BLS model calling it, custom metrics and an
 * auto-completed model, started with default flags; and each way a decoupled model can misbehave
 * (no FINAL, an endless sender, a raise in execute) failing only its own request, named.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { type ModelInferRequest, ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, grpcClientOf, makeRepository, postJson, readStreamAnswer, scrape } from "./helpers.js";

const PYTHON = "/usr/bin/python3";

const REPEAT_CONFIG = `name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`;
// IN = values: one response per value, then FINAL, from a thread. IN[0] = -1 sends one response
// and never FINAL; -2 sends until the server closes its sender; -3 raises in execute.
const REPEAT_MODEL = `import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("repeat needs model_transaction_policy { decoupled: true }")

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if values[0] == -3:
                raise pb_utils.TritonModelException("minus three is refused in execute", pb_utils.TritonError.INVALID_ARG)
            threading.Thread(target=self.respond, args=(request.get_response_sender(), values), daemon=True).start()
        return None

    def respond(self, sender, values):
        def out(v):
            return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))])
        if values[0] == -1:
            sender.send(out(-1))
            return
        if values[0] == -2:
            i = 0
            while True:
                try:
                    sender.send(out(i))
                except Exception:
                    return  # the server closed the sender
                i += 1
        for v in values:
            sender.send(out(int(v)))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
`;

// BLS into the decoupled model: exec(decoupled=True) iterates its responses; the sum is answered.
const SUMS_CONFIG = `name: "sums"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
`;
const SUMS_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = pb_utils.MetricFamily(
            name="sums_bls_calls", description="BLS calls into repeat", kind=pb_utils.MetricFamily.COUNTER
        ).Metric(labels={"callee": "repeat"})

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN")
            call = pb_utils.InferenceRequest(model_name="repeat", inputs=[values], requested_output_names=["OUT"])
            total, count = 0, 0
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    total += int(out.as_numpy()[0])
                    count += 1
            self.calls.increment(1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32))]))
        return responses
`;

// BLS into the decoupled model's endless sender: exec(decoupled=True) streams, so the first three
// responses are there to take while the callee is still sending.
const FIRSTS_CONFIG = `name: "firsts"
backend: "python"
max_batch_size: 0
input [ { name: "TAKE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "FIRST" data_type: TYPE_INT32 dims: [ -1 ] } ]
`;
const FIRSTS_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            take = int(pb_utils.get_input_tensor_by_name(request, "TAKE").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="repeat",
                inputs=[pb_utils.Tensor("IN", np.array([-2], dtype=np.int32))],
                requested_output_names=["OUT"],
            )
            firsts = []
            for response in await call.async_exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                firsts.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
                if len(firsts) == take:
                    break
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("FIRST", np.array(firsts, dtype=np.int32))]))
        return responses
`;

// No config.pbtxt: auto_complete_config names the backend's inputs and outputs.
const AUTO_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "NEG", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("NEG", -pb_utils.get_input_tensor_by_name(r, "A").as_numpy())]) for r in requests]
`;

const repeatRequest = (id: string, values: number[]): ModelInferRequest =>
  create(ModelInferRequestSchema, {
    modelName: "repeat",
    id,
    inputs: [{ name: "IN", datatype: "INT32", shape: [BigInt(values.length)] }],
    rawInputContents: [new Uint8Array(Int32Array.from(values).buffer)],
  });

let repo: string;
/** Default flags (only the python3 that has numpy named). */
let plain: ServerProcess;
/** Short bounds for the misbehaving senders. */
let bounded: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    repeat: { config: REPEAT_CONFIG, files: { "1/model.py": REPEAT_MODEL } },
    sums: { config: SUMS_CONFIG, files: { "1/model.py": SUMS_MODEL } },
    firsts: { config: FIRSTS_CONFIG, files: { "1/model.py": FIRSTS_MODEL } },
    echo: { config: echoConfig("echo") },
    // The decoupled Python model as an ensemble's first step: each of its responses flows on.
    tenfold_int: {
      config: echoConfig("tenfold_int", { datatype: "TYPE_INT32", dims: [1], maxBatch: 0, params: { scale: "10" } }),
    },
    py_counting: {
      config: `name: "py_counting"
platform: "ensemble"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "TENS" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1 input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "one" } },
  { model_name: "tenfold_int" model_version: -1 input_map { key: "INPUT" value: "one" } output_map { key: "OUTPUT" value: "TENS" } }
] }
`,
    },
  });
  await mkdir(join(repo, "auto", "1"), { recursive: true });
  await writeFile(join(repo, "auto", "1", "model.py"), AUTO_MODEL);
  [plain, bounded] = await Promise.all([
    startServerProcess(["--model-repository", repo, "--python-executable", PYTHON]),
    startServerProcess([
      "--model-repository",
      repo,
      "--python-executable",
      PYTHON,
      "--python-execute-timeout-secs",
      "3",
      "--python-max-responses",
      "50",
    ]),
  ]);
}, 180_000);
afterAll(async () => {
  expect(await plain?.stop()).toBe(0);
  expect(await bounded?.stop()).toBe(0);
  await removeDir(repo);
});

async function streamAnswers(server: ServerProcess, requests: ModelInferRequest[]): Promise<string[]> {
  async function* send() {
    yield* requests;
  }
  const answers: string[] = [];
  for await (const a of grpcClientOf(server).modelStreamInfer(send())) answers.push(readStreamAnswer(a));
  return answers;
}

describe("a repository of a decoupled model, BLS into it, custom metrics and auto-complete", () => {
  it("starts with default flags, every model ready, and each answers", async () => {
    for (const model of ["repeat", "sums", "auto", "echo", "py_counting"]) {
      expect((await fetch(`${plain.http}/v2/models/${model}/ready`)).status, model).toBe(200);
    }
    const answers = await streamAnswers(plain, [repeatRequest("a", [5, 6, 7]), repeatRequest("b", [9])]);
    expect(answers.filter((a) => a.startsWith("a "))).toEqual(["a 5", "a 6", "a 7"]);
    expect(answers.filter((a) => a.startsWith("b "))).toEqual(["b 9"]);
    const counting = create(ModelInferRequestSchema, {
      modelName: "py_counting",
      id: "c",
      inputs: [{ name: "N", datatype: "INT32", shape: [3n] }],
      rawInputContents: [new Uint8Array(Int32Array.of(1, 2, 3).buffer)],
    });
    expect(await streamAnswers(plain, [counting])).toEqual(["c 10", "c 20", "c 30"]);
    const sums = await postJson(`${plain.http}/v2/models/sums/infer`, {
      inputs: [{ name: "IN", datatype: "INT32", shape: [4], data: [1, 2, 3, 4] }],
    });
    expect(sums.status).toBe(200);
    const byName = Object.fromEntries(sums.json.outputs.map((o: { name: string; data: number[] }) => [o.name, o.data]));
    expect(byName).toEqual({ SUM: [10], COUNT: [4] });
    const auto = await postJson(`${plain.http}/v2/models/auto/infer`, {
      inputs: [{ name: "A", datatype: "FP32", shape: [1, 2], data: [1.5, -2] }],
    });
    expect(auto.json.outputs[0].data).toEqual([-1.5, 2]);
    const config = await (await fetch(`${plain.http}/v2/models/auto/config`)).json();
    expect(config.max_batch_size).toBe(4);
    expect(config.input.map((i: { name: string }) => i.name)).toEqual(["A"]);
    // One answer only: a decoupled model is refused on the one-answer endpoint (as decoupled.test.ts).
    const once = await postJson(`${plain.http}/v2/models/repeat/infer`, {
      inputs: [{ name: "IN", datatype: "INT32", shape: [1], data: [1] }],
    });
    expect(once.status).toBe(501);
    expect(once.json.error).toMatch(/decoupled/);
    const text = await scrape(plain);
    expect(text).toContain('sums_bls_calls{callee="repeat"} 1\n');
    // Two streamed requests, the ensemble's step and the BLS call: each counted once, at its FINAL.
    expect(text).toMatch(/nv_inference_request_success\{model="repeat",version="1"\} 4\n/);
  }, 60_000);
});

describe("BLS into a decoupled model", () => {
  it("iterates the callee's responses as they come: the first three of an endless sender, then others answer", async () => {
    const firsts = await postJson(`${plain.http}/v2/models/firsts/infer`, {
      inputs: [{ name: "TAKE", datatype: "INT32", shape: [1], data: [3] }],
    });
    expect(firsts.status, JSON.stringify(firsts.json)).toBe(200);
    expect(firsts.json.outputs[0].data).toEqual([0, 1, 2]);
    // The abandoned stream ends at its bound; the callee then serves a fresh request in full.
    expect(await streamAnswers(plain, [repeatRequest("next", [4, 5])])).toEqual(["next 4", "next 5"]);
  }, 60_000);
});

describe("a decoupled model that misbehaves", () => {
  it("fails only that request, named: no FINAL, an endless sender, a raise in execute; the rest answer", async () => {
    const echo = Array.from({ length: 8 }, (_, i) =>
      postJson(`${bounded.http}/v2/models/echo/infer`, {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [i, 1, 2, 3] }],
      }),
    );
    const answers = await streamAnswers(bounded, [
      repeatRequest("silent", [-1]),
      repeatRequest("endless", [-2]),
      repeatRequest("raises", [-3]),
      repeatRequest("good", [1, 2]),
    ]);
    const of = (id: string) => answers.filter((a) => a.startsWith(`${id} `));
    expect(of("good")).toEqual(["good 1", "good 2"]);
    expect(of("raises")).toEqual(["raises error: repeat: minus three is refused in execute"]);
    const silent = of("silent");
    expect(silent.slice(0, 1)).toEqual(["silent -1"]);
    expect(silent[1]).toMatch(/^silent error: .*sent no response for 3000 ms without closing its response sender/);
    const endless = of("endless");
    expect(endless).toHaveLength(51);
    expect(endless.slice(0, 3)).toEqual(["endless 0", "endless 1", "endless 2"]);
    expect(endless[50]).toMatch(/sent more than 50 responses to one request \(--python-max-responses\)/);
    for (const r of await Promise.all(echo)) expect(r.status).toBe(200);
    // The model is fine afterwards: a fresh request is answered in full.
    expect(await streamAnswers(bounded, [repeatRequest("after", [3])])).toEqual(["after 3"]);
  }, 60_000);
});
