import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GraphProtoSchema, ModelProtoSchema, OperatorSetIdProtoSchema } from "../src/gen/onnx_pb.js";
import {
  type Artifact,
  ChecksumError,
  ensureModels,
  fetchModels,
  INFERENCE_MODEL,
  isBundledModel,
  isSyntheticModel,
  LABELS_FILE,
  OfflineError,
  RESNET50_ZOO_INPUT,
  RESNET50_ZOO_OUTPUT,
  readOnnxMetadata,
  SOURCE_SHA256_KEY,
  writeSyntheticLabels,
} from "../src/index.js";
import { floatTensor, floatValueInfo, node } from "../src/onnx.js";

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

/** A tiny model named like the Zoo's ResNet-50: data [N,4] -> MatMul -> Relu -> resnetv17_dense0_fwd [N,3]. */
function zooLikeModel(): Uint8Array {
  const w = new Float32Array([1, 0, -1, 0, 1, 0, 2, 0, 1, 0, 0, 0]);
  return toBinary(
    ModelProtoSchema,
    create(ModelProtoSchema, {
      irVersion: 7n,
      opsetImport: [create(OperatorSetIdProtoSchema, { domain: "", version: 13n })],
      producerName: "test",
      graph: create(GraphProtoSchema, {
        name: "zoo_like",
        node: [
          node("MatMul", "mm", [RESNET50_ZOO_INPUT, "w"], ["hidden"]),
          node("Relu", "relu", ["hidden"], [RESNET50_ZOO_OUTPUT]),
        ],
        initializer: [floatTensor("w", [4, 3], w)],
        input: [floatValueInfo(RESNET50_ZOO_INPUT, ["N", 4])],
        output: [floatValueInfo(RESNET50_ZOO_OUTPUT, ["N", 3])],
      }),
    }),
  );
}

describe("models:fetch against a local HTTP server", () => {
  let server: Server;
  let base: string;
  let dir: string;
  let deadPort: number;
  const requests: string[] = [];
  const labels = "tench\ngoldfish\ngreat white shark";
  const model = zooLikeModel();
  const files: Record<string, Uint8Array | string> = { "labels.txt": labels, "resnet.onnx": model };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "fetch-"));
    server = createServer((req, res) => {
      requests.push(req.url ?? "");
      const body = files[(req.url ?? "").slice(1)];
      if (body === undefined) {
        res.writeHead(404).end("not here");
        return;
      }
      res.writeHead(200, { "content-length": Buffer.byteLength(body) }).end(body);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    // A port that was just free: nothing listens there.
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
    deadPort = (probe.address() as AddressInfo).port;
    await new Promise((r) => probe.close(r));
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
    await rm(dir, { recursive: true, force: true });
  });

  const labelsArtifact = (hash: string): Artifact => ({
    name: "labels",
    url: `${base}/labels.txt`,
    sha256: hash,
    dest: "post/1/imagenet_classes.txt",
  });

  it("downloads and verifies, then keeps a verified copy", async () => {
    const repository = join(dir, "ok");
    const [got] = await fetchModels({ repository, artifacts: [labelsArtifact(sha(labels))], log: () => {} });
    expect(got!.downloaded).toBe(true);
    expect(got!.sha256).toBe(sha(labels));
    expect(await readFile(join(repository, "post/1/imagenet_classes.txt"), "utf8")).toBe(labels);
    expect(existsSync(join(repository, "post/1/imagenet_classes.txt.part"))).toBe(false);
    const before = requests.length;
    const [again] = await fetchModels({ repository, artifacts: [labelsArtifact(sha(labels))], log: () => {} });
    expect(again!.downloaded).toBe(false);
    expect(requests.length).toBe(before);
  });

  it("rejects a SHA-256 mismatch and deletes the partial file", async () => {
    const repository = join(dir, "bad");
    const wrong = sha("something else");
    const err = await fetchModels({ repository, artifacts: [labelsArtifact(wrong)], log: () => {} }).catch((e) => e);
    expect(err).toBeInstanceOf(ChecksumError);
    expect(err.message).toContain(`expected ${wrong}, got ${sha(labels)}`);
    expect(err.message).toContain("partial download was deleted");
    expect(existsSync(join(repository, "post/1/imagenet_classes.txt.part"))).toBe(false);
    expect(existsSync(join(repository, "post/1/imagenet_classes.txt"))).toBe(false);
  });

  it("says offline, and suggests models:synth, when the host cannot be reached", async () => {
    const err = await fetchModels({
      repository: join(dir, "offline"),
      artifacts: [{ ...labelsArtifact(sha(labels)), url: `http://127.0.0.1:${deadPort}/labels.txt` }],
      log: () => {},
    }).catch((e) => e);
    expect(err).toBeInstanceOf(OfflineError);
    expect(err.message).toBe(
      `cannot reach 127.0.0.1:${deadPort}: offline? run \`pnpm models:synth\` for a synthetic stand-in`,
    );
  });

  it("reports HTTP errors with the URL and status", async () => {
    const err = await fetchModels({
      repository: join(dir, "404"),
      artifacts: [{ ...labelsArtifact(sha(labels)), url: `${base}/missing.txt` }],
      log: () => {},
    }).catch((e) => e);
    expect(err.message).toContain(`GET ${base}/missing.txt: HTTP 404`);
  });

  it("renames the Zoo model's tensors to the config's names (via baseUrl)", async () => {
    const repository = join(dir, "model");
    const artifact: Artifact = {
      name: "zoo",
      url: "https://models.example.invalid/some/path/resnet.onnx",
      sha256: sha(model),
      dest: "inf/1/model.onnx",
      rename: { input: [RESNET50_ZOO_INPUT, "input"], output: [RESNET50_ZOO_OUTPUT, "output"] },
    };
    const [got] = await fetchModels({ repository, baseUrl: `${base}/`, artifacts: [artifact], log: () => {} });
    expect(got!.renamed).toBe(true);
    const path = join(repository, "inf/1/model.onnx");
    expect((await readOnnxMetadata(path)).metadata[SOURCE_SHA256_KEY]).toBe(sha(model));
    expect(await isSyntheticModel(path)).toBe(false);
    const session = await ort.InferenceSession.create(path);
    try {
      expect(session.inputNames).toEqual(["input"]);
      expect(session.outputNames).toEqual(["output"]);
      const out = await session.run({
        input: new ort.Tensor("float32", new Float32Array([1, 2, 3, 4, 0, 0, 0, -1]), [2, 4]),
      });
      expect(out.output!.dims).toEqual([2, 3]);
      // [1,2,3,4] x w = [1+6, 2, -1+3]; the second row is all <= 0 after relu
      expect(Array.from(out.output!.data as Float32Array)).toEqual([7, 2, 2, 0, 0, 0]);
    } finally {
      await session.release();
    }
    // A second run recognises the renamed file by its recorded source hash.
    const [again] = await fetchModels({ repository, baseUrl: base, artifacts: [artifact], log: () => {} });
    expect(again!.downloaded).toBe(false);
  });

  it("ensureModels falls back to the bundled MobileNetV2 and real labels when offline", async () => {
    const repository = join(dir, "bundled");
    const lines: string[] = [];
    const warnings: string[] = [];
    const result = await ensureModels({
      repository,
      artifacts: [{ ...labelsArtifact(sha(labels)), url: `http://127.0.0.1:${deadPort}/labels.txt` }],
      log: (l) => lines.push(l),
      warn: (l) => warnings.push(l),
    });
    expect(result.source).toBe("bundled");
    expect(result.modelPath).toBe(join(repository, INFERENCE_MODEL));
    // Byte for byte the committed file (its SHA-256 checked), not re-encoded.
    expect(await isBundledModel(result.modelPath)).toBe(true);
    expect(await isSyntheticModel(result.modelPath)).toBe(false);
    const classes = (await readFile(result.labelsPath, "utf8")).trimEnd().split("\n");
    expect(classes).toHaveLength(1000);
    expect([classes[0], classes[281], classes[285], classes[967]]).toEqual([
      "tench",
      "tabby",
      "Egyptian cat",
      "espresso",
    ]);
    // One warning, with why: the connection's own error.
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(`ResNet-50 not downloaded: cannot reach 127.0.0.1:${deadPort}`);
    expect(warnings[0]).toContain("ECONNREFUSED");
    expect(warnings[0]).toContain("bundled MobileNetV2");
    expect(lines.join("\n")).not.toContain("WARNING");
    expect((await ensureModels({ repository, log: () => {} })).source).toBe("present");
  });

  it("ensureModels never replaces an existing model, and replaces placeholder labels", async () => {
    const repository = join(dir, "kept");
    const own = join(repository, INFERENCE_MODEL);
    const labelsPath = join(repository, LABELS_FILE);
    const offline = {
      repository,
      artifacts: [{ ...labelsArtifact(sha(labels)), url: `http://127.0.0.1:${deadPort}/labels.txt` }],
      log: () => {},
      warn: () => {},
    };
    // A model of the user's without labels: the labels are added, the model kept.
    await mkdir(join(repository, "resnet50_inference", "1"), { recursive: true });
    await writeFile(own, "the user's model");
    expect((await ensureModels(offline)).source).toBe("bundled");
    expect(await readFile(own, "utf8")).toBe("the user's model");
    expect((await readFile(labelsPath, "utf8")).split("\n")[285]).toBe("Egyptian cat");
    // An older synthetic fallback's placeholder labels, the model gone: both replaced.
    await rm(own);
    await rm(labelsPath);
    expect(await writeSyntheticLabels(labelsPath)).toBe(true);
    expect((await ensureModels(offline)).source).toBe("bundled");
    expect(await isBundledModel(own)).toBe(true);
    expect((await readFile(labelsPath, "utf8")).split("\n")[967]).toBe("espresso");
  });

  it("ensureModels falls back to the synthetic model when offline without the bundled files", async () => {
    const repository = join(dir, "fallback");
    const lines: string[] = [];
    const warnings: string[] = [];
    const result = await ensureModels({
      repository,
      bundledDir: join(dir, "no-bundled-files"),
      artifacts: [{ ...labelsArtifact(sha(labels)), url: `http://127.0.0.1:${deadPort}/labels.txt` }],
      log: (l) => lines.push(l),
      warn: (l) => warnings.push(l),
    });
    expect(result.source).toBe("synthetic");
    expect(await isSyntheticModel(result.modelPath)).toBe(true);
    expect((await readFile(result.labelsPath, "utf8")).split("\n")[0]).toBe("synthetic_class_0");
    // The fallback and the placeholder labels are warnings, not progress lines.
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toContain("SYNTHETIC ResNet-50");
    // ... and why: the connection's own error.
    expect(warnings[0]).toContain(`cannot reach 127.0.0.1:${deadPort}`);
    expect(warnings[0]).toContain("ECONNREFUSED");
    expect(warnings[1]).toContain("placeholder labels");
    expect(lines.join("\n")).not.toContain("WARNING");
    expect((await ensureModels({ repository, log: () => {} })).source).toBe("present");
  });
});
