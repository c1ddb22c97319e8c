import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fixtureImagesDir,
  fixturePhotos,
  LABELS_PATH,
  MOBILENET_PATH,
  makeSeedRepository,
  readFixtureImage,
  readReferenceTensor,
  readReferenceTop5,
  referenceDir,
  referenceTop5OnThisCpu,
  removeDir,
  repoRoot,
  STABLE_TOP1,
  seedModelNames,
  sharedDir,
  softmaxTop5,
  TRUNCATED_PHOTO,
} from "../src/index.js";

describe("the repository's own fixtures", () => {
  it("makes every reference tensor from the committed photos, equal to the seed's own where ../shared has them", () => {
    for (const photo of fixturePhotos()) {
      const made = readReferenceTensor(photo);
      expect(made.length, photo).toBe(3 * 224 * 224);
      const seed = join(sharedDir, "fixtures", "reference", `${photo}.f32`);
      if (existsSync(seed)) expect(Buffer.from(made.buffer).equals(readFileSync(seed)), photo).toBe(true);
    }
    // The photos, labels and model are the repository's own: nothing of the above reads ../shared.
    for (const path of [fixtureImagesDir, referenceDir, LABELS_PATH, MOBILENET_PATH]) {
      expect(path.startsWith(repoRoot) && !path.startsWith(sharedDir), path).toBe(true);
    }
  });

  it("lists the good photos, sorted, exactly the ones with a reference top-5", () => {
    const photos = fixturePhotos();
    expect(photos).not.toContain(TRUNCATED_PHOTO);
    expect(photos).toEqual([...photos].sort());
    expect(photos).toEqual(Object.keys(readReferenceTop5()).sort());
    expect(photos).toContain("chelsea.jpg");
  });

  it("reads typed reference top-5 and aligned reference tensors", () => {
    const chelsea = readReferenceTop5()["chelsea.jpg"];
    expect(chelsea?.top5_index[0]).toBe(285);
    expect(chelsea?.top5_labels[0]).toBe("Egyptian cat");
    expect(chelsea?.top5_probs).toHaveLength(5);
    const tensor = readReferenceTensor("chelsea.jpg");
    expect(tensor).toBeInstanceOf(Float32Array);
    expect(tensor.length).toBe(3 * 224 * 224);
    expect(readReferenceTensor("chelsea.jpg.f32")).toEqual(tensor);
    // JPEG SOI marker: the bytes are the photo's own.
    expect([...readFixtureImage("chelsea.jpg").subarray(0, 2)]).toEqual([0xff, 0xd8]);
  });

  it("softmaxTop5: softmax, the 5 largest descending, equal probabilities by lower index", () => {
    const labels = Array.from({ length: 7 }, (_, i) => `c${i}`);
    const got = softmaxTop5(Float32Array.from([0, 2, 1, 2, 0, -1, 0]), labels);
    expect(got.top5_index).toEqual([1, 3, 2, 0, 4]);
    expect(got.top5_labels).toEqual(["c1", "c3", "c2", "c0", "c4"]);
    const sum = 2 * Math.exp(2) + Math.exp(1) + 3 + Math.exp(-1);
    const want = [Math.exp(2), Math.exp(2), Math.exp(1), 1, 1].map((e) => e / sum);
    for (const [k, p] of got.top5_probs.entries()) expect(Math.abs(p - want[k]!)).toBeLessThan(1e-7);
  });

  it("referenceTop5OnThisCpu: every photo, memoised, the README's CPU-independent top-1s", async () => {
    const here = await referenceTop5OnThisCpu();
    expect(await referenceTop5OnThisCpu()).toBe(here);
    expect(Object.keys(here).sort()).toEqual(fixturePhotos());
    const labels = readFileSync(LABELS_PATH, "utf8").split("\n");
    for (const [photo, top5] of Object.entries(here)) {
      expect(top5.logits, photo).toHaveLength(1000);
      // NumPy's answer, against the simple rule: the same probabilities (to NumPy's last-bit
      // exp difference) and, tie order aside, the same classes above the fifth's probability.
      const simple = softmaxTop5(top5.logits, labels);
      for (const [k, p] of top5.top5_probs.entries())
        expect(Math.abs(p - simple.top5_probs[k]!), photo).toBeLessThan(1e-6);
      const above = (t: typeof simple) => t.top5_index.filter((_, k) => t.top5_probs[k]! > top5.top5_probs[4]! + 1e-6);
      expect(new Set(above(top5)), photo).toEqual(new Set(above(simple)));
      expect(top5.top5_labels, photo).toEqual(top5.top5_index.map((k) => labels[k]));
    }
    // The same top-1s on this CPU and in the JSON made on an AVX-512 VNNI one.
    const json = readReferenceTop5();
    for (const [photo, { index, label }] of Object.entries(STABLE_TOP1)) {
      expect([here[photo]?.top5_index[0], here[photo]?.top5_labels[0]], photo).toEqual([index, label]);
      expect([json[photo]?.top5_index[0], json[photo]?.top5_labels[0]], photo).toEqual([index, label]);
    }
  });
});

describe("makeSeedRepository", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await makeSeedRepository({ editConfig: (model, text) => `${text}\n# edited ${model}\n` });
  });
  afterAll(async () => {
    await removeDir(dir);
    expect(existsSync(dir)).toBe(false);
  });

  it("holds only the seed's resnet50_* models, each with its config and version 1", async () => {
    const names = await seedModelNames();
    expect(names).toEqual(["resnet50_ensemble", "resnet50_inference", "resnet50_postprocess", "resnet50_preprocess"]);
    expect(readdirSync(dir).sort()).toEqual(names);
    for (const name of names) {
      const seed = readFileSync(join(repoRoot, "models", name, "config.pbtxt"), "utf8");
      expect(readFileSync(join(dir, name, "config.pbtxt"), "utf8")).toBe(`${seed}\n# edited ${name}\n`);
      expect(statSync(join(dir, name, "1")).isDirectory()).toBe(true);
    }
  });

  it("puts the bundled MobileNetV2 and the ImageNet labels where the seed's configs look", () => {
    const model = join(dir, "resnet50_inference", "1", "model.onnx");
    expect(statSync(model).isFile()).toBe(true);
    expect(readFileSync(model).equals(readFileSync(MOBILENET_PATH))).toBe(true);
    const labels = readFileSync(join(dir, "resnet50_postprocess", "1", "imagenet_classes.txt"), "utf8");
    expect(labels).toBe(readFileSync(LABELS_PATH, "utf8"));
    expect(labels.trimEnd().split("\n")).toHaveLength(1000);
  });
});
