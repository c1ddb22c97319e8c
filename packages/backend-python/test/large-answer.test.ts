/**
 * A 64 MiB FP32 answer from a real python3 stub, through the pipe in its own chunking: it comes
 * back whole, and reading it copies at most twice its size (reassembly once, the aligned tensor
 * once), where the old reader's copies grew with the square of the answer.
 */
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { frameCopyStats } from "../src/frames.js";
import { createPythonBackend } from "../src/index.js";

const CONFIG = `name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`;

const MODEL = `import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
`;

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "trellis-large-answer-"));
  await mkdir(join(root, "identity", "1"), { recursive: true });
  await writeFile(join(root, "identity", "config.pbtxt"), CONFIG);
  await writeFile(join(root, "identity", "1", "model.py"), MODEL);
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("a large Python answer", () => {
  it("comes back whole, copied at most twice its size", { timeout: 120_000 }, async () => {
    const config = parseModelConfig(CONFIG);
    const backend = await createPythonBackend({
      config,
      modelDir: join(root, "identity"),
      version: "1",
      pythonExecutable: "/usr/bin/python3",
    });
    try {
      const elements = (64 << 20) / 4;
      const x = new Float32Array(elements);
      for (let i = 0; i < elements; i += 1021) x[i] = i;
      const before = frameCopyStats.bytesCopied;
      const { responses } = await backend.executeRequests(
        [{ inputs: [tensor("X", "FP32", [elements], x)], outputs: [{ name: "Y" }] }],
        { instance: 0, batchSize: 1 } as never,
      );
      const copied = frameCopyStats.bytesCopied - before;
      const y = (responses[0] as { data: Float32Array }[])[0]?.data as Float32Array;
      expect(y.length).toBe(elements);
      expect(y[1021 * 5000]).toBe(1021 * 5000);
      expect(y[elements - 1]).toBe(x[elements - 1]);
      expect(copied).toBeLessThanOrEqual(2 * x.byteLength + (1 << 16));
    } finally {
      await backend.close();
    }
  });
});
