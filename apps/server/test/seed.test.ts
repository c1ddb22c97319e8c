/**
 * Acceptance on the seed's repository (models/*\/config.pbtxt) with the
 * shared MobileNetV2 as resnet50_inference: the real server process, real
 * photos, every protocol, the ensemble and each of its models.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  grpcJsInferenceClient,
  makeSeedRepository,
  readFixtureImage,
  readReferenceTensor,
  referenceTop5OnThisCpu,
  removeDir,
  type ServerProcess,
  STABLE_TOP1,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  binaryResponse,
  floats,
  grpcClientOf,
  jsonOf,
  metricValue,
  postBinary,
  postJson,
  scrape,
  unframe,
} from "./helpers.js";

/** ONNX Runtime run directly on the seed's reference tensors on this CPU (the int8 model's kernels differ between CPUs). */
const references = await referenceTop5OnThisCpu();
const photos = Object.keys(references).sort();
const photoBytes = new Map<string, Uint8Array>();
for (const p of photos) photoBytes.set(p, readFixtureImage(p));
const bytesOf = (p: string) => photoBytes.get(p) as Uint8Array;

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeSeedRepository();
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

/** The ensemble over HTTP with RAW_IMAGE in binary; the answer's OUTPUT_RESULTS strings. */
async function httpEnsemble(images: Uint8Array[], binaryOut: boolean): Promise<string[]> {
  const res = await postBinary(
    `${server.http}/v2/models/resnet50_ensemble/infer`,
    {
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [images.length, 1] }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: binaryOut } }],
    },
    [frameBytes(images)],
  );
  expect(res.status).toBe(200);
  if (!binaryOut) {
    const json = await jsonOf(res);
    expect(json.outputs[0]).toMatchObject({ name: "OUTPUT_RESULTS", datatype: "BYTES", shape: [images.length, 1] });
    return json.outputs[0].data;
  }
  const { json, outputs } = await binaryResponse(res);
  expect(json.outputs[0]).toMatchObject({ name: "OUTPUT_RESULTS", datatype: "BYTES", shape: [images.length, 1] });
  return unframe(outputs.get("OUTPUT_RESULTS") as Uint8Array);
}

async function grpcEnsemble(images: Uint8Array[]): Promise<string[]> {
  const client = grpcClientOf(server);
  const res = await client.modelInfer(
    create(ModelInferRequestSchema, {
      modelName: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [BigInt(images.length), 1n] }],
      rawInputContents: [frameBytes(images)],
    }),
  );
  expect(res.outputs[0]?.shape).toEqual([BigInt(images.length), 1n]);
  return unframe(res.rawOutputContents[0] as Uint8Array);
}

const top1 = (answer: string) => (JSON.parse(answer) as { top5_labels: string[] }).top5_labels[0];

describe("the seed ensemble", () => {
  it("classifies every fixture photo as the reference does, identically over HTTP JSON, HTTP binary and gRPC", async () => {
    const answers = new Map<string, string>();
    for (const p of photos) {
      const image = bytesOf(p);
      const [json] = await httpEnsemble([image], false);
      const [binary] = await httpEnsemble([image], true);
      const [viaGrpc] = await grpcEnsemble([image]);
      expect(binary, p).toBe(json);
      expect(viaGrpc, p).toBe(json);
      expect(top1(json as string), p).toBe(references[p]?.top5_labels[0]);
      answers.set(p, json as string);
    }
    // The README's top-1s that hold on any CPU: the real classes.
    for (const [p, { label }] of Object.entries(STABLE_TOP1)) expect(top1(answers.get(p) as string), p).toBe(label);
  });

  it("answers a batched [N,1] request per item as single requests do, over gRPC and @grpc/grpc-js", async () => {
    const images = photos.map(bytesOf);
    const batched = await grpcEnsemble(images);
    expect(batched.map(top1)).toEqual(photos.map((p) => references[p]?.top5_labels[0]));
    expect(await httpEnsemble(images, true)).toEqual(batched);

    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    const res = await client.modelInfer({
      model_name: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [images.length, 1] }],
      raw_input_contents: [Buffer.from(frameBytes(images))],
    });
    expect(unframe(new Uint8Array((res.raw_output_contents as Buffer[])[0] as Buffer))).toEqual(batched);
    client.close();
  });

  it("serves concurrent clients on all protocols, and the metrics count exactly the requests sent", async () => {
    const before = await scrape(server);
    const chelsea = bytesOf("chelsea.jpg");
    const coffee = bytesOf("coffee.jpg");
    const calls = Array.from({ length: 12 }, (_, i) => {
      const images = i % 2 === 0 ? [chelsea] : [coffee, chelsea];
      const run = i % 3 === 0 ? grpcEnsemble(images) : httpEnsemble(images, i % 3 === 1);
      return run.then((answers) => ({ images, answers }));
    });
    const results = await Promise.all(calls);
    let items = 0;
    for (const { images, answers } of results) {
      items += images.length;
      expect(answers.map(top1)).toEqual(images.map((im) => (im === chelsea ? "Egyptian cat" : "espresso")));
    }
    const after = await scrape(server);
    const delta = (name: string, model: string) => metricValue(after, name, model) - metricValue(before, name, model);
    expect(delta("nv_inference_request_success", "resnet50_ensemble")).toBe(12);
    expect(delta("nv_inference_request_failure", "resnet50_ensemble")).toBe(0);
    expect(delta("nv_inference_count", "resnet50_ensemble")).toBe(items);
    expect(delta("nv_inference_count", "resnet50_inference")).toBe(items);
    expect(delta("nv_inference_count", "resnet50_preprocess")).toBe(items);

    const client = grpcClientOf(server);
    const { modelStats } = await client.modelStatistics({});
    for (const model of ["resnet50_ensemble", "resnet50_preprocess", "resnet50_inference", "resnet50_postprocess"]) {
      const s = modelStats.find((m) => m.name === model);
      expect(Number(s?.inferenceStats?.success?.count), model).toBe(
        metricValue(after, "nv_inference_request_success", model),
      );
      expect(Number(s?.inferenceCount), model).toBe(metricValue(after, "nv_inference_count", model));
      expect(Number(s?.executionCount), model).toBe(metricValue(after, "nv_inference_exec_count", model));
    }
  });
});

describe("each seed model on its own", () => {
  it("preprocess: image bytes to the reference FP32 [1,3,224,224] tensor", async () => {
    const res = await postBinary(
      `${server.http}/v2/models/resnet50_preprocess/infer`,
      {
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
        parameters: { binary_data_output: true },
      },
      [frameBytes([bytesOf("chelsea.jpg")])],
    );
    const { json, outputs } = await binaryResponse(res);
    expect(json.outputs[0]).toMatchObject({ name: "PREPROCESSED_IMAGE", datatype: "FP32", shape: [1, 3, 224, 224] });
    const got = new Float32Array((outputs.get("PREPROCESSED_IMAGE") as Uint8Array).buffer);
    const want = readReferenceTensor("chelsea.jpg");
    let maxDiff = 0;
    for (let i = 0; i < want.length; i++)
      maxDiff = Math.max(maxDiff, Math.abs((got[i] as number) - (want[i] as number)));
    expect(maxDiff).toBeLessThan(0.05);
  });

  it("inference: the reference tensor as JSON gives the same logits as over gRPC, argmax = reference top-1", async () => {
    const tensor = readReferenceTensor("coffee.jpg");
    const { status, json } = await postJson(`${server.http}/v2/models/resnet50_inference/infer`, {
      inputs: [{ name: "input", datatype: "FP32", shape: [1, 3, 224, 224], data: Array.from(tensor) }],
    });
    expect(status).toBe(200);
    expect(json.outputs[0]).toMatchObject({ name: "output", datatype: "FP32", shape: [1, 1000] });
    const logits = json.outputs[0].data as number[];
    expect(logits.indexOf(Math.max(...logits))).toBe(references["coffee.jpg"]?.top5_index[0]);

    const client = grpcClientOf(server);
    const res = await client.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: "resnet50_inference",
        inputs: [{ name: "input", datatype: "FP32", shape: [1n, 3n, 224n, 224n] }],
        rawInputContents: [new Uint8Array(tensor.buffer)],
      }),
    );
    expect([...floats(res.rawOutputContents[0] as Uint8Array)]).toEqual(logits);
  });

  it("postprocess: logits to the top-5 JSON; classification of its BYTES output refused, as Triton", async () => {
    const logits = Array.from({ length: 1000 }, (_, i) => (i === 285 ? 9 : i === 281 ? 7 : 0));
    const plain = await postJson(`${server.http}/v2/models/resnet50_postprocess/infer`, {
      inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1, 1000], data: logits }],
    });
    expect(plain.status).toBe(200);
    expect(top1(plain.json.outputs[0].data[0])).toBe("Egyptian cat");
    // Triton classifies the output the model answers with, and refuses BYTES (server src/classification.cc).
    const classified = await postJson(`${server.http}/v2/models/resnet50_postprocess/infer`, {
      inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1, 1000], data: logits }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { classification: 2 } }],
    });
    expect(classified.status).toBe(400);
    expect(classified.json.error).toContain("class result not available for output due to unsupported type 'BYTES'");
  });

  it("rejects a truncated JPEG with 400 naming the problem, and counts it as a failure", async () => {
    const before = await scrape(server);
    const bad = readFixtureImage(TRUNCATED_PHOTO);
    const client = grpcClientOf(server);
    const err = await client
      .modelInfer(
        create(ModelInferRequestSchema, {
          modelName: "resnet50_ensemble",
          inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
          rawInputContents: [frameBytes([bad])],
        }),
      )
      .catch((e: Error) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toMatch(
      /^resnet50_ensemble: step 0 resnet50_preprocess: INVALID_ARGUMENT: input RAW_IMAGE element 0: truncated or corrupt jpeg/,
    );
    const overHttp = await postBinary(
      `${server.http}/v2/models/resnet50_ensemble/infer`,
      { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([bad])],
    );
    expect(overHttp.status).toBe(400);
    expect((await jsonOf(overHttp)).error).toMatch(/^resnet50_ensemble: step 0 resnet50_preprocess: INVALID_ARGUMENT/);
    const after = await scrape(server);
    expect(
      metricValue(after, "nv_inference_request_failure", "resnet50_ensemble") -
        metricValue(before, "nv_inference_request_failure", "resnet50_ensemble"),
    ).toBe(2);
  });
});
