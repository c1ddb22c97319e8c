import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { availableParallelism, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { type ListeningServer, listenStage } from "@trellis/frontends";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { parseModelConfig } from "@trellis/protocol";
import { CpuGate } from "@trellis/runtime";
import {
  bytesTensor,
  bytesToStrings,
  Code,
  type InferRequest,
  type Stage,
  StageError,
  type StageLogger,
  tensor,
} from "@trellis/stage";
import { identityModel, MOBILENET_PATH, rejectionOf } from "@trellis/testing";
import { synthesizeResNet50 } from "@trellis/tooling";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  autoCompleteConfig,
  exclusiveCpu,
  planInstances,
  readOnnxMetadataProps,
  SYNTHETIC_METADATA_KEY,
  sessionOptions,
} from "../dist/index.js";
import { createOnnxStage, type OnnxStage } from "./serve-onnx.js";

const IMAGE = 3 * 224 * 224;
const repo = mkdtempSync(join(tmpdir(), "trellis-onnx-test-"));
const stages: Stage[] = [];

afterAll(async () => {
  await Promise.all(stages.map((s) => s.close()));
  rmSync(repo, { recursive: true, force: true });
});

/** A model folder in the temp repository: config text and the model (a file to copy, or bytes). */
function modelDir(name: string, model: string | Uint8Array): string {
  const dir = join(repo, name);
  mkdirSync(join(dir, "1"), { recursive: true });
  if (typeof model === "string") copyFileSync(model, join(dir, "1", "model.onnx"));
  else writeFileSync(join(dir, "1", "model.onnx"), model);
  return dir;
}

async function load(name: string, model: string | Uint8Array, config: string, extra: object = {}): Promise<OnnxStage> {
  const stage = await createOnnxStage({
    config: parseModelConfig(`name: "${name}"\n${config}`),
    modelDir: modelDir(name, model),
    ...extra,
  });
  stages.push(stage);
  return stage;
}

async function loadError(name: string, model: string | Uint8Array, config: string, extra: object = {}) {
  const err = await load(name, model, config, extra).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StageError);
  return err as StageError;
}

/** Deterministic pseudo-random floats in [-2, 2), like normalised image pixels. */
function images(n: number, seed: number): Float32Array {
  let s = seed >>> 0 || 1;
  const out = new Float32Array(n * IMAGE);
  for (let i = 0; i < out.length; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    out[i] = (s / 2 ** 32) * 4 - 2;
  }
  return out;
}

const imageRequest = (n: number, seed: number): InferRequest => ({
  inputs: [tensor("input", "FP32", [n, 3, 224, 224], images(n, seed))],
});

function expectClose(got: Float32Array, want: Float32Array) {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
  expect(worst).toBeLessThanOrEqual(1e-5);
}

/**
 * The acceptance checks on one real model: the stage's outputs equal a
 * direct InferenceSession.run, run alone and dynamically batched.
 */
function equalityTests(label: string, key: string, modelPath: () => string) {
  // fp32 ResNet-50 runs 24 images twice per test: 55 s in CI runs with every suite beside it.
  describe(`${label}: outputs equal a direct InferenceSession.run`, { timeout: 240_000 }, () => {
    let reference: ort.InferenceSession;
    const direct = async (data: Float32Array, n: number) =>
      (await reference.run({ input: new ort.Tensor("float32", data, [n, 3, 224, 224]) })).output!.data as Float32Array;

    beforeAll(async () => {
      reference = await ort.InferenceSession.create(modelPath());
    });
    afterAll(async () => {
      await reference.release();
    });

    it("equals a direct InferenceSession.run for batch 1, 3 and 8, each request run alone", async () => {
      const stage = await load(
        `${key}_plain`,
        modelPath(),
        `platform: "onnxruntime_onnx"
         max_batch_size: 8
         input [{ name: "input" data_type: TYPE_FP32 dims: [3, 224, 224] }]
         output [{ name: "output" data_type: TYPE_FP32 dims: [1000] }]`,
      );
      expect(await stage.isReady()).toBe(true);
      for (const [n, seed] of [
        [1, 11],
        [3, 12],
        [8, 13],
      ] as const) {
        const req = imageRequest(n, seed);
        const res = await stage.infer(req);
        expect(res.modelName).toBe(`${key}_plain`);
        expect(res.outputs[0]!.shape).toEqual([n, 1000]);
        expectClose(res.outputs[0]!.data as Float32Array, await direct(req.inputs[0]!.data as Float32Array, n));
      }
      const stats = await stage.statistics();
      expect(stats.executionCount).toBe(3n);
      expect(stats.inferenceCount).toBe(12n);
      expect(stats.batchStats.map((b) => b.batchSize)).toEqual([1n, 3n, 8n]);
      expect(Number(stats.inferenceStats?.computeInfer?.ns)).toBeGreaterThan(0);
    });

    it("with dynamic batching, mixes requests of sizes 1..4 and each output equals its own direct run", async () => {
      const stage = await load(
        `${key}_batched`,
        modelPath(),
        `platform: "onnxruntime_onnx"
         max_batch_size: 8
         dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 5000000 }
         parameters { key: "dynamic_batching_strategy" value: { string_value: "delay" } }`,
      );
      const sizes = [1, 2, 3, 4, 1, 3];
      const requests = sizes.map((n, i) => imageRequest(n, 100 + i));
      const responses = await Promise.all(requests.map((r) => stage.infer(r)));
      for (const [i, res] of responses.entries()) {
        const n = sizes[i]!;
        expect(res.outputs[0]!.shape).toEqual([n, 1000]);
        expectClose(
          res.outputs[0]!.data as Float32Array,
          await direct(requests[i]!.inputs[0]!.data as Float32Array, n),
        );
      }
      // 1+2+3 (4 would pass 8), then 4+1+3 = 8: two executions, not six.
      const stats = await stage.statistics();
      expect(stats.executionCount).toBe(2n);
      expect(stats.inferenceCount).toBe(14n);
      expect(stats.batchStats.map((b) => b.batchSize)).toEqual([6n, 8n]);
      expect(stats.inferenceStats?.success?.count).toBe(6n);
    });
  });
}

equalityTests("MobileNetV2 int8 (tooling/bundled)", "mnet", () => MOBILENET_PATH);

let resnetPath = "";
beforeAll(async () => {
  // The synthetic ResNet-50 (tooling's models:synth), generated into the temp repository.
  resnetPath = (await synthesizeResNet50({ seed: 7, path: join(repo, "synth", "model.onnx") })).path;
}, 300_000);
equalityTests("synthetic ResNet-50", "resnet", () => resnetPath);

describe("MobileNetV2 int8 (tooling/bundled)", () => {
  describe("queue policy and request checks", () => {
    // One instance (not Triton's default two), so that one running batch makes the rest queue.
    let stage: OnnxStage;
    beforeAll(async () => {
      stage = await load(
        "mnet_queue",
        MOBILENET_PATH,
        `platform: "onnxruntime_onnx"
         max_batch_size: 16
         instance_group [ { count: 1 kind: KIND_CPU } ]
         dynamic_batching { default_queue_policy { max_queue_size: 2 allow_timeout_override: true } }`,
      );
    });

    it("answers UNAVAILABLE (as Triton) at once when the queue is full", async () => {
      const running = stage.infer(imageRequest(16, 1));
      const queued = [stage.infer(imageRequest(16, 2)), stage.infer(imageRequest(16, 3))];
      expect(stage.pendingRequests()).toBe(2); // the running batch is not pending
      const err = await rejectionOf(stage.infer(imageRequest(1, 4)), StageError);
      expect(err.code).toBe(Code.Unavailable);
      expect(err.message).toMatch(/maximum queue size: 2/);
      await Promise.all([running, ...queued]);
    });

    it("fails a request whose queue timeout expires, and only that one", async () => {
      const running = stage.infer(imageRequest(16, 5));
      const late = stage.infer(imageRequest(1, 6), { timeoutMicroseconds: 1000 });
      const patient = stage.infer(imageRequest(1, 7));
      const err = await rejectionOf(late, StageError);
      expect(err.code).toBe(Code.Unavailable);
      expect(err.message).toMatch(/Request timeout expired.*1000 µs/);
      expect((await patient).outputs[0]!.shape).toEqual([1, 1000]);
      await running;
    });

    it("rejects wrong name, datatype, shape, size and outputs with INVALID_ARGUMENT in Triton's words (core src/infer_request.cc)", async () => {
      const cases: [InferRequest, RegExp][] = [
        [
          { inputs: [tensor("image", "FP32", [1, 3, 224, 224], images(1, 1))] },
          /unexpected inference input 'image' for model '\w+' \(its inputs: input\)$/,
        ],
        [
          { inputs: [tensor("input", "FP64", [1, 3, 224, 224], new Float64Array(IMAGE))] },
          /inference input 'input' data-type is 'FP64', but model '\w+' expects 'FP32'/,
        ],
        [
          { inputs: [tensor("input", "FP32", [1, 3, 224, 225], new Float32Array(3 * 224 * 225))] },
          /unexpected shape for input 'input' for model '\w+'\. Expected \[-1,3,224,224\], got \[1,3,224,225\]/,
        ],
        [
          { inputs: [tensor("input", "FP32", [1, 224, 224], new Float32Array(224 * 224))] },
          /Expected \[-1,3,224,224\], got \[1,224,224\]/,
        ],
        [
          { inputs: [{ name: "input", datatype: "FP32", shape: [2, 3, 224, 224], data: images(1, 1) }] },
          /input byte size mismatch for input 'input' for model '\w+'\. Expected 1204224, got 602112/,
        ],
        [
          { inputs: [] },
          /expected 1 inputs but got 0 inputs for model '\w+'\. Got input\(s\) \[\], but missing required input\(s\) \['input'\]/,
        ],
        [
          { ...imageRequest(1, 1), outputs: [{ name: "probs" }] },
          /unexpected inference output 'probs' for model '\w+' \(its outputs: output\)$/,
        ],
        [imageRequest(17, 1), /inference request batch-size must be <= 16 for '\w+' \(got 17\)/],
      ];
      for (const [req, message] of cases) {
        const err = await rejectionOf(stage.infer(req), StageError);
        expect(err.code).toBe(Code.InvalidArgument);
        expect(err.message).toMatch(message);
      }
    });

    it("keeps the event loop free: the run is handed to its worker, and gRPC health and metadata are answered while a batch is in flight", async () => {
      // Handed off: no worker reply can arrive during microtasks, so a run done on
      // the main thread would settle here and one handed to a worker cannot.
      let settled = false;
      const direct = stage.infer(imageRequest(16, 41)).finally(() => {
        settled = true;
      });
      for (let turn = 0; turn < 1000; turn++) await Promise.resolve();
      expect(settled).toBe(false);
      expect((await direct).outputs[0]!.shape).toEqual([16, 1000]);

      // In flight over the network: the served answer is held until both probes are
      // answered, so the order below is the code's, not the clock's.
      let probesAnswered!: () => void;
      const probesDone = new Promise<void>((r) => {
        probesAnswered = r;
      });
      let posted!: () => void;
      const batchPosted = new Promise<void>((r) => {
        posted = r;
      });
      const observed: Stage = {
        name: stage.name,
        version: stage.version,
        config: stage.config,
        isReady: () => stage.isReady(),
        metadata: () => stage.metadata(),
        statistics: () => stage.statistics(),
        close: () => stage.close(),
        infer: async (r, o) => {
          const p = stage.infer(r, o);
          posted();
          const [answer] = await Promise.all([p, probesDone]);
          return answer;
        },
      };
      const server: ListeningServer = await listenStage(observed);
      try {
        const remote = await connectStage(grpcTransport(server.url), stage.name);
        const order: string[] = [];
        const big = remote.infer(imageRequest(16, 42)).then((r) => {
          order.push("batch of 16");
          return r;
        });
        await batchPosted;
        expect(await remote.isReady()).toBe(true);
        order.push("ModelReady");
        const again = await connectStage(grpcTransport(server.url), stage.name); // ModelConfig + ModelMetadata RPCs
        expect((await again.metadata()).inputs[0]!.shape).toEqual([-1, 3, 224, 224]);
        order.push("ModelMetadata");
        probesAnswered();
        expect((await big).outputs[0]!.shape).toEqual([16, 1000]);
        expect(order).toEqual(["ModelReady", "ModelMetadata", "batch of 16"]);
      } finally {
        await server.close();
      }
    });
  });

  it("auto-completes a config without inputs and outputs from the model, as Triton's non-strict mode", async () => {
    const stage = await load("mnet_auto", MOBILENET_PATH, "");
    expect(stage.config.platform).toBe("onnxruntime_onnx");
    expect(stage.config.maxBatchSize).toBe(4);
    expect(stage.config.schedulingChoice.case).toBe("dynamicBatching");
    expect(stage.config.input.map((i) => [i.name, i.dims.map(Number)])).toEqual([["input", [3, 224, 224]]]);
    expect(stage.config.output.map((o) => [o.name, o.dims.map(Number)])).toEqual([["output", [1000]]]);
    expect((await stage.metadata()).outputs).toEqual([{ name: "output", datatype: "FP32", shape: [-1, 1000] }]);
    expect((await stage.infer(imageRequest(2, 3))).outputs[0]!.shape).toEqual([2, 1000]);

    const strict = await loadError("mnet_strict", MOBILENET_PATH, "", { strictModelConfig: true });
    expect(strict.message).toMatch(/strict model config needs input and output sections/);
  });

  it("refuses a config that disagrees with the model, naming the tensor, expected and got", async () => {
    const head = `max_batch_size: 8\noutput [{ name: "output" data_type: TYPE_FP32 dims: [1000] }]\n`;
    const cases: [string, RegExp][] = [
      [
        `input [{ name: "input" data_type: TYPE_FP32 dims: [3, 224, 225] }]`,
        /input input: dimension 3 differs: config dims \[3,224,225\].*model shape \[-1,3,224,224\]/,
      ],
      [
        `input [{ name: "input" data_type: TYPE_INT32 dims: [3, 224, 224] }]`,
        /input input: config datatype INT32, model datatype FP32/,
      ],
      [
        `input [{ name: "pixels" data_type: TYPE_FP32 dims: [3, 224, 224] }]`,
        /config input pixels is not a model input; the model's inputs are input/,
      ],
      [`input [{ name: "input" data_type: TYPE_FP32 dims: [224, 224] }]`, /input input: rank differs/],
    ];
    for (const [i, [input, message]] of cases.entries()) {
      const err = await loadError(`mnet_bad${i}`, MOBILENET_PATH, head + input);
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.message).toMatch(message);
    }
    const missing = (await createOnnxStage({
      config: parseModelConfig(`name: "nothing"`),
      modelDir: join(repo, "nothing"),
    }).then(
      () => undefined,
      (e: unknown) => e,
    )) as StageError;
    expect(missing.code).toBe(Code.NotFound);
    expect(missing.message).toContain("no model file model.onnx in version 1");
    expect(missing.message).not.toContain(repo);
    const outside = (await createOnnxStage({
      config: parseModelConfig(`name: "nothing" default_model_filename: "../../../../etc/hostname"`),
      modelDir: join(repo, "nothing"),
    }).then(
      () => undefined,
      (e: unknown) => e,
    )) as StageError;
    expect(outside.code).toBe(Code.InvalidArgument);
    expect(outside.message).toContain('default_model_filename "../../../../etc/hostname" must name a file inside');
  });

  it("exclusive_cpu: a run waits for the decodes holding the CPU gate, at most exclusive_cpu_max_wait_ms; with false it does not", async () => {
    const params = (exclusive: string, maxWaitMs: number) =>
      `max_batch_size: 8
       parameters { key: "exclusive_cpu" value: { string_value: "${exclusive}" } }
       parameters { key: "exclusive_cpu_max_wait_ms" value: { string_value: "${maxWaitMs}" } }`;
    const cpuGate = new CpuGate();
    const exclusive = await load("mnet_exclusive", MOBILENET_PATH, params("true", 60_000), { cpuGate });
    const bounded = await load("mnet_bounded", MOBILENET_PATH, params("true", 30), { cpuGate });
    const overlapping = await load("mnet_overlapping", MOBILENET_PATH, params("false", 60_000), { cpuGate });
    const decode = await cpuGate.acquireShared();
    let answered = false;
    const gated = exclusive.infer(imageRequest(1, 1)).then(() => {
      answered = true;
    });
    // Not gated: answers while the "decode" holds the gate.
    expect((await overlapping.infer(imageRequest(1, 2))).outputs[0]?.shape).toEqual([1, 1000]);
    await new Promise((r) => setTimeout(r, 100));
    expect(answered).toBe(false);
    expect(exclusive.pendingRequests?.()).toBe(1);
    decode();
    await gated;
    expect(answered).toBe(true);
    expect(cpuGate.heldExclusively).toBe(false);

    // A decode that takes too long: the bounded stage waits 30 ms for it, then runs alongside.
    const slowDecode = await cpuGate.acquireShared();
    const t0 = performance.now();
    expect((await bounded.infer(imageRequest(1, 3))).outputs[0]?.shape).toEqual([1, 1000]);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(25);
    expect(cpuGate.sharedHolders).toBe(1);
    slowDecode();

    const bad = await loadError("mnet_exclusive_bad", MOBILENET_PATH, params("maybe", 50));
    expect(bad.code).toBe(Code.InvalidArgument);
    expect(bad.message).toContain('parameter exclusive_cpu: expected auto, true or false, got "maybe"');
    const badWait = await loadError("mnet_exclusive_bad_wait", MOBILENET_PATH, params("true", -1));
    expect(badWait.message).toContain('parameter exclusive_cpu_max_wait_ms: expected a whole number ≥ 0, got "-1"');
  });

  it("runs Triton's default two CPU instances for a config without instance_group, each with half the cores", () => {
    const cores = availableParallelism();
    for (const text of [
      `name: "d"\nplatform: "onnxruntime_onnx"`,
      `name: "d"\ninstance_group [ { kind: KIND_CPU } ]`,
    ]) {
      const config = parseModelConfig(text);
      const plans = planInstances(config);
      expect(plans.map((p) => p.kind)).toEqual(["CPU", "CPU"]);
      expect(sessionOptions(config, plans[0]!, plans.length).intraOpNumThreads).toBe(
        Math.max(1, Math.floor(cores / 2)),
      );
    }
    // A count given is kept.
    expect(planInstances(parseModelConfig(`name: "d"\ninstance_group [ { count: 1 kind: KIND_CPU } ]`))).toHaveLength(
      1,
    );
  });

  it("exclusive_cpu auto: on for a CPU instance whose threads cover every core, off for fewer threads or a GPU", () => {
    const config = parseModelConfig(`name: "auto"`);
    const unlimited = { resources: [], priority: 0 };
    const cpu = { kind: "CPU" as const, deviceId: 0, executionProviders: ["cpu"], rateLimiter: unlimited };
    const cores = availableParallelism();
    expect(exclusiveCpu(config, cpu, cores)).toBe(true);
    if (cores > 1) expect(exclusiveCpu(config, cpu, cores - 1)).toBe(false);
    const gpu = { kind: "GPU" as const, deviceId: 0, executionProviders: ["cuda"], rateLimiter: unlimited };
    expect(exclusiveCpu(config, gpu, cores)).toBe(false);
  });

  it("warms up every instance before it is ready, outside the statistics", async () => {
    const stage = await load(
      "mnet_warm",
      MOBILENET_PATH,
      `max_batch_size: 8
       instance_group [{ count: 2 kind: KIND_CPU }]
       model_warmup [{ name: "zeros" batch_size: 2 count: 2 inputs { key: "input" value { data_type: TYPE_FP32 dims: [3, 224, 224] zero_data: true } } },
                     { name: "noise" batch_size: 1 inputs { key: "input" value { data_type: TYPE_FP32 dims: [3, 224, 224] random_data: true } } }]`,
    );
    expect(await stage.isReady()).toBe(true);
    expect((await stage.statistics()).executionCount).toBe(0n);
    const res = await Promise.all([stage.infer(imageRequest(1, 1)), stage.infer(imageRequest(1, 2))]);
    expect(res.map((r) => r.outputs[0]!.shape)).toEqual([
      [1, 1000],
      [1, 1000],
    ]);
    const bad = await loadError(
      "mnet_badwarm",
      MOBILENET_PATH,
      `max_batch_size: 8
       model_warmup [{ name: "wrong" batch_size: 1 inputs { key: "input" value { data_type: TYPE_FP32 dims: [3, 10, 10] zero_data: true } } }]`,
    );
    expect(bad.message).toMatch(/warmup \(wrong\) failed/);
  });

  it("KIND_GPU uses the CUDA execution provider, or fails to load saying it is missing", async () => {
    const ortDir = dirname(createRequire(import.meta.url).resolve("onnxruntime-node"));
    const hasCuda = existsSync(
      join(ortDir, "..", "bin", "napi-v6", "linux", "x64", "libonnxruntime_providers_cuda.so"),
    );
    const config = `max_batch_size: 8\ninstance_group [{ count: 1 kind: KIND_GPU gpus: [0] }]`;
    if (hasCuda) {
      const stage = await load("mnet_gpu", MOBILENET_PATH, config);
      expect((await stage.infer(imageRequest(1, 1))).outputs[0]!.shape).toEqual([1, 1000]);
    } else {
      const err = await loadError("mnet_gpu", MOBILENET_PATH, config);
      expect(err.code).toBe(Code.Unavailable);
      expect(err.message).toMatch(
        /KIND_GPU \(device 0\): no GPU that onnxruntime's cuda execution provider can use on this machine; set kind: KIND_CPU/,
      );
    }
  });
});

describe("ONNX Runtime's GPU execution accelerators (Triton's optimization.execution_accelerators)", () => {
  const providerInstalled = (name: string) =>
    existsSync(
      join(
        dirname(createRequire(import.meta.url).resolve("onnxruntime-node")),
        "..",
        "bin",
        "napi-v6",
        "linux",
        "x64",
        `libonnxruntime_providers_${name}.so`,
      ),
    );
  const base = `max_batch_size: 8\ninstance_group [{ count: 1 kind: KIND_CPU }]`;
  const asking = (name: string) =>
    `${base}\noptimization { execution_accelerators { gpu_execution_accelerator [ { name: "${name}" } ] } }`;

  it.each(["tensorrt", "cuda"])(
    "%s: fails the load naming the missing provider where the binary lacks it; the same config without it loads",
    async (accelerator) => {
      if (providerInstalled(accelerator) && providerInstalled("cuda")) {
        const stage = await load(`mnet_${accelerator}`, MOBILENET_PATH, asking(accelerator));
        expect(await stage.isReady()).toBe(true);
      } else {
        const pending = load(`mnet_plain_${accelerator}`, MOBILENET_PATH, base);
        const err = await loadError(`mnet_${accelerator}`, MOBILENET_PATH, asking(accelerator));
        expect(err.code).toBe(Code.Unavailable);
        expect(err.message).toContain(`gpu_execution_accelerator "${accelerator}": this onnxruntime-node has no`);
        expect(err.message).toMatch(/execution provider \(libonnxruntime_providers_(tensorrt|cuda)\.so\)/);
        expect(err.message).not.toMatch(/\/work|node_modules/);
        const plain = await pending;
        const res = await Promise.all([1, 2].map((seed) => plain.infer(imageRequest(1, seed))));
        expect(res.map((r) => r.outputs[0]!.shape)).toEqual([
          [1, 1000],
          [1, 1000],
        ]);
      }
    },
  );

  it("an accelerator Triton's ORT backend does not name is refused with the names it takes", async () => {
    const err = await loadError("mnet_bogus", MOBILENET_PATH, asking("warp_drive"));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.message).toContain('gpu_execution_accelerator "warp_drive": expected one of tensorrt, cuda');
  });
});

describe("hand-built ONNX models", () => {
  const toy = identityModel([
    { name: "a", type: "float32", shape: ["N", 4] },
    { name: "b", type: "int64", shape: ["N", 2] },
    { name: "s", type: "string", shape: ["N", 1] },
  ]);

  it("batches FP32, INT64 and BYTES requests of sizes 1..4 and splits them back exactly", async () => {
    const stage = await load(
      "toy",
      toy,
      `max_batch_size: 16
       dynamic_batching { max_queue_delay_microseconds: 5000000 preferred_batch_size: [10] }
       parameters { key: "dynamic_batching_strategy" value: { string_value: "delay" } }`,
    );
    expect(stage.config.input.map((i) => i.name)).toEqual(["a", "b", "s"]);
    const requests = [1, 2, 3, 4].map(
      (n): InferRequest => ({
        inputs: [
          tensor(
            "a",
            "FP32",
            [n, 4],
            Float32Array.from({ length: n * 4 }, (_, i) => n * 100 + i + 0.5),
          ),
          tensor(
            "b",
            "INT64",
            [n, 2],
            BigInt64Array.from({ length: n * 2 }, (_, i) => BigInt(n) * 1000000000000n + BigInt(i)),
          ),
          bytesTensor(
            "s",
            [n, 1],
            Array.from({ length: n }, (_, i) => `req${n}-item${i}`),
          ),
        ],
        outputs: n === 2 ? [{ name: "s_out" }] : undefined,
      }),
    );
    const responses = await Promise.all(requests.map((r) => stage.infer(r)));
    for (const [i, res] of responses.entries()) {
      const req = requests[i]!;
      const n = i + 1;
      if (n === 2) {
        expect(res.outputs.map((t) => t.name)).toEqual(["s_out"]);
      } else {
        const [a, b, s] = res.outputs;
        expect(a!.shape).toEqual([n, 4]);
        expect(Array.from(a!.data as Float32Array)).toEqual(Array.from(req.inputs[0]!.data as Float32Array));
        expect(Array.from(b!.data as BigInt64Array)).toEqual(Array.from(req.inputs[1]!.data as BigInt64Array));
        expect(bytesToStrings(s!)).toEqual(bytesToStrings(req.inputs[2]!));
      }
    }
    expect((await stage.statistics()).batchStats.map((b) => b.batchSize)).toEqual([10n]);
  });

  it("refuses max_batch_size on a model whose batch dimension is fixed", async () => {
    const fixed = identityModel([{ name: "a", type: "float32", shape: [1, 4] }]);
    const err = await loadError(
      "toy_fixed",
      fixed,
      `max_batch_size: 4\ninput [{ name: "a" data_type: TYPE_FP32 dims: [4] }]\noutput [{ name: "a_out" data_type: TYPE_FP32 dims: [4] }]`,
    );
    expect(err.message).toMatch(
      /input a: max_batch_size 4 needs a dynamic first dimension, but the model fixes it to 1/,
    );
    // Auto-complete leaves such a model unbatched, with its full shape in dims.
    const ok = await load("toy_fixed_auto", fixed, "");
    expect(ok.config.maxBatchSize).toBe(0);
    expect(ok.config.input[0]!.dims.map(Number)).toEqual([1, 4]);
    const res = await ok.infer({ inputs: [tensor("a", "FP32", [1, 4], Float32Array.of(1, 2, 3, 4))] });
    expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([1, 2, 3, 4]);
  });

  it("labels a synthetic model in its metadata and log", async () => {
    const synthetic = identityModel([{ name: "a", type: "float32", shape: ["N", 4] }], {
      [SYNTHETIC_METADATA_KEY]: "true",
      note: "seeded",
    });
    const dir = modelDir("toy_synth_props", synthetic);
    expect(await readOnnxMetadataProps(join(dir, "1", "model.onnx"))).toEqual({
      "trellis.synthetic": "true",
      note: "seeded",
    });
    expect(await readOnnxMetadataProps(MOBILENET_PATH)).not.toHaveProperty(SYNTHETIC_METADATA_KEY);
    const warnings: string[] = [];
    const logger: StageLogger = {
      info: () => {},
      warn: (_obj, msg) => warnings.push(String(msg)),
      error: () => {},
    };
    const stage = await createOnnxStage({
      config: parseModelConfig(`name: "toy_synth"`),
      modelDir: dir,
      version: "1",
      versionDir: join(dir, "1"),
      logger,
    });
    stages.push(stage);
    expect(stage.synthetic).toBe(true);
    expect((await stage.metadata()).platform).toBe("onnxruntime_onnx (synthetic weights)");
    expect(warnings.join("\n")).toMatch(/SYNTHETIC model/);

    const plain = await load("toy_plain", identityModel([{ name: "a", type: "float32", shape: ["N", 4] }]), "");
    expect(plain.synthetic).toBe(false);
    expect((await plain.metadata()).platform).toBe("onnxruntime_onnx");
  });

  it("autoCompleteConfig keeps sections that are present", () => {
    const config = parseModelConfig(
      `name: "x"\nmax_batch_size: 2\ninput [{ name: "a" data_type: TYPE_FP32 dims: [4] }]`,
    );
    const done = autoCompleteConfig(config, {
      inputs: [{ name: "a", type: "float32", shape: [-1, 4] }],
      outputs: [{ name: "a_out", type: "int64", shape: [-1, 7] }],
    });
    expect(done.maxBatchSize).toBe(2);
    expect(done.schedulingChoice.case).toBeUndefined();
    expect(done.output.map((o) => [o.name, o.dims.map(Number)])).toEqual([["a_out", [7]]]);
    expect(config.output).toHaveLength(0);
  });

  it("spins ORT's pool threads within a run and stops them after it by default; both are parameters", async () => {
    const config = (params: string) => parseModelConfig(`name: "spin"\n${params}`);
    const entries = (c: ReturnType<typeof config>) =>
      (sessionOptions(c, planInstances(c)[0]!, 1).extra as { session: Record<string, unknown> }).session;
    expect(entries(config(""))).toEqual({
      intra_op: { allow_spinning: "1" },
      inter_op: { allow_spinning: "1" },
      force_spinning_stop: "1",
    });
    const off = config(
      `parameters { key: "allow_spinning" value { string_value: "false" } }
       parameters { key: "force_spinning_stop" value { string_value: "FALSE" } }`,
    );
    expect(entries(off)).toEqual({
      intra_op: { allow_spinning: "0" },
      inter_op: { allow_spinning: "0" },
      force_spinning_stop: "0",
    });
    const bad = config(`parameters { key: "force_spinning_stop" value { string_value: "yes" } }`);
    let err: unknown;
    try {
      entries(bad);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.InvalidArgument);
    expect((err as StageError).message).toMatch(/parameter force_spinning_stop: expected true or false, got "yes"/);

    // ORT itself takes both settings: a stage with each loads and answers.
    for (const params of ["", `parameters { key: "allow_spinning" value { string_value: "false" } }`]) {
      const stage = await load(
        `toy_spin_${params ? "off" : "on"}`,
        identityModel([{ name: "a", type: "float32", shape: ["N", 4] }]),
        params,
      );
      const out = await stage.infer({ inputs: [tensor("a", "FP32", [1, 4], new Float32Array([1, 2, 3, 4]))] });
      expect(Array.from(out.outputs[0]!.data as Float32Array)).toEqual([1, 2, 3, 4]);
    }
  });
});

describe("Triton's reshape", () => {
  it("feeds the model reshaped tensors and answers in the config's dims, batched requests merged and split", async () => {
    // The model takes and gives [N, 12]; clients send and get [N, 3, 4].
    const flat = identityModel([{ name: "a", type: "float32", shape: ["N", 12] }]);
    const stage = await load(
      "reshaped",
      flat,
      `max_batch_size: 8
       dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [3] }
       parameters { key: "dynamic_batching_strategy" value: { string_value: "delay" } }
       input [{ name: "a" data_type: TYPE_FP32 dims: [3, 4] reshape: { shape: [12] } }]
       output [{ name: "a_out" data_type: TYPE_FP32 dims: [3, 4] reshape: { shape: [12] } }]
       model_warmup [{ name: "w" batch_size: 2 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [3, 4] random_data: true } } }]`,
    );
    const values = (n: number, base: number) => Float32Array.from({ length: n * 12 }, (_, i) => base + i);
    const [one, two] = await Promise.all([
      stage.infer({ inputs: [tensor("a", "FP32", [1, 3, 4], values(1, 100))] }),
      stage.infer({ inputs: [tensor("a", "FP32", [2, 3, 4], values(2, 200))] }),
    ]);
    expect(one.outputs[0]?.shape).toEqual([1, 3, 4]);
    expect(Array.from(one.outputs[0]?.data as Float32Array)).toEqual(Array.from(values(1, 100)));
    expect(two.outputs[0]?.shape).toEqual([2, 3, 4]);
    expect(Array.from(two.outputs[0]?.data as Float32Array)).toEqual(Array.from(values(2, 200)));
    // One execution of batch 3: the two requests ran together.
    expect(Number((await stage.statistics()).executionCount)).toBe(1);
    // Clients are held to dims, not to the model's shape.
    const flatRequest = await stage.infer({ inputs: [tensor("a", "FP32", [1, 12], values(1, 0))] }).catch((e) => e);
    expect((flatRequest as StageError).rawMessage).toMatch(
      /unexpected shape for input 'a' for model '\w+'\. Expected \[-1,3,4\], got \[1,12\]/,
    );
  });

  it("gives an unbatched model its leading 1 (dims [4], reshape [1, 4]), as Triton configs commonly do", async () => {
    const fixed = identityModel([{ name: "a", type: "float32", shape: [1, 4] }]);
    const stage = await load(
      "reshaped_fixed",
      fixed,
      `max_batch_size: 0
       input [{ name: "a" data_type: TYPE_FP32 dims: [4] reshape: { shape: [1, 4] } }]
       output [{ name: "a_out" data_type: TYPE_FP32 dims: [4] reshape: { shape: [1, 4] } }]`,
    );
    const res = await stage.infer({ inputs: [tensor("a", "FP32", [4], Float32Array.of(1, 2, 3, 4))] });
    expect(res.outputs[0]?.shape).toEqual([4]);
    expect(Array.from(res.outputs[0]?.data as Float32Array)).toEqual([1, 2, 3, 4]);
  });

  it("refuses a reshape that does not hold the same elements, or has variable dimensions, naming it", async () => {
    const flat = identityModel([{ name: "a", type: "float32", shape: ["N", 12] }]);
    const wrong = await loadError(
      "reshaped_wrong",
      flat,
      `max_batch_size: 8
       input [{ name: "a" data_type: TYPE_FP32 dims: [3, 5] reshape: { shape: [12] } }]
       output [{ name: "a_out" data_type: TYPE_FP32 dims: [12] }]`,
    );
    expect(wrong.rawMessage).toMatch(
      /input a: reshape must hold as many elements as dims \(dims \[3,5\], reshape \[12\]: 12 vs 15\)/,
    );
    const variable = await loadError(
      "reshaped_variable",
      flat,
      `max_batch_size: 8
       input [{ name: "a" data_type: TYPE_FP32 dims: [-1, 4] reshape: { shape: [12] } }]
       output [{ name: "a_out" data_type: TYPE_FP32 dims: [12] }]`,
    );
    expect(variable.rawMessage).toMatch(/input a: reshape with variable dimensions is not supported/);
  });
});
