/**
 * Triton's words and codes for model names a load or unload refuses (core's ValidateModelName:
 * empty or whitespace-only, '..' or a '/') and for a string input whose elements do not match its
 * shape (core's infer_request.cc string input checks), over gRPC with an ONNX identity model built
 * here, each refused while a good request is in flight.
 */
import { request } from "node:http";
import { Code, ConnectError } from "@connectrpc/connect";
import type { ModelInferRequest } from "@trellis/protocol";
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { explicitModels, grpcClientOf, makeRepository } from "./helpers.js";

const CONFIG = `name: "words"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "IN_out" data_type: TYPE_STRING dims: [ -1 ] } ]
`;

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    words: { config: CONFIG, files: { "1/model.onnx": identityModel([{ name: "IN", type: "string", shape: ["N"] }]) } },
  });
  server = await startServerProcess(explicitModels(repo, "words"));
});

afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

/** `items` framed as KServe BYTES, then `tail` (raw bytes) after them. */
function framed(items: string[], tail: number[] = []): Uint8Array {
  const parts = items.flatMap((s) => {
    const b = Buffer.from(s);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(b.length);
    return [len, b];
  });
  return Buffer.concat([...parts, Buffer.from(tail)]);
}

const infer = (raw: Uint8Array, count: number, id = "") =>
  grpcClientOf(server).modelInfer({
    modelName: "words",
    id,
    inputs: [{ name: "IN", datatype: "BYTES", shape: [BigInt(count)] }] as ModelInferRequest["inputs"],
    rawInputContents: [raw],
  });

/** A POST sent with its path exactly as given. */
function rawPost(path: string): Promise<{ status: number; body: string }> {
  const { hostname, port } = new URL(server.http);
  return new Promise((resolve, reject) => {
    const req = request({ host: hostname, port, path, method: "POST" }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        body += c;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

const refusal = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );

describe("model names a load or unload refuses, in Triton's words", () => {
  const cases: [string, string][] = [
    ["", "Model name cannot be empty. Please enter a valid name to deploy."],
    ["   ", "Model name cannot be empty. Please enter a valid name to deploy."],
    ["..", "invalid model name '..', model name must not contain path traversal characters"],
    ["../words", "invalid model name '../words', model name must not contain path traversal characters"],
    ["a/b", "invalid model name 'a/b', model name must not contain path traversal characters"],
  ];
  it.each(cases)("%j: INVALID_ARGUMENT, load and unload alike", async (name, text) => {
    const client = grpcClientOf(server);
    for (const call of [
      client.repositoryModelLoad({ modelName: name }),
      client.repositoryModelUnload({ modelName: name }),
    ]) {
      const err = await refusal(call);
      expect(err?.code).toBe(Code.InvalidArgument);
      expect(err?.rawMessage).toBe(text);
    }
    expect((await client.modelReady({ name: "words" })).ready).toBe(true);
  });

  // Over HTTP the name is a path segment, percent-encoded, dots too, and sent as it is (fetch would
  // fold a "%2E%2E" segment into the path first); an empty one has no URL.
  it.each(cases.filter(([name]) => name.trim() !== ""))(
    "%j over HTTP: 400, load and unload alike",
    async (name, text) => {
      for (const action of ["load", "unload"]) {
        const res = await rawPost(`/v2/repository/models/${encodeURIComponent(name).replaceAll(".", "%2E")}/${action}`);
        expect(res.status).toBe(400);
        expect((JSON.parse(res.body) as { error: string }).error).toBe(text);
      }
    },
  );
});

describe("a string input whose elements do not match its shape, in Triton's words", () => {
  const cases: [string, Uint8Array, number, string][] = [
    [
      "fewer elements",
      framed(["a", "b"]),
      3,
      "[request id: few] expected 3 string elements for inference input 'IN' for model 'words', got 2",
    ],
    [
      "more elements",
      framed(["a", "b", "c", "d"]),
      2,
      "[request id: many] unexpected number of string elements 3 for inference input 'IN' for model 'words', expecting 2",
    ],
    [
      "a cut length indicator",
      framed(["a"], [1, 0]),
      2,
      "[request id: cut] incomplete string length indicator for inference input 'IN' for model 'words', expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator is in one buffer.",
    ],
  ];
  it("each INVALID_ARGUMENT with Triton's text, while good requests run", async () => {
    const ids = ["few", "many", "cut"];
    const good = Array.from({ length: 4 }, (_, i) => infer(framed(["x", `y${i}`]), 2));
    const bad = cases.map(([, raw, count], i) => refusal(infer(raw, count, ids[i])));
    const errs = await Promise.all(bad);
    errs.forEach((err, i) => {
      expect(err?.code, cases[i]![0]).toBe(Code.InvalidArgument);
      expect(err?.rawMessage, cases[i]![0]).toBe(cases[i]![3]);
    });
    const answers = await Promise.all(good);
    answers.forEach((r, i) => {
      expect(Buffer.compare(r.rawOutputContents[0]!, framed(["x", `y${i}`]))).toBe(0);
    });
  });
});
