/**
 * Issue 22 item 3: get_model_config (HTTP GET /v2/models/{m}/config and gRPC ModelConfig)
 * answers the config as Triton's core leaves it after loading, on both protocols.
 *
 * The expected answers are written here from Triton's rules:
 * - triton-inference-server/core src/model_config_utils.cc
 *   - AutoCompleteBackendFields: `backend` from `platform` (and back), `default_model_filename`
 *     ("model.onnx" for onnxruntime), the name from the model's folder;
 *   - NormalizeModelConfig: `version_policy` latest { num_versions: 1 } when absent; an empty
 *     dynamic_batching / sequence_batching.oldest preferred_batch_size becomes [max_batch_size];
 *     max_sequence_idle_microseconds 0 becomes 1000000 (SEQUENCE_IDLE_DEFAULT_MICROSECONDS,
 *     src/constants.h); `optimization` gets input/output_pinned_memory { enable: true }, except
 *     in ensembles;
 *   - NormalizeInstanceGroup: no group → one named after the model; an unnamed group is named
 *     `<model>_<index>`; KIND_AUTO without GPUs → KIND_CPU; count 0 → the default; ensembles
 *     keep none;
 *   - ModelConfigToJson: protobuf's JSON with preserve_proto_field_names and
 *     always_print_primitive_fields, then exactly these 64-bit fields turned from strings into
 *     numbers: input/output dims and reshape shape, version_policy.specific.versions,
 *     dynamic_batching max_queue_delay_microseconds / priority_levels / default_priority_level /
 *     default_timeout_microseconds of its queue policies, sequence_batching
 *     max_sequence_idle_microseconds, oldest/direct max_queue_delay_microseconds, state dims,
 *     ensemble step model_version and model_warmup input dims. Map keys stay strings, and so do
 *     state initial_state dims (the code looks for "initial_state" on sequence_batching itself,
 *     finds none and leaves them).
 * - triton-inference-server/server qa/L0_model_config/autofill_noplatform_success/onnx/
 *   {cpu_instance,no_config_no_batch}/expected: what those rules give for ONNX models.
 *   A CPU group without a count reads (and runs) 2 for onnxruntime and tensorflow models,
 *   Triton's SetDefaultInstanceCount (default_cpu_instance_count), and 1 for the others.
 */
import { fromJson, type JsonObject, type JsonValue, toJson } from "@bufbuild/protobuf";
import { ModelConfigSchema } from "@trellis/protocol";
import {
  ACCUMULATOR_CONFIG,
  accumulatorModel,
  identityModel,
  makeSeedRepository,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addModel, explicitModels, grpcClientOf, jsonOf } from "./helpers.js";

// What protobuf's printer writes for each message with every implicit field shown.
const input = (name: string, dataType: string, dims: number[]) => ({
  name,
  data_type: dataType,
  format: "FORMAT_NONE",
  dims,
  is_shape_tensor: false,
  allow_ragged_batch: false,
  optional: false,
});
const output = (name: string, dataType: string, dims: number[]) => ({
  name,
  data_type: dataType,
  dims,
  label_filename: "",
  is_shape_tensor: false,
});
const group = (name: string, kind: string, count: number) => ({
  name,
  kind,
  count,
  gpus: [],
  secondary_devices: [],
  profile: [],
  passive: false,
  host_policy: "",
});
const step = (model: string, inputMap: Record<string, string>, outputMap: Record<string, string>) => ({
  model_name: model,
  model_version: -1,
  input_map: inputMap,
  output_map: outputMap,
  model_namespace: "",
});
/** NormalizeModelConfig's optimization block (pinned memory on), the rest at protobuf defaults. */
const OPTIMIZATION = {
  priority: "PRIORITY_DEFAULT",
  input_pinned_memory: { enable: true },
  output_pinned_memory: { enable: true },
  gather_kernel_buffer_threshold: 0,
  eager_batching: false,
};
const LATEST_1 = { latest: { num_versions: 1 } };
const SEED_BATCHING = {
  preferred_batch_size: [16, 32, 64, 128, 256],
  // The repository's models/ hold no request for a fuller batch (see their config.pbtxt).
  max_queue_delay_microseconds: 0,
  preserve_ordering: false,
  priority_levels: 0,
  default_priority_level: 0,
  priority_queue_policy: {},
};
/** Fields every config prints (always_print_primitive_fields), empty in these models. */
const EMPTY = {
  runtime: "",
  batch_input: [],
  batch_output: [],
  cc_model_filenames: {},
  metric_tags: {},
  model_warmup: [],
};

const SEED_EXPECTED: Record<string, JsonObject> = {
  resnet50_inference: {
    ...EMPTY,
    name: "resnet50_inference",
    platform: "onnxruntime_onnx",
    backend: "onnxruntime",
    version_policy: LATEST_1,
    max_batch_size: 256,
    input: [input("input", "TYPE_FP32", [3, 224, 224])],
    output: [output("output", "TYPE_FP32", [1000])],
    optimization: OPTIMIZATION,
    dynamic_batching: SEED_BATCHING,
    instance_group: [group("resnet50_inference_0", "KIND_CPU", 1)],
    default_model_filename: "model.onnx",
    parameters: {},
  },
  resnet50_preprocess: {
    ...EMPTY,
    name: "resnet50_preprocess",
    platform: "",
    backend: "typescript",
    version_policy: LATEST_1,
    max_batch_size: 256,
    input: [input("RAW_IMAGE", "TYPE_STRING", [1])],
    output: [output("PREPROCESSED_IMAGE", "TYPE_FP32", [3, 224, 224])],
    optimization: OPTIMIZATION,
    dynamic_batching: SEED_BATCHING,
    instance_group: [group("resnet50_preprocess_0", "KIND_CPU", 2)],
    // A backend Triton does not know: AutoCompleteBackendFields fills nothing.
    default_model_filename: "",
    parameters: { module: { string_value: "@trellis/preprocess" } },
  },
  resnet50_postprocess: {
    ...EMPTY,
    name: "resnet50_postprocess",
    platform: "",
    backend: "typescript",
    version_policy: LATEST_1,
    max_batch_size: 256,
    input: [input("LOGITS", "TYPE_FP32", [1000])],
    output: [output("OUTPUT_RESULTS", "TYPE_STRING", [1])],
    optimization: OPTIMIZATION,
    dynamic_batching: SEED_BATCHING,
    instance_group: [group("resnet50_postprocess_0", "KIND_CPU", 1)],
    default_model_filename: "",
    parameters: { module: { string_value: "@trellis/postprocess" } },
  },
  // An ensemble: no instance_group, no optimization block (NormalizeModelConfig and
  // NormalizeInstanceGroup both skip ensemble_scheduling), model_version a number.
  resnet50_ensemble: {
    ...EMPTY,
    name: "resnet50_ensemble",
    platform: "ensemble",
    backend: "",
    version_policy: LATEST_1,
    max_batch_size: 256,
    input: [input("RAW_IMAGE", "TYPE_STRING", [1])],
    output: [output("OUTPUT_RESULTS", "TYPE_STRING", [1])],
    ensemble_scheduling: {
      step: [
        step("resnet50_preprocess", { RAW_IMAGE: "RAW_IMAGE" }, { PREPROCESSED_IMAGE: "preprocessed_image" }),
        step("resnet50_inference", { input: "preprocessed_image" }, { output: "logits" }),
        step("resnet50_postprocess", { LOGITS: "logits" }, { OUTPUT_RESULTS: "OUTPUT_RESULTS" }),
      ],
      max_inflight_requests: 0,
    },
    instance_group: [],
    default_model_filename: "",
    parameters: {},
  },
};

/** Only `platform` (no name, no backend), priority levels and queue policies, two groups, a warmup. */
const TINY_CONFIG = `platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy { specific { versions: [ 1 ] } }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "X_out" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { max_queue_size: 16 }
  priority_queue_policy { key: 2 value { timeout_action: DELAY default_timeout_microseconds: 2000000 allow_timeout_override: true max_queue_size: 4 } }
}
instance_group [ { kind: KIND_CPU }, { name: "extra" count: 1 kind: KIND_AUTO } ]
model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
`;

const TINY_EXPECTED: JsonObject = {
  ...EMPTY,
  name: "tiny",
  platform: "onnxruntime_onnx",
  backend: "onnxruntime",
  version_policy: { specific: { versions: [1] } },
  max_batch_size: 8,
  input: [input("X", "TYPE_FP32", [4])],
  output: [output("X_out", "TYPE_FP32", [4])],
  optimization: OPTIMIZATION,
  dynamic_batching: {
    preferred_batch_size: [8],
    max_queue_delay_microseconds: 500,
    preserve_ordering: false,
    priority_levels: 2,
    default_priority_level: 1,
    default_queue_policy: {
      timeout_action: "REJECT",
      default_timeout_microseconds: 0,
      allow_timeout_override: false,
      max_queue_size: 16,
    },
    // The key stays a string (a JSON object key); the policy's timeout becomes a number.
    priority_queue_policy: {
      "2": {
        timeout_action: "DELAY",
        default_timeout_microseconds: 2000000,
        allow_timeout_override: true,
        max_queue_size: 4,
      },
    },
  },
  // Without a count an onnxruntime CPU group gets Triton's default, 2; "extra" keeps its own.
  instance_group: [group("tiny_0", "KIND_CPU", 2), group("extra", "KIND_CPU", 1)],
  default_model_filename: "model.onnx",
  parameters: {},
  model_warmup: [
    { name: "zeros", batch_size: 1, inputs: { X: { data_type: "TYPE_FP32", dims: [4], zero_data: true } }, count: 0 },
  ],
};

/** @trellis/testing's ACCUMULATOR_CONFIG: `backend` only, sequence_batching.oldest, implicit state. */
const ACCUMULATOR_EXPECTED: JsonObject = {
  ...EMPTY,
  name: "accumulator",
  platform: "onnxruntime_onnx",
  backend: "onnxruntime",
  version_policy: LATEST_1,
  max_batch_size: 8,
  input: [input("INPUT", "TYPE_FP32", [1])],
  output: [
    output("OUTPUT", "TYPE_FP32", [1]),
    output("START_SEEN", "TYPE_FP32", [1]),
    output("CORRID_SEEN", "TYPE_UINT64", [1]),
  ],
  optimization: OPTIMIZATION,
  sequence_batching: {
    oldest: {
      max_candidate_sequences: 8,
      preferred_batch_size: [8],
      max_queue_delay_microseconds: 0,
      preserve_ordering: false,
    },
    max_sequence_idle_microseconds: 1000000,
    control_input: [
      {
        name: "START",
        control: [
          {
            kind: "CONTROL_SEQUENCE_START",
            int32_false_true: [],
            fp32_false_true: [0, 1],
            bool_false_true: [],
            data_type: "TYPE_INVALID",
          },
        ],
      },
      {
        name: "CORRID",
        control: [
          {
            kind: "CONTROL_SEQUENCE_CORRID",
            int32_false_true: [],
            fp32_false_true: [],
            bool_false_true: [],
            data_type: "TYPE_UINT64",
          },
        ],
      },
    ],
    state: [
      {
        input_name: "STATE_IN",
        output_name: "STATE_OUT",
        data_type: "TYPE_FP32",
        dims: [1],
        // Left as protobuf writes int64: ModelConfigToJson misses these (see above).
        initial_state: [{ data_type: "TYPE_FP32", dims: ["1"], zero_data: true, name: "zero" }],
        use_same_buffer_for_input_output: false,
        use_growable_memory: false,
      },
    ],
    iterative_sequence: false,
  },
  // No instance_group: one group named after the model, Triton's default count for onnxruntime.
  instance_group: [group("accumulator", "KIND_CPU", 2)],
  default_model_filename: "model.onnx",
  parameters: {},
};

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeSeedRepository({ prefix: "trellis-parity-config-" });
  await addModel(repo, "tiny", {
    config: TINY_CONFIG,
    files: { "1/model.onnx": identityModel([{ name: "X", type: "float32", shape: ["N", 4] }]) },
  });
  await addModel(repo, "accumulator", { config: ACCUMULATOR_CONFIG, files: { "1/model.onnx": accumulatorModel() } });
  server = await startServerProcess([...explicitModels(repo), "--load-model", "*"]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const EXPECTED: Record<string, JsonObject> = {
  ...SEED_EXPECTED,
  tiny: TINY_EXPECTED,
  accumulator: ACCUMULATOR_EXPECTED,
};

/** A config message as protobuf-es prints it, so the gRPC answer compares with the expected one field by field. */
const printed = (json: JsonValue) =>
  toJson(ModelConfigSchema, fromJson(ModelConfigSchema, json), { useProtoFieldName: true, alwaysEmitImplicit: true });

describe("get_model_config answers the config as Triton normalizes it", () => {
  for (const [model, expected] of Object.entries(EXPECTED)) {
    it(`${model}: HTTP GET /v2/models/${model}/config is Triton's JSON`, async () => {
      const res = await fetch(`${server.http}/v2/models/${model}/config`);
      expect(res.status).toBe(200);
      expect(await jsonOf(res)).toEqual(expected);
      // The same for the version asked by number.
      expect(await jsonOf(await fetch(`${server.http}/v2/models/${model}/versions/1/config`))).toEqual(expected);
    });

    it(`${model}: gRPC ModelConfig is the same config`, async () => {
      const client = grpcClientOf(server);
      const { config } = await client.modelConfig({ name: model, version: "" });
      expect(config).toBeDefined();
      const got = toJson(ModelConfigSchema, config ?? fromJson(ModelConfigSchema, {}), {
        useProtoFieldName: true,
        alwaysEmitImplicit: true,
      });
      expect(got).toEqual(printed(expected));
    });
  }

  it("a config read from the server loads back unchanged (tritonclient's read-edit-load)", async () => {
    const read = await jsonOf(await fetch(`${server.http}/v2/models/tiny/config`));
    const load = await fetch(`${server.http}/v2/repository/models/tiny/load`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ parameters: { config: JSON.stringify(read) } }),
    });
    expect(load.status).toBe(200);
    expect(await jsonOf(await fetch(`${server.http}/v2/models/tiny/config`))).toEqual(TINY_EXPECTED);
    const infer = await fetch(`${server.http}/v2/models/tiny/infer`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ inputs: [{ name: "X", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
    });
    expect(infer.status).toBe(200);
    expect((await jsonOf(infer)).outputs[0].data).toEqual([1, 2, 3, 4]);
  });
});
