/**
 * The load check against what Triton reports for the three GPU workflows' platforms
 * (tensorrt_plan, pytorch_libtorch, tensorflow_savedmodel), each played by a Trellis
 * stage served over real gRPC with that platform's config.
 */
import { ConnectError } from "@connectrpc/connect";
import { type ListeningServer, listenStage } from "@trellis/frontends";
import { parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { afterEach, describe, expect, it } from "vitest";
import { createTrtBridge } from "../src/index.js";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

interface Platform {
  platform: string;
  input: string;
  output: string;
  /** config.pbtxt's max_batch_size and the item dims (with -1 where the platform reports it). */
  maxBatchSize: number;
  inputDims: number[];
  outputDims: number[];
  /** The bridge's local dims for the same tensors. */
  localInputDims: number[];
}

// What Triton reports for the ResNet-50 of each workflow (FP32 in, FP32 logits out).
const PLATFORMS: Platform[] = [
  {
    platform: "tensorrt_plan",
    input: "input",
    output: "output",
    maxBatchSize: 8,
    inputDims: [3, 224, 224],
    outputDims: [1000],
    localInputDims: [3, 224, 224],
  },
  {
    platform: "pytorch_libtorch",
    input: "input__0",
    output: "output__0",
    maxBatchSize: 8,
    inputDims: [3, 224, 224],
    outputDims: [1000],
    localInputDims: [3, 224, 224],
  },
  // A SavedModel with Triton's batching: the signature's names, NHWC, spatial dims left free.
  {
    platform: "tensorflow_savedmodel",
    input: "input_1",
    output: "predictions",
    maxBatchSize: 8,
    inputDims: [-1, -1, 3],
    outputDims: [1000],
    localInputDims: [224, 224, 3],
  },
  // The same SavedModel served as autocomplete leaves it: no batching, the batch a -1 dim.
  {
    platform: "tensorflow_savedmodel",
    input: "input_1",
    output: "predictions",
    maxBatchSize: 0,
    inputDims: [-1, 224, 224, 3],
    outputDims: [-1, 1000],
    localInputDims: [224, 224, 3],
  },
];

/** A stand-in for Triton serving `p`: the platform's config and metadata, logits = per-item input sums. */
async function standIn(p: Platform): Promise<ListeningServer> {
  const config = parseModelConfig(`
name: "resnet50" platform: "${p.platform}" max_batch_size: ${p.maxBatchSize}
input [ { name: "${p.input}" data_type: TYPE_FP32 dims: [ ${p.inputDims.join(", ")} ] } ]
output [ { name: "${p.output}" data_type: TYPE_FP32 dims: [ ${p.outputDims.join(", ")} ] } ]`);
  const stage = defineStage({
    config,
    async compute(request) {
      const x = request.inputs[0]!;
      const n = x.shape[0]!;
      const per = (x.data as Float32Array).length / n;
      const out = new Float32Array(n * 1000);
      for (let b = 0; b < n; b++) {
        let sum = 0;
        for (let i = 0; i < per; i++) sum += (x.data as Float32Array)[b * per + i]!;
        out.fill(sum, b * 1000, (b + 1) * 1000);
      }
      return [tensor(p.output, "FP32", [n, 1000], out)];
    },
  });
  const server = await listenStage(stage);
  cleanup.push(() => server.close());
  return server;
}

const bridgeConfig = (p: Platform, over: { input?: string; output?: string; dims?: number[] } = {}) =>
  parseModelConfig(`
name: "resnet50_bridge" max_batch_size: 8
input [ { name: "${over.input ?? p.input}" data_type: TYPE_FP32 dims: [ ${(over.dims ?? p.localInputDims).join(", ")} ] } ]
output [ { name: "${over.output ?? p.output}" data_type: TYPE_FP32 dims: [ 1000 ] } ]`);

describe("the bridge's load check for each GPU workflow's platform", () => {
  for (const p of PLATFORMS) {
    const label = `${p.platform} (max_batch_size ${p.maxBatchSize}, ${p.input} ${JSON.stringify(p.inputDims)})`;

    it(`${label}: accepts the matching bridge config and answers through it`, async () => {
      const server = await standIn(p);
      const bridge = await createTrtBridge({ config: bridgeConfig(p), endpoint: server.url, modelName: "resnet50" });
      cleanup.push(() => bridge.close());
      const item = p.localInputDims.reduce((a, b) => a * b, 1);
      const data = new Float32Array(2 * item);
      data.fill(0.5, 0, item);
      data.fill(-0.25, item);
      const res = await bridge.infer({ inputs: [tensor(p.input, "FP32", [2, ...p.localInputDims], data)] });
      const out = res.outputs[0]!;
      expect(out.name).toBe(p.output);
      expect(out.shape).toEqual([2, 1000]);
      expect((out.data as Float32Array)[0]).toBe(0.5 * item);
      expect((out.data as Float32Array)[1000]).toBe(-0.25 * item);
    });

    it(`${label}: refuses a wrong input name, naming it and the platform's naming rule`, async () => {
      const server = await standIn(p);
      const err = await rejectionOf(
        createTrtBridge({ config: bridgeConfig(p, { input: "images" }), endpoint: server.url, modelName: "resnet50" }),
        ConnectError,
      );
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.message).toContain(`input images: expected a remote input named images, got [${p.input}]`);
      expect(err.message).toContain(`a ${p.platform} model's tensors`);
    });

    it(`${label}: refuses a wrong output name and wrong dims, with expected and got`, async () => {
      const server = await standIn(p);
      const wrongOutput = await rejectionOf(
        createTrtBridge({ config: bridgeConfig(p, { output: "logits" }), endpoint: server.url, modelName: "resnet50" }),
        ConnectError,
      );
      expect(wrongOutput.message).toContain(`output logits: expected a remote output named logits, got [${p.output}]`);
      const wrongDims = [...p.localInputDims].reverse();
      const err = await rejectionOf(
        createTrtBridge({ config: bridgeConfig(p, { dims: wrongDims }), endpoint: server.url, modelName: "resnet50" }),
        ConnectError,
      );
      expect(err.code).toBe(Code.InvalidArgument);
      const remoteShape = p.maxBatchSize > 0 ? [-1, ...p.inputDims] : p.inputDims;
      expect(err.message).toContain(
        `input ${p.input}: shape expected [${[-1, ...wrongDims].join(",")}], got [${remoteShape.join(",")}]`,
      );
    });
  }

  it("a non-batching model whose dims are fixed still refuses a batching bridge", async () => {
    const fixed: Platform = { ...PLATFORMS[1]!, maxBatchSize: 0, inputDims: [1, 3, 224, 224], outputDims: [1, 1000] };
    const server = await standIn(fixed);
    const err = await rejectionOf(
      createTrtBridge({ config: bridgeConfig(fixed), endpoint: server.url, modelName: "resnet50" }),
      ConnectError,
    );
    expect(err.message).toContain(
      "max_batch_size: expected a batching model accepting 8, got a model without batching",
    );
  });
});
