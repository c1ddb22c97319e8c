import { mkdtemp, readdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  DataType,
  loadModelConfig,
  ModelConfigError,
  ModelInstanceGroup_Kind,
  ModelQueuePolicy_TimeoutAction,
  parseModelConfigJson,
} from "../src/index.js";

const repo = join(import.meta.dirname, "../../../models");

describe("loadModelConfig on the seed's repository", () => {
  it("finds the four seed models", async () => {
    const names = (await readdir(repo)).filter((n) => n.startsWith("resnet50_")).sort();
    expect(names).toEqual(["resnet50_ensemble", "resnet50_inference", "resnet50_postprocess", "resnet50_preprocess"]);
  });

  it("parses preprocess: TYPE_STRING RAW_IMAGE [1] -> FP32 [3,224,224], batching as the seed", async () => {
    const c = await loadModelConfig(join(repo, "resnet50_preprocess/config.pbtxt"));
    expect(c.name).toBe("resnet50_preprocess");
    expect(c.maxBatchSize).toBe(256);
    expect(c.input[0]?.name).toBe("RAW_IMAGE");
    expect(c.input[0]?.dataType).toBe(DataType.TYPE_STRING);
    expect(c.input[0]?.dims).toEqual([1n]);
    expect(c.output[0]?.dataType).toBe(DataType.TYPE_FP32);
    expect(c.output[0]?.dims).toEqual([3n, 224n, 224n]);
    expect(c.schedulingChoice.case).toBe("dynamicBatching");
    const db = c.schedulingChoice.case === "dynamicBatching" ? c.schedulingChoice.value : undefined;
    expect(db?.preferredBatchSize).toEqual([16, 32, 64, 128, 256]);
    // The repository's models/ hold no lone request for a fuller batch (see their config.pbtxt).
    expect(db?.maxQueueDelayMicroseconds).toBe(0n);
    expect(c.instanceGroup[0]?.kind).toBe(ModelInstanceGroup_Kind.CPU);
    expect(c.parameters.module?.stringValue).toBe("@trellis/preprocess");
  });

  it("parses inference and postprocess", async () => {
    const inf = await loadModelConfig(join(repo, "resnet50_inference/config.pbtxt"));
    expect(inf.platform).toBe("onnxruntime_onnx");
    expect(inf.output[0]?.dims).toEqual([1000n]);
    const post = await loadModelConfig(join(repo, "resnet50_postprocess/config.pbtxt"));
    expect(post.input[0]?.name).toBe("LOGITS");
    expect(post.output[0]?.name).toBe("OUTPUT_RESULTS");
    expect(post.output[0]?.dataType).toBe(DataType.TYPE_STRING);
  });

  it("parses the ensemble's three steps and their maps", async () => {
    const c = await loadModelConfig(join(repo, "resnet50_ensemble/config.pbtxt"));
    expect(c.platform).toBe("ensemble");
    expect(c.schedulingChoice.case).toBe("ensembleScheduling");
    const steps = c.schedulingChoice.case === "ensembleScheduling" ? c.schedulingChoice.value.step : [];
    expect(steps.map((s) => s.modelName)).toEqual([
      "resnet50_preprocess",
      "resnet50_inference",
      "resnet50_postprocess",
    ]);
    expect(steps[1]?.modelVersion).toBe(-1n);
    expect(steps[1]?.inputMap).toEqual({ input: "preprocessed_image" });
    expect(steps[1]?.outputMap).toEqual({ output: "logits" });
  });
});

describe("loadModelConfig on every feature", () => {
  it("parses version policy, reshape, instance groups, queue policies, warmup, cache", async () => {
    const c = await loadModelConfig(join(import.meta.dirname, "fixtures/every-feature.pbtxt"));
    expect(c.versionPolicy?.policyChoice.case).toBe("latest");
    expect(c.defaultModelFilename).toBe("resnet.onnx");
    expect(c.input[0]?.dims).toEqual([3n, -1n, -1n]);
    expect(c.input[0]?.reshape?.shape).toEqual([3n, 224n, 224n]);
    expect(c.output[0]?.labelFilename).toBe("labels.txt");
    expect(c.instanceGroup.map((g) => g.count)).toEqual([2, 1]);
    expect(c.instanceGroup[1]?.gpus).toEqual([0, 1]);
    const db = c.schedulingChoice.case === "dynamicBatching" ? c.schedulingChoice.value : undefined;
    expect(db?.priorityLevels).toBe(2n);
    expect(db?.defaultQueuePolicy?.timeoutAction).toBe(ModelQueuePolicy_TimeoutAction.DELAY);
    expect(db?.defaultQueuePolicy?.maxQueueSize).toBe(16);
    expect(db?.priorityQueuePolicy["1"]?.maxQueueSize).toBe(4);
    expect(c.optimization?.executionAccelerators?.gpuExecutionAccelerator[0]?.name).toBe("tensorrt");
    expect(c.parameters.intra_op_thread_count?.stringValue).toBe("2");
    expect(c.modelWarmup).toHaveLength(2);
    expect(c.modelWarmup[0]?.inputs.input?.inputDataType.case).toBe("zeroData");
    expect(c.responseCache?.enable).toBe(true);
  });
});

describe("malformed config.pbtxt", () => {
  async function write(text: string): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), "trellis-config-"));
    const path = join(dir, "config.pbtxt");
    await writeFile(path, text);
    return path;
  }

  it("reports path:line:col of an unknown field", async () => {
    const path = await write('name: "m"\nmax_batch_size: 8\n  bogus_field: 3\n');
    const err = await loadModelConfig(path).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ModelConfigError);
    expect((err as ModelConfigError).message).toBe(
      `${path}:3:3: unknown field "bogus_field" for message inference.ModelConfig`,
    );
  });

  it("reports path:line:col of a bad value", async () => {
    const path = await write('name: "m"\nmax_batch_size: eight\n');
    const err = (await loadModelConfig(path).catch((e: unknown) => e)) as ModelConfigError;
    expect(err.line).toBe(2);
    expect(err.column).toBe(17);
    expect(err.message).toContain(`${path}:2:17:`);
  });

  it("reports an unclosed block at the end of the file", async () => {
    const path = await write('name: "m"\ninput [\n  { name: "x"\n');
    const err = (await loadModelConfig(path).catch((e: unknown) => e)) as ModelConfigError;
    expect(err).toBeInstanceOf(ModelConfigError);
    expect(err.line).toBeGreaterThanOrEqual(3);
    expect(err.reason).toMatch(/end of input/);
  });
});

describe("parseModelConfigJson (a load request's 'config' parameter)", () => {
  it("reads Triton's JSON form (snake_case, int64 as numbers) and protobuf's (camelCase, int64 as strings) alike", () => {
    const triton = parseModelConfigJson(
      JSON.stringify({
        name: "m",
        max_batch_size: 8,
        input: [{ name: "x", data_type: "TYPE_FP32", dims: [3, 224, 224] }],
        dynamic_batching: { max_queue_delay_microseconds: 100 },
        parameters: { scale: { string_value: "2" } },
      }),
    );
    const camel = parseModelConfigJson(
      JSON.stringify({
        name: "m",
        maxBatchSize: 8,
        input: [{ name: "x", dataType: "TYPE_FP32", dims: ["3", "224", "224"] }],
        dynamicBatching: { maxQueueDelayMicroseconds: "100" },
        parameters: { scale: { stringValue: "2" } },
      }),
    );
    expect(triton).toEqual(camel);
    expect(triton.input[0]?.dims).toEqual([3n, 224n, 224n]);
    expect(triton.schedulingChoice).toMatchObject({
      case: "dynamicBatching",
      value: { maxQueueDelayMicroseconds: 100n },
    });
  });

  it("names the source and the fault", () => {
    expect(() => parseModelConfigJson("{nope", "the config")).toThrow(/^the config is not JSON: /);
    expect(() => parseModelConfigJson('{"max_batch_size": "many"}', "the config")).toThrow(
      /^the config is not a model config: .*max_batch_size/,
    );
    expect(() => parseModelConfigJson('{"no_such_field": 1}', "the config")).toThrow(/no_such_field/);
  });
});
