/**
 * A 64 MiB FP32 answer from a real python3 stub comes back whole both ways a result can travel:
 * through the stub's answer file (one read in the thread pool, copied once) and through the pipe
 * (where the stub's answer file cannot be opened: copied at most twice, where the old reader's
 * copies grew with the square of the answer). The pipe's reader alone is tested in
 * frame-reader.test.ts.
 */
import { type FileHandle, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { frameCopyStats } from "../src/frames.js";
import { StubProcess } from "../src/stub-process.js";

// X[0] = -1 ends the process (a crash right after a large answer).
const MODEL = `import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] == -1:
                os._exit(3)
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x)]))
        return out
`;

// The same model in a process whose files may not grow past 2 MiB (RLIMIT_FSIZE; Python ignores
// SIGXFSZ, so growing the answer file raises instead): the answer file cannot take a large answer.
const LIMITED = `import resource
${MODEL.replace(
  "class TritonPythonModel:",
  `class TritonPythonModel:
    def initialize(self, args):
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
`,
)}`;

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "trellis-large-answer-"));
  await mkdir(join(root, "1"), { recursive: true });
  await writeFile(join(root, "1", "model.py"), MODEL);
  await writeFile(join(root, "1", "limited.py"), LIMITED);
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

const stubOf = (answerFile: boolean, file = "model.py") =>
  new StubProcess({
    modelName: "identity",
    pythonExecutable: "/usr/bin/python3",
    modelFile: join(root, "1", file),
    initialize: { model_name: "identity" },
    executeTimeoutMs: 60_000,
    loadTimeoutMs: 60_000,
    maxFrameBytes: 1 << 30,
    maxStreamResponses: 16,
    answerFile,
  });

/** Sends X (FP32, `elements` long, a mark every 1021st) and gives Y with the bytes copied to read it. */
async function identity(stub: StubProcess, elements: number, first = 0) {
  const x = new Float32Array(elements);
  for (let i = 0; i < elements; i += 1021) x[i] = i;
  x[0] = first;
  const before = { ...frameCopyStats };
  const [answer] = await stub.execute([{ inputs: [tensor("X", "FP32", [elements], x)], outputs: [{ name: "Y" }] }]);
  if (answer instanceof Error) throw answer;
  const y = answer[0]?.data as Float32Array;
  expect(y.length).toBe(elements);
  if (elements > 1021 * 5000) expect(y[1021 * 5000]).toBe(1021 * 5000);
  expect(y[elements - 1]).toBe(x[elements - 1]);
  return {
    copied: frameCopyStats.bytesCopied - before.bytesCopied,
    fromFile: frameCopyStats.fromAnswerFiles - before.fromAnswerFiles,
  };
}

/** The size of the stub's answer file now, through the server's own descriptor of it. */
async function answerFileBytes(stub: StubProcess): Promise<number | undefined> {
  const file = (stub as unknown as { answerFile?: FileHandle }).answerFile;
  return file ? (await file.stat()).size : undefined;
}

describe("a large Python answer", () => {
  const elements = (64 << 20) / 4;

  it("comes back whole through the answer file, copied once, and again after a restart", {
    timeout: 120_000,
  }, async () => {
    const stub = stubOf(true);
    try {
      expect(await identity(stub, elements)).toEqual({ copied: elements * 4, fromFile: elements * 4 });
      expect(await answerFileBytes(stub)).toBe(elements * 4);
      // A small answer stays in the pipe; the file's pages are kept for the next large one.
      expect((await identity(stub, 50_000)).fromFile).toBe(0);
      expect(await answerFileBytes(stub)).toBe(elements * 4);
      // Past 64 MiB the file is emptied at the next execution.
      expect((await identity(stub, elements + (4 << 20))).fromFile).toBe(elements * 4 + (16 << 20));
      expect((await identity(stub, 50_000)).fromFile).toBe(0);
      expect(await answerFileBytes(stub)).toBe(0);
      // The process ends: that execution fails alone, and the next process's own file carries the next answer.
      await expect(identity(stub, 4, -1)).rejects.toThrow(/its Python process exited \(code 3\)/);
      expect(await identity(stub, elements)).toEqual({ copied: elements * 4, fromFile: elements * 4 });
      expect(stub.starts).toBe(2);
    } finally {
      await stub.close();
    }
  });

  it("comes back whole through the pipe where there is no answer file, copied at most twice", {
    timeout: 120_000,
  }, async () => {
    const stub = stubOf(false);
    try {
      const { copied, fromFile } = await identity(stub, elements);
      expect(fromFile).toBe(0);
      expect(copied).toBeGreaterThanOrEqual(elements * 4);
      expect(copied).toBeLessThanOrEqual(2 * elements * 4 + (1 << 16));
    } finally {
      await stub.close();
    }
  });

  it("comes back through the pipe when the answer file cannot take it", { timeout: 120_000 }, async () => {
    const stub = stubOf(true, "limited.py");
    try {
      const { copied, fromFile } = await identity(stub, elements / 4);
      expect(fromFile).toBe(0);
      expect(copied).toBeLessThanOrEqual(2 * elements + (1 << 16));
      expect(stub.starts).toBe(1);
    } finally {
      await stub.close();
    }
  });
});
