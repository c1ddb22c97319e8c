/** Where the repository and the read-only ../shared material live, and typed readers for the fixtures. */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { referenceTensorBytes } from "./reference-tensors.js";

/** The monorepo root (this file is in packages/testing/src or, built, packages/testing/dist). */
export const repoRoot = join(import.meta.dirname, "..", "..", "..");
/** The seed's model repository (models/*\/config.pbtxt). */
export const modelsDir = join(repoRoot, "models");
/** Our .proto files, for clients that load them at runtime. */
export const protoDir = join(repoRoot, "packages", "protocol", "proto");
/**
 * ../shared beside the repository root: material only this project's own machines have. Read
 * only for what the repository may not carry (the seed deployment's own model.py files; see
 * seedPythonModelsDir); every other fixture is the repository's own.
 */
export const sharedDir = join(repoRoot, "..", "shared");
/** The sample photos (CC0 / public domain, credited in samples/README.md), `truncated.jpg` among them. */
export const fixtureImagesDir = join(repoRoot, "samples", "images");
/** The reference top-5 and the pinned SHA-256 of each reference tensor (packages/testing/fixtures/reference). */
export const referenceDir = join(repoRoot, "packages", "testing", "fixtures", "reference");
/** The real MobileNetV2 (int8, ONNX) standing in for ResNet-50: input `input` [N,3,224,224], output `output` [N,1000]. */
export const MOBILENET_PATH = join(repoRoot, "tooling", "bundled", "mobilenetv2-12-int8.onnx");
/** The 1000 ImageNet class names, one a line, in the model's output order (the bundled list). */
export const LABELS_PATH = join(repoRoot, "tooling", "bundled", "imagenet-1k-labels.txt");

/**
 * A self-signed certificate (CA:TRUE, for 127.0.0.1 and localhost, no usage limits) and its key,
 * test-only: a TLS server's certificate, the CA a client trusts, and a client certificate alike.
 */
export const TLS_CERT_PATH = join(repoRoot, "packages", "testing", "fixtures", "tls-cert.pem");
export const TLS_KEY_PATH = join(repoRoot, "packages", "testing", "fixtures", "tls-key.pem");

/** A photo deliberately cut short: the one fixture that must fail to decode. */
export const TRUNCATED_PHOTO = "truncated.jpg";

/** The good fixture photos (every one has a reference tensor and top-5), sorted by name. */
export function fixturePhotos(): string[] {
  return readdirSync(fixtureImagesDir)
    .filter((f) => f !== TRUNCATED_PHOTO)
    .sort();
}

/** A fixture photo's bytes (`truncated.jpg` included). */
export function readFixtureImage(name: string): Uint8Array {
  return new Uint8Array(readFileSync(join(fixtureImagesDir, name)));
}

/** What MobileNetV2 gives on a photo's reference tensor: softmax, then the 5 largest, descending. */
export interface ReferenceTop5 {
  top5_index: number[];
  top5_labels: string[];
  top5_probs: number[];
}

/** The reference top-5 per photo name (mobilenetv2_top5.json). */
export function readReferenceTop5(): Record<string, ReferenceTop5> {
  return JSON.parse(readFileSync(join(referenceDir, "mobilenetv2_top5.json"), "utf8"));
}

/**
 * The seed preprocessing's FP32 [3,224,224] tensor for a photo: `chelsea.jpg` or
 * `chelsea.jpg.f32`. Copied into a fresh buffer, so it is aligned and the caller's own.
 * Made on first use by scripts/reference-tensor.py (the seed's OpenCV steps; python3 with
 * OpenCV) into packages/testing/.cache, and checked against its pinned SHA-256.
 */
export function readReferenceTensor(photo: string): Float32Array {
  const name = photo.endsWith(".f32") ? photo.slice(0, -".f32".length) : photo;
  return new Float32Array(Uint8Array.from(referenceTensorBytes(name)).buffer);
}
