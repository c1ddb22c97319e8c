/**
 * Large Python answers through a real server: a 64 MiB answer comes back while another model's
 * requests are answered beside it, and an answer past --python-max-answer-bytes fails only its
 * own request, RESOURCE_EXHAUSTED (HTTP 503, Trellis's status for that code) naming the model and
 * the flag, judged from the frame's length prefix and dropped unread; the same process answers on.
 */
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const config = (name: string) => `name: "${name}"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
`;

// Y: N float32 elements, Y[i] = i % 1000; N = -1: Y = [the process id] (a restart changes it).
const MODEL = `import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            if n == -1:
                y = np.array([os.getpid()], dtype=np.float32)
            else:
                y = (np.arange(n, dtype=np.int64) % 1000).astype(np.float32)
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return out
`;

let root: string;
let server: ServerProcess;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "trellis-python-answer-"));
  for (const name of ["grow", "small"]) {
    await mkdir(join(root, name, "1"), { recursive: true });
    await writeFile(join(root, name, "config.pbtxt"), config(name));
    await writeFile(join(root, name, "1", "model.py"), MODEL);
  }
  server = await startServerProcess([
    "--model-repository",
    root,
    "--python-executable",
    "/usr/bin/python3",
    "--python-max-answer-bytes",
    String(80 << 20),
  ]);
}, 120_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await rm(root, { recursive: true, force: true });
});

async function infer(model: string, n: number) {
  const res = await fetch(`${server.http}/v2/models/${model}/infer`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      inputs: [{ name: "N", datatype: "INT64", shape: [1], data: [n] }],
      outputs: [{ name: "Y", parameters: { binary_data: true } }],
    }),
  });
  const body = Buffer.from(await res.arrayBuffer());
  const headerLength = Number(res.headers.get("inference-header-content-length") ?? body.byteLength);
  return { status: res.status, head: body.subarray(0, headerLength).toString(), raw: body.subarray(headerLength) };
}

describe("a Python model's answer size", () => {
  it("answers 64 MiB whole, and past the bound fails only that request, named", { timeout: 300_000 }, async () => {
    const big = 16 << 20; // 64 MiB of FP32
    const tooBig = 24 << 20; // 96 MiB, past the 80 MiB bound
    const pidOf = async () => new Float32Array(Uint8Array.from((await infer("grow", -1)).raw).buffer)[0];
    const pid = await pidOf();
    const good = Array.from({ length: 20 }, (_, i) => infer("small", 10 + i));
    const [large, over, ...smalls] = await Promise.all([infer("grow", big), infer("grow", tooBig), ...good]);
    expect(large.status).toBe(200);
    expect(large.raw.byteLength).toBe(big * 4);
    const y = new Float32Array(Uint8Array.from(large.raw).buffer);
    expect([y[0], y[999], y[1000], y[big - 1]]).toEqual([0, 999, 0, (big - 1) % 1000]);
    expect(over.status).toBe(503);
    expect(JSON.parse(over.head).error).toMatch(
      /model "grow": its Python process sent a 100663\d{3}-byte answer, over the 83886080-byte bound \(--python-max-answer-bytes\); it was dropped/,
    );
    expect(over.head).not.toMatch(/\/tmp\//);
    smalls.forEach((s, i) => {
      expect(s.status).toBe(200);
      expect(s.raw.byteLength).toBe((10 + i) * 4);
    });
    // The answer was dropped unread and the same process answers on: no restart.
    const again = await infer("grow", 5);
    expect(again.status).toBe(200);
    expect(again.raw.byteLength).toBe(20);
    expect(await pidOf()).toBe(pid);
  });
});
