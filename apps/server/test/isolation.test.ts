/**
 * Issue 30, "A request's failure stays its own": the dynamic batcher merges requests, and one
 * request that a merged batch cannot compute must fail alone, while the requests it was merged
 * with get their own answers.
 *
 * 1. The seed repository as models/ ships it (resnet50_preprocess: dynamic_batching, two
 *    instances), with the shared MobileNetV2 as resnet50_inference: for a fixed window, good
 *    photos and bad images (a truncated JPEG, bytes that are no image, a JPEG cut right after
 *    its header) from concurrent clients over HTTP, gRPC unary and one ModelStreamInfer stream
 *    at once. Every good request gets the top-1 it gets alone, every bad one its own refusal,
 *    and preprocess did merge requests meanwhile (its batch statistics).
 * 2. A user's model.mjs (defineStage) under dynamic_batching that cannot compute one request's
 *    values: a held first execution makes the others queue, so they are merged into one batch
 *    for certain; only the bad request fails, each other gets its own rows.
 */
import { existsSync } from "node:fs";
import { readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { type ModelInferRequest, ModelInferRequestSchema, type ModelStreamInferResponse } from "@trellis/protocol";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  addModel,
  floats,
  grpcClientOf,
  jsonOf,
  makeRepository,
  metricValue,
  postBinary,
  postJson,
  scrape,
  unframe,
} from "./helpers.js";

type Protocol = "http" | "grpc" | "stream";
const PROTOCOLS: Protocol[] = ["http", "grpc", "stream"];

/** Polls `check` (the server's or the module's state) until it holds, for at most `ms`. */
async function until(check: () => boolean | Promise<boolean>, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** What one request came back with: its answer (top-5 JSON text, or FP32 values), or its refusal. */
type Outcome = { ok: true; text: string; values?: number[] } | { ok: false; code: string; message: string };

const errorOutcome = (err: unknown): Outcome =>
  err instanceof ConnectError
    ? { ok: false, code: Code[err.code] ?? String(err.code), message: err.rawMessage }
    : { ok: false, code: "client", message: String(err) };

describe("the seed ensemble under load with bad images among good photos", () => {
  const ENSEMBLE = "resnet50_ensemble";
  const PREPROCESS = "resnet50_preprocess";
  const GOOD = ["chelsea.jpg", "coffee.jpg", "camera.jpg", "motorcycle_left.jpg", "rocket.jpg"];
  const chelsea = readFixtureImage("chelsea.jpg");
  /** Binary bytes with no image signature (and not base64 text). */
  const noImage = Uint8Array.from({ length: 256 }, (_, i) => (i * 37) % 256);
  const BAD: { kind: string; bytes: Uint8Array; problem: RegExp }[] = [
    { kind: "truncated.jpg", bytes: readFixtureImage(TRUNCATED_PHOTO), problem: /truncated or corrupt jpeg/ },
    { kind: "no image", bytes: noImage, problem: /not an image: no known image signature \(first bytes 00 25 4a/ },
    { kind: "chelsea.jpg's first 600 bytes", bytes: chelsea.slice(0, 600), problem: /truncated or corrupt jpeg/ },
  ];
  /** How a bad request's refusal reads: its own element 0, its own problem, and nothing else's. */
  const refusal = (problem: RegExp) =>
    new RegExp(`^${ENSEMBLE}: step 0 ${PREPROCESS}: INVALID_ARGUMENT: input RAW_IMAGE element 0: ${problem.source}`);
  const WINDOW_MS = 10_000;
  /** Requests one client sends at most (the window ends the loops first). */
  const MAX_PER_CLIENT = 400;
  const GOOD_CLIENTS = { http: 8, grpc: 8, stream: 4 };
  const BAD_CLIENTS = { http: 2, grpc: 2, stream: 2 };

  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeSeedRepository({ prefix: "trellis-isolation-" });
    server = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  const photoBytes = new Map(GOOD.map((p) => [p, readFixtureImage(p)]));
  const request = (id: string, image: Uint8Array): ModelInferRequest =>
    create(ModelInferRequestSchema, {
      modelName: ENSEMBLE,
      id,
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([image])],
    });

  /** The ensemble over HTTP, RAW_IMAGE in the binary extension (the bytes exactly), the answer as JSON. */
  async function overHttp(image: Uint8Array): Promise<Outcome> {
    try {
      const res = await postBinary(
        `${server.http}/v2/models/${ENSEMBLE}/infer`,
        { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
        [frameBytes([image])],
      );
      const json = await jsonOf(res);
      if (res.status !== 200) return { ok: false, code: `HTTP ${res.status}`, message: String(json.error) };
      return { ok: true, text: String(json.outputs[0].data[0]) };
    } catch (err) {
      return errorOutcome(err);
    }
  }

  let grpcClient: ReturnType<typeof grpcClientOf>;
  async function overGrpc(id: string, image: Uint8Array): Promise<Outcome> {
    try {
      const res = await grpcClient.modelInfer(request(id, image), { timeoutMs: 30_000 });
      return { ok: true, text: unframe(res.rawOutputContents[0] as Uint8Array)[0] as string };
    } catch (err) {
      return errorOutcome(err);
    }
  }

  /**
   * One ModelStreamInfer stream shared by `slots` clients, each sending its next request once
   * its previous answer arrived (matched by id). Returns the stream's send function and a close.
   */
  function openStream(slots: number) {
    const queue: ModelInferRequest[] = [];
    const waiting = new Map<string, (o: Outcome) => void>();
    let open = slots;
    let wake: (() => void) | undefined;
    let broken: string | undefined;
    async function* requests() {
      for (;;) {
        while (queue.length > 0) yield queue.shift() as ModelInferRequest;
        if (open === 0 || broken) return;
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        wake = undefined;
      }
    }
    const failAll = (message: string) => {
      broken ??= message;
      for (const resolve of waiting.values()) resolve({ ok: false, code: "stream", message });
      waiting.clear();
      wake?.();
    };
    const reader = (async () => {
      try {
        for await (const a of grpcClient.modelStreamInfer(requests(), { timeoutMs: WINDOW_MS + 30_000 })) {
          const id = a.inferResponse?.id ?? "";
          const resolve = waiting.get(id);
          if (!resolve) {
            failAll(`an answer with unknown id '${id}': ${a.errorMessage}`);
            return;
          }
          waiting.delete(id);
          resolve(streamOutcome(a));
        }
        failAll("the stream ended with requests unanswered");
      } catch (err) {
        failAll(`the stream failed: ${String(err)}`);
      }
    })();
    return {
      send(id: string, image: Uint8Array): Promise<Outcome> {
        if (broken) return Promise.resolve({ ok: false, code: "stream", message: broken });
        const answer = new Promise<Outcome>((resolve) => waiting.set(id, resolve));
        queue.push(request(id, image));
        wake?.();
        return answer;
      },
      /** One slot is done sending; the last one closes the request side. */
      done() {
        open -= 1;
        wake?.();
      },
      reader,
    };
  }

  const streamOutcome = (a: ModelStreamInferResponse): Outcome => {
    if (a.errorMessage) return { ok: false, code: "stream error", message: a.errorMessage };
    return { ok: true, text: unframe(a.inferResponse?.rawOutputContents[0] as Uint8Array)[0] as string };
  };

  const top1 = (text: string) => (JSON.parse(text) as { top5_labels: string[] }).top5_labels[0];

  /** ModelStatistics of resnet50_preprocess over HTTP. */
  async function preprocessStats(): Promise<{
    inference_count: number;
    execution_count: number;
    batch_stats: { batch_size: number; compute_infer: { count: number } }[];
  }> {
    const res = await fetch(`${server.http}/v2/models/${PREPROCESS}/stats`);
    expect(res.status).toBe(200);
    return (await jsonOf(res)).model_stats[0];
  }

  it("answers every good request as it is answered alone and refuses each bad one with its own problem, over HTTP, gRPC and a stream at once", async () => {
    grpcClient = grpcClientOf(server);
    // The answer each photo gets alone, one request at a time.
    const alone = new Map<string, string>();
    for (const p of GOOD) {
      const o = await overHttp(photoBytes.get(p) as Uint8Array);
      expect(o.ok, `${p} alone: ${o.ok ? "" : o.message}`).toBe(true);
      if (o.ok) alone.set(p, top1(o.text) as string);
      const viaGrpc = await overGrpc(`alone-${p}`, photoBytes.get(p) as Uint8Array);
      expect(viaGrpc.ok && top1(viaGrpc.text), `${p} alone over gRPC`).toBe(alone.get(p));
    }
    // And each bad image alone: refused, naming its problem.
    for (const bad of BAD) {
      const o = await overHttp(bad.bytes);
      expect(o, bad.kind).toMatchObject({ ok: false, code: "HTTP 400" });
      expect(o.ok ? "" : o.message, bad.kind).toMatch(refusal(bad.problem));
    }
    const before = await preprocessStats();

    const tally = Object.fromEntries(PROTOCOLS.map((p) => [p, { good: 0, goodFailed: 0, bad: 0, badWrong: 0 }]));
    const problems: string[] = [];
    const badKindsSent = new Set<string>();
    const deadline = Date.now() + WINDOW_MS;
    const stream = openStream(GOOD_CLIENTS.stream + BAD_CLIENTS.stream);
    const send = (protocol: Protocol, id: string, image: Uint8Array) =>
      protocol === "http" ? overHttp(image) : protocol === "grpc" ? overGrpc(id, image) : stream.send(id, image);

    async function goodClient(protocol: Protocol, client: number): Promise<void> {
      for (let n = 0; n < MAX_PER_CLIENT && Date.now() < deadline; n++) {
        const photo = GOOD[(client + n) % GOOD.length] as string;
        const o = await send(protocol, `good-${client}-${n}`, photoBytes.get(photo) as Uint8Array);
        tally[protocol]!.good += 1;
        if (!o.ok) {
          tally[protocol]!.goodFailed += 1;
          problems.push(`good ${protocol} ${photo} failed: ${o.code}: ${o.message}`);
        } else if (top1(o.text) !== alone.get(photo)) {
          tally[protocol]!.goodFailed += 1;
          problems.push(`good ${protocol} ${photo} answered ${top1(o.text)}, alone ${alone.get(photo)}`);
        }
      }
    }
    async function badClient(protocol: Protocol, client: number): Promise<void> {
      for (let n = 0; n < MAX_PER_CLIENT && Date.now() < deadline; n++) {
        const bad = BAD[(client + n) % BAD.length] as (typeof BAD)[number];
        badKindsSent.add(bad.kind);
        const o = await send(protocol, `bad-${client}-${n}`, bad.bytes);
        tally[protocol]!.bad += 1;
        const code = { http: "HTTP 400", grpc: "InvalidArgument", stream: "stream error" }[protocol];
        if (o.ok || o.code !== code || !refusal(bad.problem).test(o.message)) {
          tally[protocol]!.badWrong += 1;
          problems.push(`bad ${protocol} ${bad.kind}: ${o.ok ? "answered" : `${o.code}: ${o.message}`}`);
        }
      }
    }
    const clients: Promise<void>[] = [];
    for (const protocol of PROTOCOLS) {
      const mine: Promise<void>[] = [];
      for (let c = 0; c < GOOD_CLIENTS[protocol]; c++) mine.push(goodClient(protocol, c));
      for (let c = 0; c < BAD_CLIENTS[protocol]; c++) mine.push(badClient(protocol, c));
      // Each stream slot that is done sending tells the stream; the last one closes its request side.
      if (protocol === "stream") for (const slot of mine) void slot.finally(() => stream.done());
      clients.push(...mine);
    }
    await Promise.all(clients);
    await stream.reader;
    const after = await preprocessStats();

    const merged = after.batch_stats
      .filter((b) => b.batch_size > 1)
      .map((b) => {
        const was = before.batch_stats.find((x) => x.batch_size === b.batch_size)?.compute_infer.count ?? 0;
        return { size: b.batch_size, executions: b.compute_infer.count - was };
      })
      .filter((b) => b.executions > 0);
    const inferences = after.inference_count - before.inference_count;
    const executions = after.execution_count - before.execution_count;
    console.log(
      `issue 30 load, ${WINDOW_MS / 1000} s: ${JSON.stringify(tally)}; ` +
        `preprocess: ${inferences} inferences in ${executions} executions, merged batches (size: count) ` +
        `${merged.map((b) => `${b.size}: ${b.executions}`).join(", ")}`,
    );
    const sample = PROTOCOLS.flatMap((p) => [...new Set(problems.filter((x) => x.split(" ")[1] === p))].slice(0, 3));
    for (const protocol of PROTOCOLS) {
      const t = tally[protocol]!;
      expect(t.good, `good ${protocol} requests made`).toBeGreaterThanOrEqual(GOOD_CLIENTS[protocol]);
      expect(t.bad, `bad ${protocol} requests made`).toBeGreaterThanOrEqual(BAD_CLIENTS[protocol]);
    }
    // Per protocol: good requests that failed (or got another answer than alone), bad ones not refused with their own problem.
    const wrong = Object.fromEntries(
      PROTOCOLS.map((p) => [p, { goodFailed: tally[p]!.goodFailed, badWrong: tally[p]!.badWrong }]),
    );
    const none = Object.fromEntries(PROTOCOLS.map((p) => [p, { goodFailed: 0, badWrong: 0 }]));
    expect(wrong, `of ${JSON.stringify(tally)}; e.g.\n${sample.join("\n")}`).toEqual(none);
    expect([...badKindsSent].sort()).toEqual(BAD.map((b) => b.kind).sort());
    // Isolation under real batching: preprocess merged requests while the bad ones were among them.
    expect(merged.length, "preprocess executions of more than one request").toBeGreaterThan(0);
  }, 90_000);
});

describe("a user's TypeScript stage with dynamic_batching that cannot compute one request", () => {
  const MODEL = "doubler";
  /** The first value of the held request: its execution waits for the test's release file. */
  const HOLD = 1000;
  /** Concurrent requests merged into one batch each round (max_batch_size 16). */
  const N = 14;
  let repo: string;
  let server: ServerProcess;
  const record = (name: string) => join(repo, name);

  /** OUTPUT = INPUT * 2; refuses a batch holding a negative value; records each execution's rows. */
  const moduleText = (dir: string) => `import { appendFileSync, existsSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { Code, StageError, defineStage } from "@trellis/stage";
const DIR = ${JSON.stringify(dir)};
export function createStage({ config, version }) {
  return defineStage({ config, version, async compute(request) {
    const input = request.inputs.find((t) => t.name === "INPUT");
    appendFileSync(DIR + "/batches.log", input.shape[0] + "\\n");
    if (input.data[0] === ${HOLD}) {
      const round = input.data[1];
      writeFileSync(DIR + "/started-" + round, "");
      for (let i = 0; i < 1500 && !existsSync(DIR + "/release-" + round); i++) await sleep(10);
    }
    for (const v of input.data) {
      if (v < 0) throw new StageError(Code.InvalidArgument, config.name, "INPUT holds a negative value (" + v + "), which this model cannot compute");
    }
    return [{ name: "OUTPUT", datatype: "FP32", shape: input.shape, data: Float32Array.from(input.data, (v) => v * 2) }];
  } });
}
`;

  beforeAll(async () => {
    repo = await makeRepository({});
    await addModel(repo, MODEL, {
      config: `name: "${MODEL}"
backend: "typescript"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 5000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
`,
      files: { "1/model.mjs": moduleText(repo) },
    });
    server = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  const inferHttp = async (values: number[]): Promise<Outcome> => {
    const { status, json } = await postJson(`${server.http}/v2/models/${MODEL}/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: values }],
    });
    if (status !== 200) return { ok: false, code: `HTTP ${status}`, message: String(json.error) };
    expect(json.outputs[0]).toMatchObject({ name: "OUTPUT", shape: [1, 4] });
    return { ok: true, text: "", values: json.outputs[0].data };
  };
  const inferGrpc = async (client: ReturnType<typeof grpcClientOf>, values: number[]): Promise<Outcome> => {
    try {
      const res = await client.modelInfer(
        create(ModelInferRequestSchema, {
          modelName: MODEL,
          inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
          rawInputContents: [new Uint8Array(Float32Array.from(values).buffer)],
        }),
        { timeoutMs: 30_000 },
      );
      expect(res.outputs[0]?.shape).toEqual([1n, 4n]);
      return { ok: true, text: "", values: [...floats(res.rawOutputContents[0] as Uint8Array)] };
    } catch (err) {
      return errorOutcome(err);
    }
  };
  const batchesSeen = async () =>
    (await readFile(record("batches.log"), "utf8").catch(() => ""))
      .split("\n")
      .filter((l) => l !== "")
      .map(Number);

  for (const [round, badOver] of [
    [1, "grpc"],
    [2, "http"],
  ] as const) {
    it(`fails only the bad request of ${N} merged ones (bad one over ${badOver}); the others get their own rows`, async () => {
      const client = grpcClientOf(server);
      const seenBefore = (await batchesSeen()).length;
      // A held execution keeps the one instance busy, so the N requests queue and merge into one batch.
      const held = inferHttp([HOLD, round, 0, 0]);
      try {
        await until(() => existsSync(record(`started-${round}`)), "the held execution to start");
        const BAD = 5;
        const rows = Array.from({ length: N }, (_, i) => {
          const base = round * 100 + i + 1;
          return i === BAD
            ? [base, -1.5 * round, base + 0.5, base + 0.75]
            : [base, base + 0.25, base + 0.5, base + 0.75];
        });
        const overHttp = (i: number) => (i === BAD ? badOver === "http" : i % 2 === 0);
        const answers = rows.map((values, i) => (overHttp(i) ? inferHttp(values) : inferGrpc(client, values)));
        const pending = async () =>
          metricValue(await scrape(server), "nv_inference_pending_request_count", MODEL) === N;
        await until(pending, `${N} requests queued behind the held one`);
        await writeFile(record(`release-${round}`), "");
        const outcomes = await Promise.all(answers);
        expect(await held).toEqual({ ok: true, text: "", values: [HOLD * 2, round * 2, 0, 0] });

        const seen = (await batchesSeen()).slice(seenBefore);
        const goodFailed = outcomes.filter((o, i) => i !== BAD && !o.ok).length;
        console.log(
          `issue 30 user stage, round ${round}: ${N} requests (1 bad over ${badOver}), ` +
            `${goodFailed} of ${N - 1} good ones failed; rows per compute call: ${seen.join(", ")}`,
        );
        // Merged for certain: the first execution after the held one had every queued request's row.
        expect(seen.slice(0, 2)).toEqual([1, N]);
        rows.forEach((values, i) => {
          const o = outcomes[i] as Outcome;
          if (i === BAD) {
            const code = badOver === "http" ? "HTTP 400" : "InvalidArgument";
            expect(o, `the bad request (${values})`).toMatchObject({ ok: false, code });
            expect(o.ok ? "" : o.message).toBe(
              `${MODEL}: INPUT holds a negative value (${-1.5 * round}), which this model cannot compute`,
            );
          } else {
            // Its own rows: never another request's, never another request's error.
            expect(o, `request ${i} (${values}) of which ${goodFailed} good ones failed`).toEqual({
              ok: true,
              text: "",
              values: values.map((v) => v * 2),
            });
          }
        });
      } finally {
        await writeFile(record(`release-${round}`), "");
        await held.catch(() => undefined);
        await rm(record(`started-${round}`), { force: true });
      }
    });
  }
});
