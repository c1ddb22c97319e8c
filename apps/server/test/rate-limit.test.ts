/**
 * tritonserver's rate limiter, black-box: two ONNX models whose instances each
 * need the one resource "R" never compute at the same time under
 * --rate-limit execution_count (read from their traces), and do without it.
 */
import { copyFile, mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MOBILENET_PATH, removeDir, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { grpcClientOf, jsonOf, makeRepository } from "./helpers.js";

// Each instance needs one "R"; runs must not wait on the CPU gate, or they never overlap anyway.
const config = (name: string) => `name: "${name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ { kind: KIND_CPU count: 1 rate_limiter { resources [ { name: "R" count: 1 } ] priority: 1 } } ]
parameters { key: "exclusive_cpu" value: { string_value: "false" } }
`;

let repo: string;
let dir: string;
beforeAll(async () => {
  repo = await makeRepository({});
  for (const name of ["m1", "m2"]) {
    await mkdir(join(repo, name, "1"), { recursive: true });
    await writeFile(join(repo, name, "config.pbtxt"), config(name));
    await copyFile(MOBILENET_PATH, join(repo, name, "1", "model.onnx"));
  }
  dir = await mkdtemp(join(tmpdir(), "trellis-rate-limit-"));
});
afterAll(async () => {
  await removeDir(repo);
  await removeDir(dir);
});

/** Runs 6 concurrent requests to each model; returns every execution's [start, end] from the trace file. */
async function computeSpans(args: string[], file: string): Promise<[number, number][]> {
  const server = await startServerProcess([
    "--model-repository",
    repo,
    ...["--trace-config", `triton,file=${file}`, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"],
    ...args,
  ]);
  try {
    const meta = await jsonOf(await fetch(`${server.http}/v2/models/m1`));
    const input = meta.inputs[0] as { name: string; datatype: string; shape: number[] };
    const shape = [1, ...input.shape.slice(1)].map(BigInt);
    const values = shape.reduce((a, b) => a * Number(b), 1);
    const client = grpcClientOf(server);
    const calls = [];
    for (let i = 0; i < 6; i++) {
      for (const modelName of ["m1", "m2"]) {
        calls.push(
          client.modelInfer({
            modelName,
            inputs: [{ name: input.name, datatype: input.datatype, shape }],
            rawInputContents: [new Uint8Array(values * 4)],
          }),
        );
      }
    }
    await Promise.all(calls);
  } finally {
    expect(await server.stop()).toBe(0);
  }
  const entries = JSON.parse(await readFile(file, "utf8")) as { timestamps?: { name: string; ns: number }[] }[];
  return entries.flatMap((e) => {
    const at = new Map((e.timestamps ?? []).map((t) => [t.name, t.ns]));
    const start = at.get("COMPUTE_START");
    const end = at.get("COMPUTE_END");
    return start !== undefined && end !== undefined ? [[start, end] as [number, number]] : [];
  });
}

/** How many pairs of executions ran at the same time. */
const overlaps = (spans: [number, number][]) => {
  const sorted = [...spans].sort((a, b) => a[0] - b[0]);
  let count = 0;
  for (let i = 1; i < sorted.length; i++) if (sorted[i]![0] < sorted[i - 1]![1]) count++;
  return count;
};

it("runs the two models' instances one at a time when they share the resource, and together without the rate limiter", async () => {
  const limited = await computeSpans(["--rate-limit", "execution_count"], join(dir, "limited.json"));
  expect(limited).toHaveLength(12);
  expect(overlaps(limited)).toBe(0);
  // The same load without the rate limiter: the two instances compute side by side.
  const free = await computeSpans([], join(dir, "free.json"));
  expect(free).toHaveLength(12);
  expect(overlaps(free)).toBeGreaterThan(0);
});

it("refuses a model whose instances need more of a resource than --rate-limit-resource gives", async () => {
  const server = await startServerProcess([
    "--model-repository",
    repo,
    ...["--rate-limit", "execution_count", "--rate-limit-resource", "R:0"],
    // Serves on with the refused models listed, rather than exiting (Triton's default).
    "--exit-on-error=false",
  ]);
  try {
    const index = (await jsonOf(await fetch(`${server.http}/v2/repository/index`, { method: "POST" }))) as {
      name: string;
      state: string;
      reason: string;
    }[];
    expect(index.map((m) => [m.name, m.state, m.reason])).toEqual(
      ["m1", "m2"].map((name) => [
        name,
        "UNAVAILABLE",
        `[invalid_argument] ${name}: rate_limiter resource R: an instance needs 1, but --rate-limit-resource gives 0`,
      ]),
    );
  } finally {
    expect(await server.stop()).toBe(0);
  }
  const bad = await startupRefusal(["--model-repository", repo, "--rate-limit-resource", "R:2:1"]);
  expect(String(bad)).toContain(
    "--rate-limit-resource R:2:1: this server keeps one count per resource, for device 0 (the host)",
  );
});
