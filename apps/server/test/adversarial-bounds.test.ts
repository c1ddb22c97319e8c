/**
 * Adversarial, round 2 (issue 31): no single request may crash the server, stall it or reach
 * outside it. Black-box, one explicit-mode server with client shared memory allowed:
 * - a config (a load's override, or the repository's) asking for more instances than
 *   --max-instances-per-model, or timers, queue levels or warmup tensors no process can hold,
 *   is refused 400 / INVALID_ARGUMENT naming the flag or the field, before anything loads;
 * - a load with more files than --max-load-files, or more bytes than --max-load-bytes, is
 *   refused before anything is written, and health answers throughout;
 * - a shared memory key naming a symlink, a folder or a NUL is refused, naming the key;
 * - messages: shapes are not taken for addresses, long file names and hex header lengths are
 *   400s in our words, and the trace-file refusal starts with Triton's.
 * After each, a good request still answers.
 */
import { lstatSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, explicitModels, grpcClientOf, makeRepository, postJson, rawPost } from "./helpers.js";

const stringParam = (value: string) => ({ parameterChoice: { case: "stringParam" as const, value } });
const bytesParam = (value: Uint8Array) => ({ parameterChoice: { case: "bytesParam" as const, value } });

/** The echo model's config as Triton's JSON (named `name`), with `extra` fields at the top level. */
const echoJson = (extra: Record<string, unknown> = {}, name = "echo") => ({
  name,
  backend: "typescript",
  max_batch_size: 8,
  input: [{ name: "INPUT", data_type: "TYPE_FP32", dims: [4] }],
  output: [{ name: "OUTPUT", data_type: "TYPE_FP32", dims: [4] }],
  ...extra,
});

/**
 * A config repeating the repository echo's own parameters (a load may not change them); loads of
 * models the repository does not have carry none.
 */
let echoParameters: Record<string, { string_value: string }>;

const MAX_LOAD_BYTES = 1024 * 1024;
const MAX_INSTANCES = 6;

let repo: string;
let server: ServerProcess;
let client: ReturnType<typeof grpcClientOf>;
beforeAll(async () => {
  const greedy = echoConfig("greedy", { extra: "instance_group [ { count: 1000000 kind: KIND_CPU } ]" });
  const threads = echoConfig("threads", { params: { intra_op_thread_count: "100000" } });
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    greedy: { config: greedy },
    threads: { config: threads },
  });
  echoParameters = { module: { string_value: join(import.meta.dirname, "fixtures", "echo-stage.js") } };
  server = await startServerProcess([
    ...explicitModels(repo, "echo"),
    "--allow-client-shm",
    "true",
    "--max-instances-per-model",
    String(MAX_INSTANCES),
    "--max-load-bytes",
    String(MAX_LOAD_BYTES),
  ]);
  client = grpcClientOf(server);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

async function echoWorks(): Promise<void> {
  const res = await postJson(`${server.http}/v2/models/echo/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
  });
  expect(res.status, JSON.stringify(res.json)).toBe(200);
  expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4]);
}

/** A load of echo with `config` over HTTP, then over gRPC: both refused naming `words`. */
async function expectRefusedBoth(config: object, words: string): Promise<void> {
  const text = JSON.stringify({ ...config, parameters: echoParameters });
  const res = await postJson(`${server.http}/v2/repository/models/echo/load`, { parameters: { config: text } });
  expect(res.status, JSON.stringify(res.json)).toBe(400);
  expect(res.json.error).toContain(words);
  const err = await client
    .repositoryModelLoad({ modelName: "echo", parameters: { config: stringParam(text) } })
    .catch((e: unknown) => ConnectError.from(e));
  expect((err as ConnectError).code).toBe(Code.InvalidArgument);
  expect((err as ConnectError).rawMessage).toContain(words);
}

describe("item 1: a config may not size the server beyond its bounds", () => {
  it("refuses instance_group counts past --max-instances-per-model, over HTTP and gRPC, keeping the loaded model", async () => {
    await expectRefusedBoth(
      echoJson({ instance_group: [{ count: 2147483647, kind: "KIND_CPU" }] }),
      `asks for 2147483647 instances, more than the ${MAX_INSTANCES} allowed; use --max-instances-per-model to raise the limit`,
    );
    // Summed across groups.
    await expectRefusedBoth(
      echoJson({
        instance_group: [
          { count: 4, kind: "KIND_CPU" },
          { count: 4, kind: "KIND_CPU" },
        ],
      }),
      "asks for 8 instances",
    );
    await echoWorks();
    // At the bound, it loads.
    const text = JSON.stringify({
      ...echoJson({ instance_group: [{ count: MAX_INSTANCES, kind: "KIND_CPU" }] }),
      parameters: echoParameters,
    });
    const ok = await postJson(`${server.http}/v2/repository/models/echo/load`, { parameters: { config: text } });
    expect(ok.status, JSON.stringify(ok.json)).toBe(200);
    await echoWorks();
  });

  it("refuses timers, priority levels, sequence slots and warmup tensors no process can hold", async () => {
    await expectRefusedBoth(
      echoJson({ dynamic_batching: { max_queue_delay_microseconds: String(2n ** 62n) } }),
      "dynamic_batching.max_queue_delay_microseconds",
    );
    await expectRefusedBoth(
      echoJson({ dynamic_batching: { default_queue_policy: { default_timeout_microseconds: String(2n ** 62n) } } }),
      "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    );
    await expectRefusedBoth(
      echoJson({ dynamic_batching: { priority_levels: String(2n ** 40n) } }),
      "dynamic_batching.priority_levels",
    );
    await expectRefusedBoth(
      echoJson({ sequence_batching: { max_sequence_idle_microseconds: String(2n ** 62n) } }),
      "sequence_batching.max_sequence_idle_microseconds",
    );
    await expectRefusedBoth(
      echoJson({ sequence_batching: { oldest: { max_candidate_sequences: 2147483647 } } }),
      "sequence_batching.oldest.max_candidate_sequences",
    );
    await expectRefusedBoth(
      echoJson({
        model_warmup: [
          {
            name: "huge",
            batch_size: 8,
            inputs: { INPUT: { data_type: "TYPE_FP32", dims: [1 << 30], zero_data: true } },
          },
        ],
      }),
      "model_warmup 'huge'",
    );
    await expectRefusedBoth(
      echoJson({
        model_warmup: [
          {
            name: "forever",
            batch_size: 1,
            count: 4294967295,
            inputs: { INPUT: { data_type: "TYPE_FP32", dims: [4], zero_data: true } },
          },
        ],
      }),
      "model_warmup 'forever'",
    );
    await echoWorks();
  });

  it("refuses a repository config past the bounds the same way, naming the flag in the index", async () => {
    // Parameters are the operator's (a load may not change them), but a thread count past reason is refused too.
    const threads = await postJson(`${server.http}/v2/repository/models/threads/load`, {});
    expect(threads.status, JSON.stringify(threads.json)).toBe(400);
    expect(threads.json.error).toContain("parameters.intra_op_thread_count 100000 is more than the");
    const res = await postJson(`${server.http}/v2/repository/models/greedy/load`, {});
    expect(res.status, JSON.stringify(res.json)).toBe(400);
    expect(res.json.error).toContain("--max-instances-per-model");
    const index = await postJson(`${server.http}/v2/repository/index`, {});
    const row = (index.json as { name: string; state: string; reason: string }[]).find((m) => m.name === "greedy");
    expect(row?.state).toBe("UNAVAILABLE");
    expect(row?.reason).toContain("asks for 1000000 instances");
    await echoWorks();
  });
});

describe("item 2: a load's files are bounded, and the server answers while it runs", () => {
  /** Health answered while `work` ran: every answer's status, and the slowest in ms. */
  async function healthDuring<T>(work: Promise<T>): Promise<{ result: T; statuses: number[]; worstMs: number }> {
    const statuses: number[] = [];
    let worstMs = 0;
    let done = false;
    const probe = (async () => {
      while (!done) {
        const started = performance.now();
        const res = await fetch(`${server.http}/v2/health/live`, { signal: AbortSignal.timeout(15_000) });
        statuses.push(res.status);
        worstMs = Math.max(worstMs, performance.now() - started);
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    try {
      return { result: await work, statuses, worstMs };
    } finally {
      done = true;
      await probe;
    }
  }

  it("refuses 20,000 file entries (HTTP and gRPC) naming --max-load-files, health answering throughout", async () => {
    const parameters: Record<string, string> = {
      config: JSON.stringify(echoJson({}, "many")),
    };
    for (let i = 0; i < 20_000; i++) parameters[`file:1/f${i}`] = "";
    const http = await healthDuring(postJson(`${server.http}/v2/repository/models/many/load`, { parameters }));
    expect(http.result.status, JSON.stringify(http.result.json)).toBe(400);
    // Counted before the body is parsed, and only as far as the limit.
    expect(http.result.json.error).toContain(
      "the request carries more than the 1000 file overrides allowed; use --max-load-files to raise the limit",
    );
    expect(http.statuses.every((s) => s === 200)).toBe(true);
    console.log(`HTTP load of 20,000 files: worst /v2/health/live ${http.worstMs.toFixed(1)} ms`);

    const grpcParameters: Record<string, ReturnType<typeof bytesParam> | ReturnType<typeof stringParam>> = {
      config: stringParam(parameters.config as string),
    };
    for (let i = 0; i < 20_000; i++) grpcParameters[`file:1/f${i}`] = bytesParam(new Uint8Array(0));
    const grpc = await healthDuring(
      client
        .repositoryModelLoad({ modelName: "many", parameters: grpcParameters })
        .catch((e: unknown) => ConnectError.from(e)),
    );
    expect((grpc.result as ConnectError).code).toBe(Code.InvalidArgument);
    expect((grpc.result as ConnectError).rawMessage).toBe(
      "failed to load 'many': the request carries more than the 1000 file overrides allowed; use --max-load-files to raise the limit",
    );
    expect(grpc.statuses.every((s) => s === 200)).toBe(true);
    console.log(`gRPC load of 20,000 files: worst /v2/health/live ${grpc.worstMs.toFixed(1)} ms`);
    await echoWorks();
  });

  it("refuses files past --max-load-bytes in all, writing nothing", async () => {
    const half = new Uint8Array(MAX_LOAD_BYTES / 2 + 1);
    const config = stringParam(JSON.stringify(echoJson({}, "heavy")));
    const err = await client
      .repositoryModelLoad({
        modelName: "heavy",
        parameters: { config, "file:1/a.bin": bytesParam(half), "file:1/b.bin": bytesParam(half) },
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toContain(
      `more than the ${MAX_LOAD_BYTES} bytes allowed; use --max-load-bytes to raise the limit`,
    );
    const res = await postJson(`${server.http}/v2/repository/models/heavy/load`, {
      parameters: {
        config: config.parameterChoice.value,
        "file:1/a.bin": Buffer.from(half).toString("base64"),
        "file:1/b.bin": Buffer.from(half).toString("base64"),
      },
    });
    expect(res.status).toBe(400);
    expect(res.json.error).toContain("--max-load-bytes");
    await echoWorks();
  });
});

describe("item 3: shared memory opens only the object itself", () => {
  const key = (what: string) => `/trellis-bounds-${process.pid}-${what}`;
  let victimDir: string;
  let victim: string;
  beforeAll(async () => {
    victimDir = await mkdtemp(join(tmpdir(), "trellis-shm-victim-"));
    victim = join(victimDir, "precious.txt");
    writeFileSync(victim, "precious bytes, not a tensor");
    symlinkSync(victim, `/dev/shm${key("link")}`);
    mkdirSync(`/dev/shm${key("dir")}`);
  });
  afterAll(async () => {
    rmSync(`/dev/shm${key("link")}`, { force: true });
    rmSync(`/dev/shm${key("dir")}`, { recursive: true, force: true });
    await removeDir(victimDir);
  });

  it("refuses a key naming a symlink (to a file elsewhere) or a folder, over HTTP and gRPC, naming the key", async () => {
    expect(lstatSync(`/dev/shm${key("link")}`).isSymbolicLink()).toBe(true);
    for (const what of ["link", "dir"]) {
      const res = await postJson(`${server.http}/v2/systemsharedmemory/region/r-${what}/register`, {
        key: key(what),
        byte_size: 8,
      });
      // As tritonserver, whose shm_open neither follows a link nor opens a folder: INTERNAL, in its words.
      expect(res.status, JSON.stringify(res.json)).toBe(500);
      expect(res.json.error).toBe(`Unable to open shared memory region: '${key(what)}'`);
      const err = await client
        .systemSharedMemoryRegister({ name: `g-${what}`, key: key(what), byteSize: 8n })
        .catch((e: unknown) => ConnectError.from(e));
      expect((err as ConnectError).code).toBe(Code.Internal);
      expect((err as ConnectError).rawMessage).toBe(`Unable to open shared memory region: '${key(what)}'`);
    }
    expect((await client.systemSharedMemoryStatus({})).regions).toEqual({});
    expect(readFileSync(victim, "utf8")).toBe("precious bytes, not a tensor");
    await echoWorks();
  });
});

describe("item 5: messages", () => {
  it("shows a one-number shape as the shape, over HTTP and gRPC", async () => {
    const res = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [2], data: [1, 2] }],
    });
    expect(res.status).toBe(400);
    expect(res.json.error).toContain("got [2]");
    expect(res.json.error).not.toContain("<address>");
    const err = await client
      .modelInfer({
        modelName: "echo",
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [2n] }],
        rawInputContents: [new Uint8Array(8)],
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toContain("got [2]");
  });

  it("refuses a 5,000-character file name and a NUL in a shared memory key 400 in our words", async () => {
    const config = JSON.stringify(echoJson({}, "longname"));
    const long = `1/${"a".repeat(5000)}`;
    const res = await postJson(`${server.http}/v2/repository/models/longname/load`, {
      parameters: { config, [`file:${long}`]: "" },
    });
    expect(res.status, JSON.stringify(res.json)).toBe(400);
    expect(res.json.error).toContain("is too long");
    expect(res.json.error).not.toContain("ENAMETOOLONG");
    const err = await client
      .repositoryModelLoad({
        modelName: "longname",
        parameters: { config: stringParam(config), [`file:${long}`]: bytesParam(new Uint8Array(0)) },
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toContain("is too long");

    const nul = await postJson(`${server.http}/v2/systemsharedmemory/region/nul/register`, {
      key: "/trellis\u0000x",
      byte_size: 8,
    });
    expect(nul.status).toBe(400);
    expect(nul.json.error).toContain("is not a shared memory object name");
    expect(nul.json.error).not.toContain("The argument");
    const grpcNul = await client
      .systemSharedMemoryRegister({ name: "nul", key: "/trellis\u0000x", byteSize: 8n })
      .catch((e: unknown) => ConnectError.from(e));
    expect((grpcNul as ConnectError).code).toBe(Code.InvalidArgument);
    expect((grpcNul as ConnectError).rawMessage).not.toContain("The argument");
  });

  it("refuses an Inference-Header-Content-Length that is not a decimal byte count", async () => {
    const header = Buffer.from(
      JSON.stringify({
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], parameters: { binary_data_size: 16 } }],
      }),
    );
    const body = Buffer.concat([header, Buffer.from(new Float32Array([1, 2, 3, 4]).buffer)]);
    for (const length of [`0x${header.byteLength.toString(16)}`, `${header.byteLength}.0`, `+${header.byteLength}`]) {
      const res = await rawPost(`${server.http}/v2/models/echo/infer`, body, {
        "content-type": "application/octet-stream",
        "inference-header-content-length": length,
      });
      expect(res.status, `${length}: ${res.body.toString()}`).toBe(400);
      expect(res.body.toString()).toContain("Unable to parse inference header size");
    }
    const ok = await rawPost(`${server.http}/v2/models/echo/infer`, body, {
      "content-type": "application/octet-stream",
      "inference-header-content-length": String(header.byteLength),
    });
    expect(ok.status).toBe(200);
  });

  it("refuses tracing without a trace file in Triton's words first, over HTTP and gRPC", async () => {
    const triton = "Attempting to set invalid trace setting :trace file name is not given";
    const res = await postJson(`${server.http}/v2/trace/setting`, { trace_level: ["TIMESTAMPS"] });
    expect(res.status).toBe(400);
    expect(res.json.error.startsWith(triton), res.json.error).toBe(true);
    const err = await client
      .traceSetting({ settings: { trace_level: { value: ["TIMESTAMPS"] } } })
      .catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage.startsWith(triton)).toBe(true);
  });
});
