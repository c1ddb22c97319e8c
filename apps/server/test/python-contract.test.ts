/**
 * Issue 53, black-box: Triton's Python-backend contract as its documentation teaches it, each
 * model.py written the way Triton's examples write them, served by the real server and driven
 * over HTTP and gRPC: async execute, BLS (a name read from a BYTES input, async_exec calls in
 * flight at once, exec(decoupled=True), model control), request and response parameters,
 * TritonError codes as Triton maps them, argument checks, and request cancellation.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Code, type ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { COUNTDOWN_CONFIG, explicitModels, grpcClientOf, makeRepository, postJson, scrape } from "./helpers.js";

const pythonConfig = (name: string, body: string) => `name: "${name}"\nbackend: "python"\n${body}`;

// Answers each request with how many requests its execute() received: two BLS calls in flight at
// once arrive within the (long) queue delay and are batched together; calls made one after the
// other would each run alone.
const BATCH_SEEN_CONFIG = pythonConfig(
  "batch_seen",
  `max_batch_size: 2
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 4000000 }
parameters { key: "dynamic_batching_strategy" value: { string_value: "delay" } }
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
);
const BATCH_SEEN_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seen = np.full((1, 1), len(requests), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SEEN", seen)]))
        return responses
`;

// async def execute, as Triton's BLS example writes it: the callee's name comes from a BYTES
// input (as_numpy()[0] is numpy bytes), both calls go out at once under asyncio.gather.
const ASYNC_BLS_CONFIG = pythonConfig(
  "async_bls",
  `max_batch_size: 0
input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "COUNTDOWN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "CONTROL" data_type: TYPE_STRING dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
);
const ASYNC_BLS_MODEL = `import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            awaits = []
            for value in (1, 2):
                infer_request = pb_utils.InferenceRequest(
                    model_name=model_name,
                    requested_output_names=["SEEN"],
                    inputs=[pb_utils.Tensor("X", np.array([[value]], dtype=np.int32))])
                awaits.append(infer_request.async_exec())
            infer_responses = await asyncio.gather(*awaits)
            seen = []
            for infer_response in infer_responses:
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                seen.append(int(pb_utils.get_output_tensor_by_name(infer_response, "SEEN").as_numpy()[0][0]))

            countdown = pb_utils.InferenceRequest(
                model_name="countdown",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([3], dtype=np.int32))])
            values = []
            for response in countdown.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.append(int(out.as_numpy()[0]))

            try:
                pb_utils.load_model(model_name="countdown")
                loaded = "loaded"
            except pb_utils.TritonModelException as e:
                loaded = "UNSUPPORTED" if e.code() == pb_utils.TritonError.UNSUPPORTED else str(e.code())
            control = np.array([str(pb_utils.is_model_ready("batch_seen")).encode(),
                                str(pb_utils.is_model_ready("absent")).encode(), loaded.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SEEN", np.array(seen, dtype=np.int32)),
                pb_utils.Tensor("COUNTDOWN", np.array(values, dtype=np.int32)),
                pb_utils.Tensor("CONTROL", control)]))
        return responses
`;

// Request parameters in, response parameters out, and each TritonError code as a model raises it.
const PARAMS_CONFIG = pythonConfig(
  "params",
  `max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
);
const PARAMS_MODEL = `import json
import numpy as np
import triton_python_backend_utils as pb_utils

CODES = {
    "not_found": pb_utils.TritonError.NOT_FOUND,
    "invalid": pb_utils.TritonError.INVALID_ARG,
    "unavailable": pb_utils.TritonError.UNAVAILABLE,
    "unsupported": pb_utils.TritonError.UNSUPPORTED,
    "exists": pb_utils.TritonError.ALREADY_EXISTS,
    "cancelled": pb_utils.TritonError.CANCELLED,
    "internal": pb_utils.TritonError.INTERNAL,
}


class TritonPythonModel:
    def execute(self, requests):
        params = json.loads(requests[0].parameters())
        mode = params.get("mode", "echo")
        if mode == "raise":
            raise pb_utils.TritonError("the model refused the batch", pb_utils.TritonError.UNAVAILABLE)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if mode in CODES:
                error = pb_utils.TritonError(f"asked for {mode}", CODES[mode])
                responses.append(pb_utils.InferenceResponse(error=error))
            elif mode == "list_tensor":
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", [1.0])]))
            elif mode == "bad_error":
                responses.append(pb_utils.InferenceResponse(error="not a TritonError"))
            elif mode == "reschedule":
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("Y", x * 2)],
                    parameters={"keys": ",".join(sorted(params)), "count": params.get("count", 0) + 1, "ok": True}))
        return responses
`;

// Waits until its request is cancelled (at most 20 s), then answers; each answer says how many
// cancellations it has seen before it.
const WAITS_CONFIG = pythonConfig(
  "waits",
  `max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "CANCELLED_SEEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
);
const WAITS_MODEL = `import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.cancelled_seen = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] == 1:
                deadline = time.time() + 20
                while not request.is_cancelled() and time.time() < deadline:
                    time.sleep(0.01)
                if request.is_cancelled():
                    self.cancelled_seen += 1
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
                    continue
            seen = np.array([self.cancelled_seen], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("CANCELLED_SEEN", seen)]))
        return responses
`;

// No config.pbtxt: the config is all auto_complete_config's, written as Triton's example writes it.
const AUTO_ADD_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", a + b)]))
        return responses
`;
// Its config.pbtxt says max_batch_size 4; its auto_complete_config says 8: Triton refuses the load.
const AUTO_CONFLICT_CONFIG = pythonConfig("auto_conflict", "max_batch_size: 4\n");
const AUTO_CONFLICT_MODEL = `import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return []
`;

// Custom metrics as Triton's documentation writes them: families made in initialize, a
// Metric per label set; X = -1 makes a label set per loop turn and X = -2 a family per turn
// (both past the server's bounds), which must fail that request alone, named.
const METERED_CONFIG = pythonConfig(
  "metered",
  `max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_FP64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
);
const METERED_MODEL = `import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.count_family = pb_utils.MetricFamily(
            name="custom_requests_total", description="Requests this model answered",
            kind=pb_utils.MetricFamily.COUNTER)
        self.last_family = pb_utils.MetricFamily(
            name="custom_last_input", description="The last input seen", kind=pb_utils.MetricFamily.GAUGE)
        self.input_family = pb_utils.MetricFamily(
            name="custom_input_value", description="Inputs seen", kind=pb_utils.MetricFamily.HISTOGRAM)
        self.count = self.count_family.Metric(labels=labels)
        self.last = self.last_family.Metric(labels=labels)
        self.inputs = self.input_family.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x == -1:
                per_request = pb_utils.MetricFamily(
                    name="custom_per_request", description="one per request", kind=pb_utils.MetricFamily.COUNTER)
                for i in range(5000):
                    per_request.Metric(labels={"request": str(i)}).increment(1)
            if x == -2:
                for i in range(5000):
                    pb_utils.MetricFamily(name=f"custom_family_{i}", description="one per turn",
                                          kind=pb_utils.MetricFamily.GAUGE)
            self.count.increment(1)
            self.last.set(x)
            self.inputs.observe(x)
            count = np.array([self.count.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("COUNT", count)]))
        return responses
`;

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    batch_seen: { config: BATCH_SEEN_CONFIG, files: { "1/model.py": BATCH_SEEN_MODEL } },
    async_bls: { config: ASYNC_BLS_CONFIG, files: { "1/model.py": ASYNC_BLS_MODEL } },
    params: { config: PARAMS_CONFIG, files: { "1/model.py": PARAMS_MODEL } },
    waits: { config: WAITS_CONFIG, files: { "1/model.py": WAITS_MODEL } },
    countdown: { config: COUNTDOWN_CONFIG },
    auto_conflict: { config: AUTO_CONFLICT_CONFIG, files: { "1/model.py": AUTO_CONFLICT_MODEL } },
    metered: { config: METERED_CONFIG, files: { "1/model.py": METERED_MODEL } },
  });
  await mkdir(join(repo, "auto_add", "1"), { recursive: true });
  await writeFile(join(repo, "auto_add", "1", "model.py"), AUTO_ADD_MODEL);
  server = await startServerProcess([
    ...explicitModels(repo, "batch_seen", "async_bls", "params", "waits", "countdown", "auto_add", "metered"),
    "--python-executable",
    "/usr/bin/python3",
  ]);
}, 180_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const paramsInfer = (parameters: Record<string, unknown>) =>
  postJson(`${server.http}/v2/models/params/infer`, {
    parameters,
    inputs: [{ name: "X", datatype: "FP32", shape: [1], data: [1.5] }],
  });

describe("async execute and BLS", () => {
  it("awaits async execute; async_exec calls run at once; a bytes model name, decoupled exec and model control work", async () => {
    const { status, json } = await postJson(`${server.http}/v2/models/async_bls/infer`, {
      inputs: [{ name: "MODEL_NAME", datatype: "BYTES", shape: [1], data: ["batch_seen"] }],
    });
    expect(status, JSON.stringify(json)).toBe(200);
    const out = (name: string) => json.outputs.find((o: { name: string }) => o.name === name).data;
    // Both calls were in batch_seen's queue together: one execution of two requests.
    expect(out("SEEN")).toEqual([2, 2]);
    expect(out("COUNTDOWN")).toEqual([3, 2, 1]);
    expect(out("CONTROL")).toEqual(["True", "False", "UNSUPPORTED"]);
  }, 60_000);

  it("a BLS call to a missing model is the model's error, and other models answer", async () => {
    const [bad, good] = await Promise.all([
      postJson(`${server.http}/v2/models/async_bls/infer`, {
        inputs: [{ name: "MODEL_NAME", datatype: "BYTES", shape: [1], data: ["no_such_model"] }],
      }),
      paramsInfer({ mode: "echo" }),
    ]);
    expect(bad.status).toBe(500);
    expect(bad.json.error).toContain("no_such_model");
    expect(good.status).toBe(200);
    expect(good.json.outputs[0].data).toEqual([3]);
  }, 60_000);
});

describe("parameters and errors", () => {
  it("gives the request's parameters as JSON text and the response's parameters to the client", async () => {
    const { status, json } = await paramsInfer({ mode: "echo", count: 41, tag: "x" });
    expect(status).toBe(200);
    expect(json.parameters).toEqual({ keys: "count,mode,tag", count: 42, ok: true });
    const client = grpcClientOf(server);
    const answer = await client.modelInfer({
      modelName: "params",
      inputs: [{ name: "X", datatype: "FP32", shape: [1n], contents: { fp32Contents: [2] } }],
      parameters: { mode: { parameterChoice: { case: "stringParam", value: "echo" } } },
    });
    expect(answer.parameters.keys?.parameterChoice).toEqual({ case: "stringParam", value: "mode" });
    expect(answer.parameters.ok?.parameterChoice).toEqual({ case: "boolParam", value: true });
    expect(answer.parameters.count?.parameterChoice).toEqual({ case: "int64Param", value: 1n });
  }, 30_000);

  it("maps each TritonError code as Triton does, over HTTP and gRPC", async () => {
    const expected: [string, number, Code][] = [
      ["not_found", 404, Code.NotFound],
      ["invalid", 400, Code.InvalidArgument],
      ["unavailable", 503, Code.Unavailable],
      ["unsupported", 501, Code.Unimplemented],
      ["exists", 400, Code.AlreadyExists],
      ["cancelled", 400, Code.Canceled],
      ["internal", 500, Code.Internal],
      // An exception raised by execute keeps its TritonError code.
      ["raise", 503, Code.Unavailable],
    ];
    const client = grpcClientOf(server);
    for (const [mode, status, code] of expected) {
      const http = await paramsInfer({ mode });
      expect(http.status, mode).toBe(status);
      expect(http.json.error).toContain(mode === "raise" ? "the model refused the batch" : `asked for ${mode}`);
      const e = (await client
        .modelInfer({
          modelName: "params",
          inputs: [{ name: "X", datatype: "FP32", shape: [1n], contents: { fp32Contents: [2] } }],
          parameters: { mode: { parameterChoice: { case: "stringParam", value: mode } } },
        })
        .catch((x: ConnectError) => x)) as ConnectError;
      expect(e.code, mode).toBe(code);
    }
  }, 60_000);

  it("pb_utils constructors refuse wrong types with clear messages, failing only that request", async () => {
    const [list, badError, good] = await Promise.all([
      paramsInfer({ mode: "list_tensor" }),
      paramsInfer({ mode: "bad_error" }),
      postJson(`${server.http}/v2/models/async_bls/infer`, {
        inputs: [{ name: "MODEL_NAME", datatype: "BYTES", shape: [1], data: ["batch_seen"] }],
      }),
    ]);
    expect(list.status).toBe(500);
    expect(list.json.error).toContain('pb_utils.Tensor("Y", ...): the data must be a numpy.ndarray, not list');
    expect(badError.status).toBe(500);
    expect(badError.json.error).toContain("InferenceResponse: error must be a pb_utils.TritonError, not str");
    expect(good.status).toBe(200);
    // Rescheduling is Triton's for decoupled iterative sequence models, which are not served: named.
    const reschedule = await paramsInfer({ mode: "reschedule" });
    expect(reschedule.status).not.toBe(200);
    expect(reschedule.json.error).toContain(
      "request rescheduling is for decoupled models with iterative sequence batching, which this server does not serve",
    );
    expect((await paramsInfer({ mode: "echo" })).status).toBe(200);
  }, 60_000);
});

describe("cancellation", () => {
  it("request.is_cancelled() turns true when the client's deadline passes", async () => {
    const client = grpcClientOf(server);
    const waitsRequest = (x: number) => ({
      modelName: "waits",
      inputs: [{ name: "X", datatype: "FP32", shape: [1n], contents: { fp32Contents: [x] } }],
    });
    const e = (await client
      .modelInfer(waitsRequest(1), { timeoutMs: 1500 })
      .catch((x: ConnectError) => x)) as ConnectError;
    expect([Code.DeadlineExceeded, Code.Canceled]).toContain(e.code);
    // The execution saw the cancellation (else it waits 20 s and counts none).
    const answer = await client.modelInfer(waitsRequest(0));
    expect(Array.from(new Int32Array(Uint8Array.from(answer.rawOutputContents[0] ?? []).buffer))).toEqual([1]);
  }, 60_000);
});

describe("auto-complete", () => {
  it("serves a folder without config.pbtxt with the config its auto_complete_config gives", async () => {
    const config = await (await fetch(`${server.http}/v2/models/auto_add/config`)).json();
    expect(config.max_batch_size).toBe(8);
    expect(config.backend).toBe("python");
    expect(config.input.map((i: { name: string }) => i.name)).toEqual(["INPUT0", "INPUT1"]);
    expect(config.output[0]).toMatchObject({ name: "OUTPUT0", data_type: "TYPE_FP32", dims: [4] });
    expect(config.dynamic_batching).toBeDefined();
    const { status, json } = await postJson(`${server.http}/v2/models/auto_add/infer`, {
      inputs: [
        { name: "INPUT0", datatype: "FP32", shape: [2, 4], data: [1, 2, 3, 4, 5, 6, 7, 8] },
        { name: "INPUT1", datatype: "FP32", shape: [2, 4], data: [10, 10, 10, 10, 20, 20, 20, 20] },
      ],
    });
    expect(status, JSON.stringify(json)).toBe(200);
    expect(json.outputs[0].data).toEqual([11, 12, 13, 14, 25, 26, 27, 28]);
  }, 30_000);

  it("refuses a max_batch_size that conflicts with config.pbtxt, as Triton does, and the server serves on", async () => {
    const res = await postJson(`${server.http}/v2/repository/models/auto_conflict/load`, {});
    expect(res.status).toBe(400);
    expect(res.json.error).toContain(
      "configuration specified max_batch_size 4, but in auto-complete-config function for model 'auto_conflict' specified max_batch_size 8",
    );
    expect(res.json.error).not.toContain(repo);
    expect((await paramsInfer({ mode: "echo" })).status).toBe(200);
  }, 30_000);
});

describe("custom metrics", () => {
  const metered = (x: number) =>
    postJson(`${server.http}/v2/models/metered/infer`, {
      inputs: [{ name: "X", datatype: "FP32", shape: [1], data: [x] }],
    });

  it("shows counter, gauge and histogram values on /metrics beside nv_inference_*", async () => {
    const answers = [];
    for (const x of [5, 50, 500]) answers.push(await metered(x));
    expect(answers.map((a) => a.json.outputs[0].data[0])).toEqual([1, 2, 3]);
    const text = await scrape(server);
    const labels = '{model="metered",version="1"}';
    expect(text).toContain("nv_inference_request_success");
    expect(text).toContain(
      "# HELP custom_requests_total Requests this model answered\n# TYPE custom_requests_total counter",
    );
    expect(text).toContain(`custom_requests_total${labels} 3\n`);
    expect(text).toContain(`custom_last_input${labels} 500\n`);
    expect(text).toContain('custom_input_value_bucket{model="metered",version="1",le="1"} 0\n');
    expect(text).toContain('custom_input_value_bucket{model="metered",version="1",le="10"} 1\n');
    expect(text).toContain('custom_input_value_bucket{model="metered",version="1",le="100"} 2\n');
    expect(text).toContain('custom_input_value_bucket{model="metered",version="1",le="+Inf"} 3\n');
    expect(text).toContain(`custom_input_value_sum${labels} 555\n`);
    expect(text).toContain(`custom_input_value_count${labels} 3\n`);
  }, 60_000);

  it("bounds label sets and families: that request fails, named; other models answer; /metrics stays bounded", async () => {
    const [labels, other] = await Promise.all([metered(-1), paramsInfer({ mode: "echo" })]);
    expect(labels.status).toBe(503);
    expect(labels.json.error).toContain("custom metric label-set limit");
    expect(labels.json.error).toContain("at most 1024 label sets");
    expect(other.status).toBe(200);
    const families = await metered(-2);
    expect(families.status).toBe(503);
    expect(families.json.error).toContain("custom metric family limit");
    const text = await scrape(server);
    expect(text.match(/^custom_per_request\{/gm)?.length).toBe(1024);
    expect(text.match(/^# TYPE custom_/gm)?.length).toBe(128);
    // The model itself still works, its counter counting only the requests it answered.
    expect((await metered(1)).json.outputs[0].data[0]).toBe(4);
  }, 120_000);
});
