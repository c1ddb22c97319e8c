/**
 * The client tools against the real server process serving the seed ensemble
 * (the shared MobileNetV2 as its inference model), over gRPC and HTTP: the
 * library, and the trellis-client command as users run it.
 */
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  fixtureImagesDir,
  makeSeedRepository,
  readFixtureImage,
  referenceTop5OnThisCpu,
  rejectionOf,
  removeDir,
  type ServerProcess,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  classify,
  concurrencyRange,
  connectEndpoint,
  type Endpoint,
  formatClassification,
  measure,
  measureRate,
  randomRequest,
  requestRateRange,
  topClasses,
} from "../src/index.js";

const run = promisify(execFile);
const MAIN = join(import.meta.dirname, "..", "dist", "main.js");

/** ONNX Runtime run directly on the seed's reference tensors on this CPU (the int8 model's kernels differ between CPUs). */
const references = await referenceTop5OnThisCpu();
// Photos whose top-1 holds on every CPU seen (STABLE_TOP1): batch sizes that change the int8
// kernels' last bits on some CPUs cannot change them.
const photos = ["chelsea.jpg", "coffee.jpg", "camera.jpg"];
const top1 = (photo: string) => references[photo]?.top5_labels[0] as string;

/** trellis-client with `args`: its exit code and output (a failing run does not throw). */
async function client(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [MAIN, ...args], { timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

let repo: string;
let server: ServerProcess;
const url = (protocol: "grpc" | "http") =>
  `127.0.0.1:${protocol === "grpc" ? server.grpcPort : new URL(server.http).port}`;

/** A TypeScript model in `repository`: its config.pbtxt and version 1's model.js. */
async function addTypescriptModel(repository: string, name: string, config: string, code: string): Promise<void> {
  await mkdir(join(repository, name, "1"), { recursive: true });
  await writeFile(join(repository, name, "config.pbtxt"), config);
  await writeFile(join(repository, name, "1", "model.js"), code);
}

/** A decoupled model (model_transaction_policy { decoupled: true }): for N it answers N, N-1, ..., 1. */
async function addCountdown(repository: string): Promise<void> {
  // The repository is a temporary folder without node_modules: @trellis/stage by its resolved URL.
  await addTypescriptModel(
    repository,
    "countdown",
    `name: "countdown"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
`,
    `import { defineStage } from "${import.meta.resolve("@trellis/stage")}";
export const createStage = ({ config, version }) => defineStage({ config, version, async *computeStream(request) {
  for (let i = Number(request.inputs[0].data[0]); i >= 1; i--) yield [{ name: "OUT", datatype: "INT32", shape: [1], data: Int32Array.of(i) }];
} });
`,
  );
}

/**
 * A stateful model (sequence_batching, two slots): it counts a sequence's requests in its
 * implicit state and fails a sequence that ends after other than four, so a perf run that
 * gets its flags or order wrong fails.
 */
async function addCounter(repository: string): Promise<void> {
  await addTypescriptModel(
    repository,
    "counter",
    `name: "counter"
backend: "typescript"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [ { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "COUNT_IN" output_name: "COUNT_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
}
`,
    `import { defineStage } from "${import.meta.resolve("@trellis/stage")}";
export const createStage = ({ config, version }) => defineStage({ config, version, compute(request) {
  const get = (name) => request.inputs.find((t) => t.name === name);
  const count = get("COUNT_IN").data[0] + 1;
  if (get("END").data[0] === 1 && count !== 4) throw new Error("a sequence ended after " + count + " requests");
  const out = (name) => ({ name, datatype: "INT32", shape: [1], data: Int32Array.of(count) });
  return [out("OUTPUT"), out("COUNT_OUT")];
} });
`,
  );
}

/**
 * A barrier: each request is held until three are waiting, then the three are answered.
 * A client that waits for each answer before the next send never gets one; an open loop
 * sending three on schedule has them all in flight at once.
 */
async function addBarrier(repository: string): Promise<void> {
  await addTypescriptModel(
    repository,
    "barrier",
    `name: "barrier"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
`,
    `import { defineStage } from "${import.meta.resolve("@trellis/stage")}";
const waiting = [];
export const createStage = ({ config, version }) => defineStage({ config, version, compute(request) {
  return new Promise((resolve) => {
    waiting.push(() => resolve([{ name: "OUT", datatype: "INT32", shape: [1], data: request.inputs[0].data }]));
    if (waiting.length === 3) for (const answer of waiting.splice(0)) answer();
  });
} });
`,
  );
}

beforeAll(async () => {
  repo = await makeSeedRepository();
  await addCountdown(repo);
  await addCounter(repo);
  await addBarrier(repo);
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

describe("classify", () => {
  it("answers each photo with the reference top-1, the same over gRPC and HTTP, batched or not", async () => {
    const images = photos.map(readFixtureImage);
    const answers = [];
    for (const [protocol, batch] of [
      ["grpc", 1],
      ["http", 1],
      ["grpc", 2],
    ] as const) {
      const endpoint = connectEndpoint(url(protocol), protocol);
      try {
        answers.push(await classify(endpoint, "resnet50_ensemble", images, { batch }));
      } finally {
        endpoint.close();
      }
    }
    const [first] = answers;
    for (const [i, photo] of photos.entries()) {
      const result = JSON.parse(first?.[i]?.outputs.OUTPUT_RESULTS?.[0] as string) as { top5_labels: string[] };
      expect(result.top5_labels[0], photo).toBe(top1(photo));
    }
    // The same model run: HTTP gives what gRPC gives, to the last bit.
    expect(answers[1]).toEqual(first);
    // Batched by two: the same classes (on some CPUs ONNX Runtime's int8 kernels give other last
    // bits for another batch size, so the probabilities are not compared).
    const labels = (answer: typeof first) =>
      answer?.map(
        (a) => (JSON.parse(a.outputs.OUTPUT_RESULTS?.[0] as string) as { top5_labels: string[] }).top5_labels[0],
      );
    expect(labels(answers[2])).toEqual(labels(first));
  });

  it("from the command line: one answer per image, a bad image named with the server's error, exit code 1", async () => {
    for (const protocol of ["grpc", "http"]) {
      const paths = [...photos, TRUNCATED_PHOTO].map((p) => join(fixtureImagesDir, p));
      const out = await client(["-i", protocol, "-u", url(protocol as "grpc"), "classify", ...paths]);
      expect(out.code, out.stderr).toBe(1);
      const blocks = out.stdout.trimEnd().split(/\n(?=\S)/);
      expect(blocks).toHaveLength(4);
      for (const [i, photo] of photos.entries()) {
        // Triton's image_client: the image, then `    <score> = <label>` for each of the top 5
        // (the ensemble's JSON names no class index).
        const [header, ...lines] = blocks[i]!.split("\n");
        expect(header).toBe(`Image '${paths[i]}':`);
        expect(lines).toHaveLength(5);
        for (const line of lines) expect(line).toMatch(/^ {4}[01]\.\d{3} = \S/);
        expect(lines[0]!.replace(/^ {4}[01]\.\d{3} = /, "")).toBe(top1(photo));
      }
      expect(blocks[3]).toMatch(
        /^Image '.*truncated\.jpg':\n {4}error: INVALID_ARGUMENT: resnet50_ensemble: step 0 resnet50_preprocess: .*input RAW_IMAGE element 0/,
      );
    }
  });

  it("classify prints chelsea.jpg as image_client does, and the server's JSON with --json", async () => {
    const chelsea = join(fixtureImagesDir, "chelsea.jpg");
    const out = await client(["-u", url("grpc"), "classify", chelsea]);
    expect(out.code, out.stderr).toBe(0);
    const lines = out.stdout.trimEnd().split("\n");
    expect(lines[0]).toBe(`Image '${chelsea}':`);
    expect(lines[1]).toMatch(/^ {4}0\.\d{3} = Egyptian cat$/);
    // --json: the ensemble's answer as it came; the lines above are its top 5, scores to 3 decimals.
    const json = await client(["-u", url("grpc"), "classify", "--json", chelsea]);
    expect(json.code, json.stderr).toBe(0);
    const [name, raw, ...rest] = json.stdout.trimEnd().split("\n");
    expect(name).toBe(`${chelsea}:`);
    expect(rest).toEqual([]);
    expect(raw).toMatch(/^ {2}OUTPUT_RESULTS: \{/);
    const answer = JSON.parse(raw!.replace(/^ {2}OUTPUT_RESULTS: /, "")) as {
      top5_labels: string[];
      top5_probs: number[];
    };
    expect(answer.top5_labels[0]).toBe("Egyptian cat");
    expect(lines.slice(1)).toEqual(
      answer.top5_labels.map((label, k) => `    ${answer.top5_probs[k]!.toFixed(3)} = ${label}`),
    );
  });

  it("reads top-k classes from the ensemble's JSON and from Triton's classification strings", () => {
    expect(topClasses("15.346230:504:COFFEE MUG")).toEqual([{ score: "15.346230", index: 504, label: "COFFEE MUG" }]);
    expect(topClasses("0.5:7")).toEqual([{ score: "0.5", index: 7, label: "" }]);
    expect(topClasses('{"top2_labels": ["Egyptian cat", "tabby"], "top2_probs": [0.6894, 0.1]}')).toEqual([
      { score: "0.689", label: "Egyptian cat" },
      { score: "0.100", label: "tabby" },
    ]);
    expect(topClasses('{"top1_index": [285], "top1_labels": ["Egyptian cat"], "top1_probs": [0.6894]}')).toEqual([
      { score: "0.689", index: 285, label: "Egyptian cat" },
    ]);
    expect(topClasses("hello")).toBeUndefined();
    expect(topClasses('{"a": 1}')).toBeUndefined();
    expect(formatClassification("x.jpg", { image: 0, outputs: { OUT: ["0.25:3:a:b", "plain"] } })).toBe(
      "Image 'x.jpg':\n    0.25 (3) = a:b\n    OUT: plain",
    );
  });

  it("says why when it cannot: an unknown model, a model without an image input, no server", async () => {
    const photo = join(fixtureImagesDir, photos[0] as string);
    expect(await client(["-u", url("grpc"), "-m", "nope", "classify", photo])).toMatchObject({
      code: 1,
      stderr: "trellis-client: NOT_FOUND: Request for unknown model: 'nope' is not found\n",
    });
    const tensorModel = await client(["-u", url("http"), "-i", "http", "-m", "resnet50_inference", "classify", photo]);
    expect(tensorModel.code).toBe(1);
    expect(tensorModel.stderr).toContain("images go into a model's one BYTES input");
    expect(tensorModel.stderr).toContain("this model takes input (FP32)");
    const down = await client(["-u", "127.0.0.1:1", "classify", photo]);
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/^trellis-client: UNAVAILABLE: gRPC 127\.0\.0\.1:1: .*ECONNREFUSED/);
  });
});

describe("perf", () => {
  it("measures each concurrency; the server's own count of the window agrees with the client's", async () => {
    const endpoint = connectEndpoint(url("grpc"), "grpc");
    try {
      const requests = photos.map((p) => ({
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES" as const, shape: [1, 1], data: [readFixtureImage(p)] }],
      }));
      const r = await measure(endpoint, {
        model: "resnet50_ensemble",
        requests,
        batch: 1,
        concurrency: 2,
        windowMs: 3000,
        warmupMs: 300,
      });
      expect(r.requests).toBeGreaterThan(0);
      expect(r.throughput).toBeCloseTo(r.requests / 3, 5);
      expect(r.latencyUs.p50).toBeGreaterThan(0);
      expect(r.latencyUs.p99).toBeGreaterThanOrEqual(r.latencyUs.p50);
      // The ensemble first, then the models it ran; the server also counts the calls still in
      // flight when the window closes (at most one per caller), and may miss a call it finished
      // just before its first count whose answer reached the client inside the window.
      expect(r.server.map((s) => s.model)).toEqual([
        "resnet50_ensemble",
        ...["resnet50_inference", "resnet50_postprocess", "resnet50_preprocess"].filter((m) =>
          r.server.some((s) => s.model === m),
        ),
      ]);
      expect(r.server).toHaveLength(4);
      const ensemble = r.server[0]!;
      expect(ensemble.requests - r.requests).toBeGreaterThanOrEqual(-2);
      expect(ensemble.requests - r.requests).toBeLessThanOrEqual(2 * 2 + 2);
      expect(ensemble.requestUs).toBeGreaterThanOrEqual(ensemble.computeInferUs);
    } finally {
      endpoint.close();
    }
  });

  it("counts a request in the window its answer arrives in, sent before it or not, as perf_analyzer", async () => {
    const real = connectEndpoint(url("grpc"), "grpc");
    // Room for the first answer to arrive in the window while every suite runs beside this one.
    const WINDOW_MS = 3000;
    // Each call is held until the test lets it go: the first until the window has opened (the
    // client opens it right after its first statistics call), the second until it has closed.
    let statisticsCalls = 0;
    let windowOpened = 0;
    const sentAt: number[] = [];
    const held: Endpoint = {
      ...real,
      infer: async (model, request) => {
        const n = sentAt.push(performance.now());
        if (n === 1) await new Promise<void>((go) => (releaseFirst = go));
        else await new Promise((go) => setTimeout(go, Math.max(0, windowOpened + WINDOW_MS + 300 - performance.now())));
        return real.infer(model, request);
      },
      statistics: async (model) => {
        const s = await real.statistics(model);
        if (++statisticsCalls === 1) {
          windowOpened = performance.now();
          setTimeout(() => releaseFirst?.(), 0);
        }
        return s;
      },
    };
    let releaseFirst: (() => void) | undefined;
    const image = {
      inputs: [
        { name: "input", datatype: "FP32" as const, shape: [1, 3, 224, 224], data: new Float32Array(3 * 224 * 224) },
      ],
    };
    try {
      const r = await measure(held, {
        model: "resnet50_inference",
        requests: [image],
        batch: 1,
        concurrency: 1,
        windowMs: WINDOW_MS,
        warmupMs: 50,
      });
      // Sent during the warm-up, answered inside the window: counted (it was not, before).
      expect(sentAt[0]).toBeLessThan(windowOpened);
      expect(r.requests).toBe(1);
      // A window no answer arrives in is refused, as perf_analyzer refuses it.
      sentAt.length = 0;
      statisticsCalls = 0;
      const none = await rejectionOf(
        measure(
          { ...held, infer: (m, q) => new Promise((go) => setTimeout(go, 400)).then(() => real.infer(m, q)) },
          {
            model: "resnet50_inference",
            requests: [image],
            batch: 1,
            concurrency: 1,
            windowMs: 1,
            warmupMs: 0,
          },
        ),
        RangeError,
      );
      expect(none.message).toContain("no request was answered within the 1 ms measurement window");
    } finally {
      real.close();
    }
  });

  it("from the command line, over HTTP with random data shaped by the model's metadata", async () => {
    const out = await client([
      "-i",
      "http",
      "-u",
      url("http"),
      "-m",
      "resnet50_inference",
      "perf",
      "--concurrency-range",
      "1:2",
      "--measurement-interval",
      "3000",
      "--warmup-interval",
      "200",
      "-b",
      "2",
    ]);
    expect(out.code, out.stderr).toBe(0);
    expect(out.stdout).toContain("Input: random data");
    expect(out.stdout).toContain("Batch size: 2");
    for (const c of [1, 2]) {
      const block = out.stdout.split(`Request concurrency: ${c}\n`)[1] ?? "";
      const requests = Number(/Request count: (\d+)/.exec(block)?.[1]);
      expect(requests, `concurrency ${c}`).toBeGreaterThan(0);
      // Batch 2: every request is two inferences, on the server too.
      const server = /resnet50_inference \(version 1\): (\d+) requests, (\d+) inferences/.exec(block);
      expect(Number(server?.[2])).toBe(2 * Number(server?.[1]));
    }
    expect(out.stdout).toMatch(/Concurrency: 2, throughput: [\d.]+ infer\/sec, latency \d+ usec/);
  });

  it("with streaming, each caller sends on a ModelStreamInfer stream of its own and no unary call is made", async () => {
    const real = connectEndpoint(url("grpc"), "grpc");
    const seen = { streams: 0, streamCalls: 0, unaryCalls: 0 };
    // The real endpoint, its calls counted on the way through.
    const counted: Endpoint = {
      ...real,
      infer: (...args) => {
        seen.unaryCalls++;
        return real.infer(...args);
      },
      openStream: (model) => {
        seen.streams++;
        const stream = real.openStream!(model);
        return {
          infer: (request) => {
            seen.streamCalls++;
            return stream.infer(request);
          },
          close: () => stream.close(),
        };
      },
      statistics: (model) => real.statistics(model),
    };
    try {
      const requests = [
        {
          inputs: [
            { name: "RAW_IMAGE", datatype: "BYTES" as const, shape: [1, 1], data: [readFixtureImage(photos[0]!)] },
          ],
        },
      ];
      const r = await measure(counted, {
        model: "resnet50_ensemble",
        requests,
        batch: 1,
        concurrency: 3,
        windowMs: 3000,
        warmupMs: 200,
        streaming: true,
      });
      expect(r.requests).toBeGreaterThan(0);
      expect(seen).toMatchObject({ streams: 3, unaryCalls: 0 });
      expect(seen.streamCalls).toBeGreaterThanOrEqual(r.requests);
      // A stream answers in order, one request at a time, with the model's real answer.
      const stream = real.openStream!("resnet50_ensemble");
      const answer = await stream.infer(requests[0]!);
      stream.close();
      expect(new TextDecoder().decode(answer.outputs[0]!.data[0] as Uint8Array)).toContain(top1(photos[0]!));
    } finally {
      real.close();
    }
  });

  it("with streaming, times a decoupled model's request to its final answer, the stream kept in step", async () => {
    const endpoint = connectEndpoint(url("grpc"), "grpc");
    const ask = (id: string, n: number) => ({
      id,
      inputs: [{ name: "IN", datatype: "INT32" as const, shape: [1], data: Int32Array.of(n) }],
    });
    try {
      // Each request's answers are read to its final one: the next request gets its own.
      const stream = endpoint.openStream!("countdown");
      const first = await stream.infer(ask("a", 3));
      const second = await stream.infer(ask("b", 2));
      stream.close();
      expect([first.id, Number(first.outputs[0]?.data[0]), second.id]).toEqual(["a", 1, "b"]);
      expect(first.parameters?.triton_final_response).toBeUndefined();
      const r = await measure(endpoint, {
        model: "countdown",
        requests: [ask("", 3)],
        batch: 1,
        concurrency: 2,
        windowMs: 600,
        warmupMs: 100,
        streaming: true,
      });
      // One measured request per request the server completed (not one per answer), give or take the window's edges.
      const served = r.server.find((s) => s.model === "countdown")!;
      expect(r.requests).toBeGreaterThan(0);
      expect(served.requests - r.requests).toBeGreaterThanOrEqual(0);
      expect(served.requests - r.requests).toBeLessThanOrEqual(2 * 2 + 2);
    } finally {
      endpoint.close();
    }
  });

  it("drives a stateful model in sequences (--sequence-length), finishing each after the window", async () => {
    const perf = (extra: string[]) =>
      client(["-u", url("grpc"), "-m", "counter", "perf", "-p", "600", "--warmup-interval", "100", ...extra]);
    const refused = await perf([]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("must specify a non-zero or non-empty correlation ID");
    // Two callers, two slots: a sequence left open after the window would hold a slot for the
    // model's 60 s idle limit and the second run's sequences would wait in the backlog.
    for (const ids of ["1:1000", "5000"]) {
      const out = await perf(["--sequence-length", "4", "--concurrency-range", "2", "--sequence-id-range", ids]);
      expect(out.code, out.stderr).toBe(0);
      expect(out.stdout).toContain(`in sequences of 4 (IDs ${ids.includes(":") ? ids : `${ids}:4294967295`})`);
      expect(Number(/Request count: (\d+)/.exec(out.stdout)?.[1])).toBeGreaterThan(0);
    }
    const stats = (await connectEndpoint(url("grpc"), "grpc").statistics("counter"))[0]!;
    // Every sequence was sent whole: the server's count of requests is a multiple of four.
    expect(Number(stats.inferenceStats?.success?.count) % 4).toBe(0);
    // The one failure is the run without --sequence-length: its first request, refused.
    expect(Number(stats.inferenceStats?.fail?.count ?? 0n)).toBe(1);
  });

  it("from the command line over gRPC streams (--streaming), with a CSV latency report (-f)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-perf-"));
    const csv = join(dir, "latency.csv");
    try {
      const before = (await connectEndpoint(url("grpc"), "grpc").statistics("resnet50_ensemble"))[0];
      const out = await client([
        "-u",
        url("grpc"),
        "perf",
        "--streaming",
        "--concurrency-range",
        "2",
        "-p",
        "3000",
        "--warmup-interval",
        "200",
        "-f",
        csv,
        "--input-data",
        join(fixtureImagesDir, photos[0]!),
      ]);
      expect(out.code, out.stderr).toBe(0);
      expect(out.stdout).toContain("Requests: a gRPC stream per caller (ModelStreamInfer)");
      const requests = Number(/Request count: (\d+)/.exec(out.stdout)?.[1]);
      expect(requests).toBeGreaterThan(0);
      // The calls went to the server as stream requests: it counted at least the window's.
      const after = (await connectEndpoint(url("grpc"), "grpc").statistics("resnet50_ensemble"))[0];
      const served = Number(
        (after?.inferenceStats?.success?.count ?? 0n) - (before?.inferenceStats?.success?.count ?? 0n),
      );
      expect(served).toBeGreaterThanOrEqual(requests);
      const [header, row, ...rest] = (await readFile(csv, "utf8")).trimEnd().split("\n");
      expect(header).toBe(
        "Concurrency,Inferences/Second,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency",
      );
      expect(rest).toEqual([]);
      const cells = row!.split(",").map(Number);
      expect(cells[0]).toBe(2);
      expect(cells[1]).toBeCloseTo(requests / 3, 1); // a 3 s window: inferences per second = requests / 3
      expect(cells[4]).toBeGreaterThan(0); // the ensemble's compute infer
      expect(cells[6]).toBe(Number(/p50 latency: (\d+) usec/.exec(out.stdout)?.[1]));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    const http = await client(["-i", "http", "-u", url("http"), "perf", "--streaming"]);
    expect(http.code).toBe(1);
    expect(http.stderr).toContain("--streaming needs -i grpc (ModelStreamInfer)");
  });

  it("sends requests at a fixed rate (--request-rate-range), whatever the answers take", async () => {
    const endpoint = connectEndpoint(url("grpc"), "grpc");
    try {
      const requests = [
        {
          inputs: [
            { name: "RAW_IMAGE", datatype: "BYTES" as const, shape: [1, 1], data: [readFixtureImage(photos[0]!)] },
          ],
        },
      ];
      const r = await measureRate(endpoint, {
        model: "resnet50_ensemble",
        requests,
        batch: 1,
        rate: 20,
        windowMs: 1500,
        warmupMs: 200,
      });
      expect(r.requestRate).toBe(20);
      // What the code controls: 1.5 s at 20 a second is 30 requests sent on schedule (late, not
      // dropped, if this process is held up), and 0.2 s of warm-up is 4 more. The server ran every
      // one of the 30, plus those of the warm-up still running when the window opened. How many
      // were answered within the window (the warm-up's count too, as perf_analyzer counts) depends
      // on how busy the machine is: bounded above only.
      expect(r.sent).toBe(30);
      expect(r.server[0]?.model).toBe("resnet50_ensemble");
      expect(r.server[0]?.requests).toBeGreaterThanOrEqual(30);
      expect(r.server[0]?.requests).toBeLessThanOrEqual(30 + 4);
      expect(r.requests).toBeLessThanOrEqual(30 + 4);
      expect(r.throughput).toBeCloseTo(r.requests / 1.5, 5);
      // An open loop: the barrier answers only when three requests are waiting, so a loop waiting
      // for each answer before its next send would stall; this one sends 3 in the warm-up (0.3 s
      // at 10 a second) and 6 in the window, every three in flight together.
      const barrier = await measureRate(endpoint, {
        model: "barrier",
        requests: [{ inputs: [{ name: "IN", datatype: "INT32", shape: [1], data: Int32Array.of(7) }] }],
        batch: 1,
        rate: 10,
        windowMs: 600,
        warmupMs: 300,
      });
      expect(barrier.sent).toBe(6);
      expect(barrier.concurrency).toBeGreaterThanOrEqual(3);
      expect(barrier.server[0]?.model).toBe("barrier");
      expect(barrier.server[0]?.requests).toBeGreaterThanOrEqual(6);
      expect(barrier.server[0]?.requests).toBeLessThanOrEqual(9);
    } finally {
      endpoint.close();
    }
    const out = await client([
      "-u",
      url("grpc"),
      "perf",
      ...[
        "--request-rate-range",
        "10:20:10",
        "--request-distribution",
        "poisson",
        "-p",
        "2000",
        "--warmup-interval",
        "100",
      ],
      ...["--input-data", join(fixtureImagesDir, photos[0]!)],
    ]);
    expect(out.code, out.stderr).toBe(0);
    expect(out.stdout).toContain("sent at a fixed rate (poisson)");
    // 2 s at 10 a second: 20 sent on average, a Poisson process's count.
    expect(out.stdout).toMatch(/Request Rate: 10 inference requests per seconds \(\d+ sent, at most \d+ in flight\)/);
    expect(out.stdout).toMatch(/Request Rate: 20, throughput: [\d.]+ infer\/sec/);
    const both = await client(["-u", url("grpc"), "perf", "--request-rate-range", "5", "--concurrency-range", "2"]);
    expect(both.code).toBe(1);
    expect(both.stderr).toContain("--request-rate-range and --concurrency-range are two ways to load: choose one");
  });

  it("reads perf_analyzer's --request-rate-range", () => {
    expect(requestRateRange("20")).toEqual([20]);
    expect(requestRateRange("10:13")).toEqual([10, 11, 12, 13]);
    expect(requestRateRange("0.5:1.5:0.5")).toEqual([0.5, 1, 1.5]);
    expect(() => requestRateRange("0")).toThrow(/requests per second > 0/);
    expect(() => requestRateRange("5:2")).toThrow(/end ≥ start/);
  });

  it("reads perf_analyzer's --concurrency-range", () => {
    expect(concurrencyRange("1")).toEqual([1]);
    expect(concurrencyRange("1:4")).toEqual([1, 2, 3, 4]);
    expect(concurrencyRange("2:8:3")).toEqual([2, 5, 8]);
    expect(() => concurrencyRange("4:1")).toThrow(/end ≥ start/);
    expect(() => concurrencyRange("0:2")).toThrow(/whole numbers ≥ 1/);
  });

  it("random data fills every input at the batch size asked", () => {
    const request = randomRequest(
      {
        name: "m",
        versions: ["1"],
        platform: "",
        inputs: [
          { name: "x", datatype: "FP32", shape: [-1, 3] },
          { name: "s", datatype: "BYTES", shape: [-1, 1] },
        ],
        outputs: [],
      },
      4,
    );
    expect(request.inputs.map((t) => [t.name, t.shape, (t.data as ArrayLike<unknown>).length])).toEqual([
      ["x", [4, 3], 12],
      ["s", [4, 1], 4],
    ]);
  });
});
