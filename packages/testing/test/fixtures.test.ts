import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fixturePhotos,
  LABELS_PATH,
  MOBILENET_PATH,
  makeSeedRepository,
  readFixtureImage,
  readReferenceTensor,
  readReferenceTop5,
  removeDir,
  repoRoot,
  seedModelNames,
  TRUNCATED_PHOTO,
} from "../src/index.js";

describe("shared fixtures", () => {
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

  it("puts the shared MobileNetV2 and the ImageNet labels where the seed's configs look", () => {
    const model = join(dir, "resnet50_inference", "1", "model.onnx");
    expect(statSync(model).isFile()).toBe(true);
    expect(readFileSync(model).equals(readFileSync(MOBILENET_PATH))).toBe(true);
    const labels = readFileSync(join(dir, "resnet50_postprocess", "1", "imagenet_classes.txt"), "utf8");
    expect(labels).toBe(readFileSync(LABELS_PATH, "utf8"));
    expect(labels.split("\n")).toHaveLength(1000);
  });
});
