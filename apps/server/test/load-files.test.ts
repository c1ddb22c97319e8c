/**
 * Triton's load with file overrides, black-box: a model that is not in the
 * repository, deployed through the load API alone (its config as JSON, its
 * ONNX file as a "file:1/model.onnx" parameter: base64 over HTTP, bytes over gRPC).
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, type ConnectError } from "@connectrpc/connect";
import {
  MOBILENET_PATH,
  readReferenceTensor,
  referenceTop5OnThisCpu,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { binaryResponse, echoConfig, floats, grpcClientOf, makeRepository, postBinary, postJson } from "./helpers.js";

/** The shared MobileNetV2 as Triton's JSON config: what a client sends instead of a config.pbtxt. */
const MOBILENET_CONFIG = JSON.stringify({
  name: "mobilenet",
  platform: "onnxruntime_onnx",
  max_batch_size: 4,
  input: [{ name: "input", data_type: "TYPE_FP32", dims: [3, 224, 224] }],
  output: [{ name: "output", data_type: "TYPE_FP32", dims: [1000] }],
});

/** ONNX Runtime run directly on this CPU: the int8 model's kernels differ between CPUs. */
const references = await referenceTop5OnThisCpu();
// A photo whose top-1 holds on every CPU seen (STABLE_TOP1), so thread counts and batch sizes that
// change the int8 kernels' last bits on some CPUs cannot change it.
const photo = "chelsea.jpg";
const expectedTop1 = references[photo]?.top5_index[0];

/** Temporary model folders of this test's model still on disk (other tests' loads are theirs). */
const leftovers = () =>
  readdirSync(tmpdir()).filter((n) => n.startsWith("trellis-load-") && existsSync(join(tmpdir(), n, "mobilenet")));

describe("load with file overrides", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    server = await startServerProcess(["--model-repository", repo, "--model-control-mode", "explicit"]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  /** The model's top-1 class for the reference photo's preprocessed tensor, over HTTP binary. */
  async function top1(): Promise<number> {
    const res = await postBinary(
      `${server.http}/v2/models/mobilenet/infer`,
      {
        inputs: [{ name: "input", datatype: "FP32", shape: [1, 3, 224, 224] }],
        outputs: [{ name: "output", parameters: { binary_data: true } }],
      },
      [new Uint8Array(readReferenceTensor(photo).buffer)],
    );
    expect(res.status).toBe(200);
    const logits = floats((await binaryResponse(res)).outputs.get("output") as Uint8Array);
    return logits.indexOf(Math.max(...logits));
  }

  it("deploys a model the repository does not have, over HTTP then gRPC, and leaves no files behind", async () => {
    const model = readFileSync(MOBILENET_PATH);
    const http = await postJson(`${server.http}/v2/repository/models/mobilenet/load`, {
      parameters: { config: MOBILENET_CONFIG, "file:1/model.onnx": model.toString("base64") },
    });
    expect(http.status, JSON.stringify(http.json)).toBe(200);
    expect(await top1()).toBe(expectedTop1);

    // gRPC: the file as bytes; a reload into version 2, which the latest policy then serves.
    const client = grpcClientOf(server);
    await client.repositoryModelLoad({
      modelName: "mobilenet",
      parameters: {
        config: { parameterChoice: { case: "stringParam", value: MOBILENET_CONFIG } },
        "file:2/model.onnx": { parameterChoice: { case: "bytesParam", value: model } },
      },
    });
    const index = await client.repositoryIndex({});
    // Version 1 is not in the new folder: unloaded, as a version removed from a repository is.
    expect(index.models.filter((m) => m.name === "mobilenet").map((m) => [m.version, m.state])).toEqual([
      ["1", "UNAVAILABLE"],
      ["2", "READY"],
    ]);
    expect(await top1()).toBe(expectedTop1);
    expect(leftovers()).toEqual([]);

    // Not in the repository: a plain load has nothing to load it from.
    const plain = await postJson(`${server.http}/v2/repository/models/mobilenet/load`, {});
    // Triton's INTERNAL "failed to poll from model repository" (qa/L0_lifecycle/lifecycle_test.py).
    expect(plain.status).toBe(500);
    expect(await top1()).toBe(expectedTop1); // the loaded one goes on serving
  });

  it("refuses overrides it cannot use, naming them, and writes nothing", async () => {
    const load = (parameters: Record<string, unknown>) =>
      postJson(`${server.http}/v2/repository/models/mobilenet/load`, { parameters });
    const onnx = Buffer.from("not an onnx file").toString("base64");
    // Triton: INTERNAL, its poll failing (qa/L0_lifecycle/lifecycle_test.py test_file_override).
    expect(await load({ "file:1/model.onnx": onnx })).toEqual({
      status: 500,
      json: {
        error:
          "failed to load 'mobilenet', failed to poll from model repository: Load parameter 'config' must be specified for model file override (the model config as JSON)",
      },
    });
    expect(await load({ config: MOBILENET_CONFIG, "file:../escape/model.onnx": onnx })).toEqual({
      status: 400,
      json: {
        error:
          "failed to load 'mobilenet': file override 'file:../escape/model.onnx' must be a path inside the model's folder",
      },
    });
    expect(await load({ config: MOBILENET_CONFIG, "file:1/model.onnx": "not base64!" })).toEqual({
      status: 400,
      json: {
        error: `load parameter 'file:1/model.onnx' must be the file's content (bytes; base64 in JSON), got "not base64!"`,
      },
    });
    const broken = await load({ config: MOBILENET_CONFIG, "file:1/model.onnx": onnx });
    expect(broken.status).toBe(400);
    expect(broken.json.error).toMatch(/^failed to load 'mobilenet': .*onnxruntime could not load/);

    const client = grpcClientOf(server);
    const asString = await client
      .repositoryModelLoad({
        modelName: "mobilenet",
        parameters: {
          config: { parameterChoice: { case: "stringParam", value: MOBILENET_CONFIG } },
          "file:1/model.onnx": { parameterChoice: { case: "stringParam", value: "AAAA" } },
        },
      })
      .catch((e: ConnectError) => e);
    expect((asString as ConnectError).code).toBe(Code.InvalidArgument);
    expect((asString as ConnectError).rawMessage).toBe(
      `load parameter 'file:1/model.onnx' must be the file's content (bytes; base64 in JSON), got "AAAA"`,
    );
    expect(leftovers()).toEqual([]);
  });
});
