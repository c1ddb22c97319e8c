/**
 * Python models served by real python3 stub processes under the real model runtime: answers,
 * dynamic batching, and each failure (raise, hang, crash, too few responses, load errors) bounded
 * and named, with other requests and the restarted instance answering.
 */
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { createModelRuntime, type ModelRuntime } from "@trellis/runtime";
import { Code, type InferRequest, type ModelCaller, StageError, tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPythonBackend, type PythonBackend } from "../src/index.js";

let root: string;

const CONFIG = (name: string, extra = "") => `name: "${name}"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
${extra}`;

// Y = X * 2; X[0] == 13 sleeps forever, 66 exits the process, 99 raises, 7 answers that request with an error.
const MODEL = `import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.name = args["model_name"]
        out = pb_utils.get_output_config_by_name(self.config, "Y")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        self.batches = []

    def execute(self, requests):
        self.batches.append(len(requests))
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0][0] == 13:
                time.sleep(3600)
            if x[0][0] == 66:
                os._exit(1)
            if x[0][0] == 99:
                raise pb_utils.TritonModelException("ninety-nine is refused by model.py")
            if x[0][0] == 7:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("seven is unlucky")))
                continue
            if x[0][0] == 5:
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", (x * 2).astype(self.dtype))]))
        return responses
`;

async function writeModel(name: string, source: string, extra = ""): Promise<string> {
  const dir = join(root, name);
  await mkdir(join(dir, "1"), { recursive: true });
  await writeFile(join(dir, "config.pbtxt"), CONFIG(name, extra));
  await writeFile(join(dir, "1", "model.py"), source);
  return dir;
}

async function serve(
  name: string,
  executeTimeoutMs = 60_000,
): Promise<{ runtime: ModelRuntime; backend: PythonBackend }> {
  const modelDir = join(root, name);
  const config = parseModelConfig(CONFIG(name));
  const backend = await createPythonBackend({ config, modelDir, version: "1", executeTimeoutMs });
  const runtime = await createModelRuntime({ config, backend, modelDir });
  return { runtime, backend };
}

const request = (a: number, b = 1): InferRequest => ({
  inputs: [tensor("X", "FP32", [1, 2], new Float32Array([a, b]))],
});
const valuesOf = (r: Awaited<ReturnType<ModelRuntime["infer"]>>) => [...((r.outputs[0]?.data ?? []) as Float32Array)];

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "trellis-python-"));
  await writeModel("double", MODEL);
  await writeModel("other", MODEL);
});
afterAll(() => rm(root, { recursive: true, force: true }));

describe("a Python model", () => {
  let served: { runtime: ModelRuntime; backend: PythonBackend };
  let other: { runtime: ModelRuntime; backend: PythonBackend };
  beforeAll(async () => {
    // Long enough for a busy CI machine (a fresh process imports numpy), short enough to wait out once.
    served = await serve("double", 6000);
    other = await serve("other");
  }, 60_000);
  afterAll(async () => {
    await served?.runtime.close();
    await other?.runtime.close();
  });

  it("answers each request of a dynamic batch with its own rows", async () => {
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => served.runtime.infer(request(i + 20, i))));
    answers.forEach((a, i) => {
      expect(a.outputs[0]?.shape).toEqual([1, 2]);
      expect(valuesOf(a)).toEqual([(i + 20) * 2, i * 2]);
    });
  });

  it("fails only the request a response error names, and a raise fails the requests it was given", async () => {
    const results = await Promise.allSettled([
      served.runtime.infer(request(7)),
      ...Array.from({ length: 6 }, (_, i) => served.runtime.infer(request(i + 20))),
    ]);
    expect(results[0]?.status).toBe("rejected");
    expect(String((results[0] as PromiseRejectedResult).reason.message)).toContain("seven is unlucky");
    expect(results.slice(1).map((r) => (r.status === "fulfilled" ? "ok" : String(r.reason)))).toEqual(
      Array(6).fill("ok"),
    );
    const raised = await served.runtime.infer(request(99)).catch((e: StageError) => e);
    expect(raised).toBeInstanceOf(Error);
    expect((raised as StageError).message).toContain("ninety-nine is refused by model.py");
  });

  it("names too few responses as an error for those requests, not a hang", async () => {
    const e = await served.runtime.infer(request(5)).catch((x: StageError) => x);
    expect((e as StageError).message).toMatch(/execute\(\) returned 0 responses for 1 requests/);
    expect(valuesOf(await served.runtime.infer(request(3)))).toEqual([6, 2]);
  });

  it("bounds a hang and a crash: UNAVAILABLE naming the model, the other model answering, the instance restarted", async () => {
    const before = served.backend.instanceStarts()[0] as number;
    for (const bad of [13, 66]) {
      const failing = served.runtime.infer(request(bad)).catch((e: StageError) => e);
      // The other model answers while this one hangs or dies.
      const meanwhile = await Promise.all(Array.from({ length: 4 }, (_, i) => other.runtime.infer(request(i))));
      expect(meanwhile.map((a) => valuesOf(a)[0])).toEqual([0, 2, 4, 6]);
      const e = (await failing) as StageError;
      expect(e).toBeInstanceOf(StageError);
      expect(e.code).toBe(Code.Unavailable);
      expect(e.message).toContain('model "double"');
      expect(e.message).toMatch(bad === 13 ? /no answer within 6000 ms/ : /exited \(code 1\)/);
      expect(valuesOf(await served.runtime.infer(request(4)))).toEqual([8, 2]);
    }
    expect(served.backend.instanceStarts()[0]).toBe(before + 2);
  }, 60_000);

  it("fails a crashing or hanging row of a batch alone, with one restart; the same input again is refused without one", async () => {
    for (const bad of [66, 13]) {
      const before = served.backend.instanceStarts()[0] as number;
      // The first good one runs alone; the next six queue and form one batch, the bad input third
      // and again last (two clients sending it), which ends the instance. The model was reading the
      // third when it ended (stub.py's Progress), so that one runs last: the four good ones succeed
      // alone, and the two bad ones (one input) are the culprits without running again.
      const goods = [30, 31, 32].map((a) => served.runtime.infer(request(a, bad)));
      const failing = [served.runtime.infer(request(bad, 123)).catch((e: StageError) => e)];
      goods.push(...[33, 34].map((a) => served.runtime.infer(request(a, bad))));
      failing.push(served.runtime.infer(request(bad, 123)).catch((e: StageError) => e));
      const answers = await Promise.all(goods);
      expect(answers.map((a) => valuesOf(a))).toEqual([30, 31, 32, 33, 34].map((a) => [a * 2, bad * 2]));
      for (const e of (await Promise.all(failing)) as StageError[]) {
        expect(e.code).toBe(Code.Unavailable);
        expect(e.message).toMatch(bad === 13 ? /no answer within 6000 ms/ : /exited \(code 1\)/);
        expect(e.message).toMatch(/every other request of it succeeded alone, so this one was not run again/);
      }
      expect(served.backend.instanceStarts()[0]).toBe(before + 1);
      // The same input again: refused at once, naming why; no restart, good ones answered beside it.
      const [again, good] = await Promise.all([
        served.runtime.infer(request(bad, 123)).catch((x: StageError) => x),
        served.runtime.infer(request(3)),
      ]);
      expect((again as StageError).code).toBe(Code.Unavailable);
      expect((again as StageError).message).toMatch(/the same input ended the model's instance \d+ s ago/);
      expect(valuesOf(good)).toEqual([6, 2]);
      expect(served.backend.instanceStarts()[0]).toBe(before + 1);
    }
  }, 60_000);
});

// BLS: asks model "double" (through the server's models) and adds 1 to its answer; async_exec too.
const BLS_MODEL = `import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(model_name="double", inputs=[pb_utils.Tensor("X", x.as_numpy())], requested_output_names=["Y"])
            first = call.exec()
            second = asyncio.run(call.async_exec())
            missing = pb_utils.InferenceRequest(model_name="absent", inputs=[x], requested_output_names=["Y"]).exec()
            if first.has_error() or second.has_error() or not missing.has_error():
                raise pb_utils.TritonModelException("BLS answered wrongly")
            y = pb_utils.get_output_tensor_by_name(first, "Y").as_numpy() + pb_utils.get_output_tensor_by_name(second, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
`;

describe("BLS", () => {
  it("calls another model through the server's models, exec and async_exec, and a missing model is an error response", async () => {
    await writeModel("bls", BLS_MODEL);
    const target = await serve("double");
    const calls: string[] = [];
    const models: ModelCaller = {
      infer: (model, req) => {
        calls.push(model);
        if (model !== "double") return Promise.reject(new StageError(Code.NotFound, model, `no model "${model}"`));
        return target.runtime.infer(req);
      },
      inferStream: () => {
        throw new Error("not used");
      },
      isReady: async (model) => model === "double",
    };
    const config = parseModelConfig(CONFIG("bls"));
    const modelDir = join(root, "bls");
    const backend = await createPythonBackend({ config, modelDir, version: "1", models });
    const runtime = await createModelRuntime({ config, backend, modelDir });
    try {
      expect(valuesOf(await runtime.infer(request(3, 4)))).toEqual([12, 16]);
      expect(calls).toEqual(["double", "double", "absent"]);
    } finally {
      await runtime.close();
      await target.runtime.close();
    }
  }, 30_000);
});

describe("loading a Python model", () => {
  it("fails with the traceback's last lines", async () => {
    await writeModel("noclass", "import numpy\nclass Other:\n    pass\n");
    await writeModel("badimport", "import not_a_module_anywhere\n");
    for (const [name, words] of [
      ["noclass", "defines no class TritonPythonModel"],
      [
        "badimport",
        `File "1/model.py", line 1, in <module>\nModuleNotFoundError: No module named 'not_a_module_anywhere'`,
      ],
    ] as const) {
      const e = await serve(name).catch((x: StageError) => x);
      expect(e).toBeInstanceOf(StageError);
      expect((e as StageError).code).toBe(Code.InvalidArgument);
      expect((e as StageError).message).toContain(words);
      // The traceback names the model's own file, never the server's or the repository's paths.
      expect((e as StageError).message).not.toContain(root);
      expect((e as StageError).message).not.toContain("stub.py");
    }
  }, 30_000);

  it("says when the Python executable is missing", async () => {
    const config = parseModelConfig(CONFIG("double"));
    const e = await createPythonBackend({
      config,
      modelDir: join(root, "double"),
      version: "1",
      pythonExecutable: "/nonexistent/python3",
    }).catch((x: StageError) => x);
    expect((e as StageError).code).toBe(Code.Unavailable);
    expect((e as StageError).message).toContain(
      'the Python executable "/nonexistent/python3" was not found (set --python-executable)',
    );
  });
});
