/**
 * tritonserver's --backend-config default-max-batch-size, black-box: what
 * auto-complete gives a batchable ONNX model whose config sets no max_batch_size.
 */
import { copyFile, mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { MOBILENET_PATH, removeDir, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { jsonOf, makeRepository } from "./helpers.js";

let repo: string;
beforeAll(async () => {
  repo = await makeRepository({});
  // The shared MobileNetV2 (a dynamic batch dimension) with a config that names only its platform.
  await mkdir(join(repo, "mobilenet", "1"), { recursive: true });
  await writeFile(join(repo, "mobilenet", "config.pbtxt"), 'platform: "onnxruntime_onnx"\n');
  await copyFile(MOBILENET_PATH, join(repo, "mobilenet", "1", "model.onnx"));
});
afterAll(() => removeDir(repo));

it("auto-completes max_batch_size with Triton's 4, or with --backend-config's default-max-batch-size", async () => {
  for (const [args, expected, dims] of [
    [[], 4, [3, 224, 224]],
    [["--backend-config", "onnxruntime,default-max-batch-size=16"], 16, [3, 224, 224]],
    // 0: no batching, and the dims are the model's whole shape, its first dimension variable.
    [["--backend-config", "default-max-batch-size=0"], 0, [-1, 3, 224, 224]],
  ] as const) {
    const server = await startServerProcess(["--model-repository", repo, ...args]);
    try {
      const config = await jsonOf(await fetch(`${server.http}/v2/models/mobilenet/config`));
      expect(config.max_batch_size, args.join(" ")).toBe(expected);
      expect(config.input[0].dims).toEqual(dims);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  }
});

it("refuses backend settings it does not have, naming the one it has", async () => {
  const bad = await startupRefusal([
    "--model-repository",
    repo,
    "--backend-config",
    "onnxruntime,enable-global-threadpool=1",
  ]);
  expect(String(bad)).toContain(
    "trellis-server: --backend-config onnxruntime,enable-global-threadpool=1: the supported setting is default-max-batch-size=<n>",
  );
});
