/**
 * One request's failure stays its own: a merged batch that fails is bisected (without
 * amplification: a re-run budget, then a quarantine lane for content that keeps failing), and an executor that answers each request (Triton's execute(requests)) fails only
 * the one it gives an error.
 */
import { create } from "@bufbuild/protobuf";
import { ModelDynamicBatchingSchema, parseModelConfig } from "@trellis/protocol";
import {
  Code,
  defineStage,
  type InferRequest,
  type RequestOutcome,
  StageError,
  StatisticsRecorder,
  type Tensor,
  tensor,
} from "@trellis/stage";
import { InstanceEndedError } from "@trellis/stage/backend";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it, vi } from "vitest";
import { createModelRuntime, stageBackend } from "../src/model-runtime.js";
import { type BatchContext, createDynamicBatcher, type RequestsExecutor } from "../src/schedulers/dynamic/batcher.js";

/** A request of `rows` rows of x [rows, 2]; a negative seed makes every value negative. */
function req(rows: number, seed: number, id = `r${seed}`): InferRequest {
  const data = Float32Array.from({ length: rows * 2 }, (_, i) => seed * 100 + Math.sign(seed || 1) * (i + 1));
  return { id, inputs: [tensor("x", "FP32", [rows, 2], data)] };
}

type InferResponseLike = { outputs: Tensor[] };
const doubled = (t: Tensor) => Array.from(t.data as Float32Array, (v) => v * 2);

/**
 * A batcher whose first execution waits for `release`, so the requests sent meanwhile are all
 * queued and form one batch when it ends (instances 1, the delay strategy off).
 */
function held(execute: { merged?: (x: Tensor) => Tensor[]; perRequest?: RequestsExecutor }) {
  const calls: { rows: number[] }[] = [];
  let release!: () => void;
  const first = new Promise<void>((r) => {
    release = r;
  });
  const wait = async () => {
    if (calls.length === 1) await first;
  };
  const recorder = new StatisticsRecorder("m", "1");
  const batcher = createDynamicBatcher({
    name: "m",
    maxBatchSize: 32,
    dynamicBatching: create(ModelDynamicBatchingSchema, {}),
    instances: 1,
    recorder,
    ...(execute.merged
      ? {
          computeBatch: async (batch: InferRequest, ctx: BatchContext) => {
            calls.push({ rows: ctx.requests.map((r) => r.inputs[0]!.shape[0]!) });
            await wait();
            return { outputs: execute.merged!(batch.inputs[0]!) };
          },
        }
      : {
          executeRequests: async (requests: readonly InferRequest[], ctx: BatchContext) => {
            calls.push({ rows: requests.map((r) => r.inputs[0]!.shape[0]!) });
            await wait();
            return execute.perRequest!(requests, ctx);
          },
        }),
  });
  return { batcher, calls, release, recorder };
}

/** y = 2x, refusing any negative value (a whole batch fails for one request's values). */
function twice(x: Tensor): Tensor[] {
  const values = x.data as Float32Array;
  const negative = values.find((v) => v < 0);
  if (negative !== undefined) {
    throw new StageError(Code.InvalidArgument, "m", `x holds a negative value (${negative})`);
  }
  return [
    tensor(
      "y",
      "FP32",
      [...x.shape],
      Float32Array.from(values, (v) => v * 2),
    ),
  ];
}

describe("a merged batch that fails", () => {
  it("is bisected: only the culprit fails, the others get their own rows", async () => {
    const { batcher, calls, release, recorder } = held({ merged: twice });
    const first = batcher.infer(req(1, 1));
    const goods = [req(1, 2), req(3, 3), req(2, 4), req(1, 5)];
    const bad = req(2, -6);
    const answers = [goods[0]!, goods[1]!, bad, goods[2]!, goods[3]!].map((r) =>
      batcher.infer(r).then(
        (res) => res,
        (err: unknown) => err,
      ),
    );
    release();
    await first;
    const settled = await Promise.all(answers);
    // The batch of five merged (9 rows) failed, then was bisected: [1,3,2] failed → [1,3] ok, [2] failed alone; [2,1] ok.
    expect(calls.map((c) => c.rows)).toEqual([[1], [1, 3, 2, 2, 1], [1, 3, 2], [1, 3], [2], [2, 1]]);
    expect(recorder.isolation()).toEqual({ reruns: 4, quarantined: 0 });
    const err = settled[2] as StageError;
    expect(err).toBeInstanceOf(StageError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/negative value \(-/);
    const goodAnswers = settled.filter((_, i) => i !== 2) as Awaited<ReturnType<typeof batcher.infer>>[];
    for (const [i, res] of goodAnswers.entries()) {
      expect(res.id).toBe(goods[i]!.id);
      expect(res.outputs[0]!.shape).toEqual(goods[i]!.inputs[0]!.shape);
      expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual(doubled(goods[i]!.inputs[0]!));
    }
    const stats = recorder.snapshot();
    expect(stats.inferenceStats?.success?.count).toBe(5n);
    expect(stats.inferenceStats?.fail?.count).toBe(1n);
  });

  it("finds one culprit among 16 in 2·log2(16) = 8 re-runs, each as large as it can be", async () => {
    const { batcher, calls, release, recorder } = held({ merged: twice });
    const first = batcher.infer(req(1, 1));
    const requests = Array.from({ length: 16 }, (_, i) => req(1, i === 11 ? -7 : i + 2));
    const answers = requests.map((r) =>
      batcher.infer(r).then(
        (res) => res,
        (err: unknown) => err,
      ),
    );
    release();
    await first;
    const settled = await Promise.all(answers);
    expect(calls.slice(2).map((c) => c.rows.length)).toEqual([8, 8, 4, 2, 2, 1, 1, 4]);
    expect(recorder.isolation()).toEqual({ reruns: 8, quarantined: 0 });
    for (const [i, answer] of settled.entries()) {
      if (i === 11) expect((answer as StageError).rawMessage).toMatch(/negative value \(-7/);
      else
        expect(Array.from((answer as InferResponseLike).outputs[0]!.data as Float32Array)).toEqual(
          doubled(requests[i]!.inputs[0]!),
        );
    }
  });

  it("runs content that failed alone in its lane while the re-run budget is not full; good ones keep merging", async () => {
    const recorder = new StatisticsRecorder("m", "1");
    const calls: number[][] = [];
    let gate: Promise<void> = Promise.resolve();
    const batcher = createDynamicBatcher({
      name: "m",
      maxBatchSize: 32,
      dynamicBatching: create(ModelDynamicBatchingSchema, {}),
      instances: 1,
      recorder,
      // `execute`, the deprecated name of computeBatch, still works.
      execute: async (batch: InferRequest, ctx: BatchContext) => {
        calls.push(ctx.requests.map((r) => (r.inputs[0]!.data as Float32Array)[0]!));
        if ((batch.inputs[0]!.data as Float32Array)[0] === 99_901) await gate; // the round's blocker
        return { outputs: twice(batch.inputs[0]!) };
      },
    });
    const bad = () => req(1, -5, "bad"); // the same content every round, a new request each time
    for (let round = 1; round <= 5; round++) {
      let open!: () => void;
      gate = new Promise<void>((r) => {
        open = r;
      });
      const blocker = batcher.infer(req(1, 999));
      const goods = Array.from({ length: 7 }, (_, i) => batcher.infer(req(1, round * 10 + i)));
      const refused = rejectionOf(batcher.infer(bad()), StageError);
      const roundStart = calls.length;
      open();
      await blocker;
      await Promise.all(goods);
      const err = await refused;
      expect(err.rawMessage).toMatch(/negative value \(-5/);
      const roundCalls = calls.slice(roundStart);
      // Round 1 bisects a batch of 8 (6 re-runs), so the budget is no longer full and the bad
      // content, which failed alone, is suspect: from round 2 it runs alone and the 7 good rows
      // merge. The lane's turn comes after that merged run, or after its 5 ms wait on a slow
      // machine: either order.
      if (round === 1) expect(roundCalls.map((c) => c.length)).toEqual([8, 4, 4, 2, 2, 1, 1]);
      else {
        expect(roundCalls.map((c) => c.length).sort((a, b) => a - b)).toEqual([1, 7]);
        expect(roundCalls.find((c) => c.length === 1)).toEqual([-501]); // the bad content (seed -5)
      }
    }
    expect(recorder.isolation()).toEqual({ reruns: 6, quarantined: 4 });
    expect(recorder.snapshot().inferenceStats?.fail?.count).toBe(5n);
  });

  it("fails a lone request with its own error, without running it again", async () => {
    const { batcher, calls, release } = held({ merged: twice });
    release();
    const err = await rejectionOf(batcher.infer(req(2, -1)), StageError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(calls).toHaveLength(1);
  });
});

/** Seed 66's content (values 6601…) ends the instance that runs it, as a crashing model would. */
const CRASH_SEED = 66;
const crashes = (values: Float32Array) => values.some((v) => v > 6600 && v < 6700);
function crashOrTwice(x: Tensor): Tensor[] {
  if (crashes(x.data as Float32Array)) {
    throw new InstanceEndedError(Code.Unavailable, "m", "its process exited (code 1); the instance restarts", "exited");
  }
  return twice(x);
}
const endedRuns = (calls: { rows: number[] }[], firstCall: number) => calls.slice(firstCall);

/** Sends `requests` while the held batcher's first execution runs: they form one batch. */
async function asOneBatch(h: ReturnType<typeof held>, requests: InferRequest[]) {
  const first = h.batcher.infer(req(1, 1));
  const answers = requests.map((r) =>
    h.batcher.infer(r).then(
      (res) => res,
      (err: unknown) => err,
    ),
  );
  h.release();
  await first;
  return Promise.all(answers);
}

describe("a batch whose run ended its instance (a crash, a timeout)", () => {
  for (const kind of ["merged", "request by request"] as const) {
    const make = () =>
      kind === "merged"
        ? held({ merged: crashOrTwice })
        : held({
            perRequest: async (requests) => {
              // Triton's execute(requests) in a process: a crash fails the whole batch.
              for (const r of requests) crashOrTwice(r.inputs[0]!);
              return { responses: requests.map((r) => twice(r.inputs[0]!)) };
            },
          });

    it(`(${kind}) is not bisected: its requests run alone until the culprit ends it again, then the rest together`, async () => {
      const h = make();
      const requests = Array.from({ length: 8 }, (_, i) => req(1, i === 2 ? CRASH_SEED : i + 2));
      const settled = await asOneBatch(h, requests);
      // The batch of 8 ended the instance; 0 and 1 ran alone; 2 ended it again; 3-7 ran merged.
      expect(endedRuns(h.calls, 1).map((c) => c.rows.length)).toEqual([8, 1, 1, 1, 5]);
      expect(h.recorder.isolation()).toEqual({ reruns: 4, quarantined: 0 });
      for (const [i, answer] of settled.entries()) {
        if (i === 2) {
          expect(answer).toBeInstanceOf(InstanceEndedError);
          expect((answer as StageError).code).toBe(Code.Unavailable);
        } else {
          expect(Array.from((answer as InferResponseLike).outputs[0]!.data as Float32Array)).toEqual(
            doubled(requests[i]!.inputs[0]!),
          );
        }
      }
      // The same input again is refused at once, without running (no third restart), naming why.
      const callsBefore = h.calls.length;
      const again = await rejectionOf(h.batcher.infer(req(1, CRASH_SEED, "again")), StageError);
      expect(again.code).toBe(Code.Unavailable);
      expect(again.rawMessage).toMatch(/the same input ended the model's instance \d+ s ago \(its process exited/);
      expect(h.calls.length).toBe(callsBefore);
      // Other inputs still run.
      const good = await h.batcher.infer(req(1, 40));
      expect(Array.from(good.outputs[0]!.data as Float32Array)).toEqual(doubled(req(1, 40).inputs[0]!));
    });

    it(`(${kind}) fails the culprit without running it again when every other request succeeded alone: one restart`, async () => {
      const h = make();
      const requests = Array.from({ length: 4 }, (_, i) => req(1, i === 3 ? CRASH_SEED : i + 2));
      const settled = await asOneBatch(h, requests);
      expect(endedRuns(h.calls, 1).map((c) => c.rows.length)).toEqual([4, 1, 1, 1]);
      const culprit = settled[3] as StageError;
      expect(culprit.code).toBe(Code.Unavailable);
      expect(culprit.rawMessage).toMatch(/every other request of it succeeded alone, so this one was not run again/);
      for (const i of [0, 1, 2]) expect((settled[i] as InferResponseLike).outputs[0]!.shape).toEqual([1, 2]);
      const callsBefore = h.calls.length;
      const again = await rejectionOf(h.batcher.infer(req(1, CRASH_SEED, "again")), StageError);
      expect(again.rawMessage).toMatch(/the same input ended the model's instance/);
      expect(h.calls.length).toBe(callsBefore);
    });

    it(`(${kind}) refuses a queued request whose input ended the instance while it waited`, async () => {
      const h = make();
      const first = h.batcher.infer(req(1, CRASH_SEED, "first")).then(
        () => undefined,
        (err: unknown) => err as StageError,
      );
      // Queued behind the first (held) execution, the same input: refused once the first has ended it.
      const second = rejectionOf(h.batcher.infer(req(1, CRASH_SEED, "second")), StageError);
      h.release();
      expect(await first).toBeInstanceOf(InstanceEndedError);
      expect((await second).rawMessage).toMatch(/the same input ended the model's instance/);
      expect(h.calls).toHaveLength(1);
    });
  }
});

describe("a batch whose run ended its instance, the backend naming the request it was on", () => {
  /** Triton's execute(requests) in a process that reads its requests one at a time: it names the one it ended on. */
  const suspectNaming = () =>
    held({
      perRequest: async (requests) => {
        for (const [i, r] of requests.entries()) {
          if (crashes(r.inputs[0]!.data as Float32Array)) {
            throw new InstanceEndedError(Code.Unavailable, "m", "its process exited (code 1)", "exited", i);
          }
        }
        return { responses: requests.map((r) => twice(r.inputs[0]!)) };
      },
    });

  it("runs that request last, and any other with its input just before it: one restart in all", async () => {
    const h = suspectNaming();
    const requests = [req(1, 2), req(1, CRASH_SEED, "bad"), req(1, 3), req(1, CRASH_SEED, "bad again"), req(1, 4)];
    const settled = await asOneBatch(h, requests);
    // The batch of 5 ended the instance; the three good ones ran alone; the two bad ones (one input) never ran again.
    expect(endedRuns(h.calls, 1).map((c) => c.rows.length)).toEqual([5, 1, 1, 1]);
    for (const i of [1, 3]) {
      expect((settled[i] as StageError).rawMessage).toMatch(
        /every other request of it succeeded alone, so this one was not run again/,
      );
    }
    for (const i of [0, 2, 4]) {
      expect(Array.from((settled[i] as InferResponseLike).outputs[0]!.data as Float32Array)).toEqual(
        doubled(requests[i]!.inputs[0]!),
      );
    }
  });

  it("refuses a request whose input its culprit shared, found by running it alone", async () => {
    // The backend names no request: the culprit is found by running it alone (a second end), and
    // the same input later in the batch is refused without a third.
    const h = held({
      perRequest: async (requests) => {
        for (const r of requests) crashOrTwice(r.inputs[0]!);
        return { responses: requests.map((r) => twice(r.inputs[0]!)) };
      },
    });
    const requests = [req(1, CRASH_SEED, "bad"), req(1, 2), req(1, CRASH_SEED, "bad again"), req(1, 3)];
    const settled = await asOneBatch(h, requests);
    // The batch of 4; the first bad one alone (it ends the instance again); the two good ones together.
    expect(endedRuns(h.calls, 1).map((c) => c.rows.length)).toEqual([4, 1, 2]);
    expect((settled[2] as StageError).rawMessage).toMatch(/the same input ended the model's instance/);
    for (const i of [1, 3]) expect((settled[i] as InferResponseLike).outputs[0]!.shape).toEqual([1, 2]);
  });
});

describe("an input whose run ended its instance after a long time (a timeout)", () => {
  it("is refused 60 times as long as that run took, when that is longer than 30 s", async () => {
    vi.useFakeTimers({ toFake: ["Date", "performance"] });
    try {
      const h = held({
        merged: (x) => {
          if (crashes(x.data as Float32Array)) {
            vi.advanceTimersByTime(2000); // the run takes 2 s before its deadline ends it
            throw new InstanceEndedError(Code.Unavailable, "m", "no answer within 2000 ms", "timed out");
          }
          return twice(x);
        },
      });
      h.release();
      await rejectionOf(h.batcher.infer(req(1, CRASH_SEED)), InstanceEndedError);
      const refused = await rejectionOf(h.batcher.infer(req(1, CRASH_SEED)), StageError);
      expect(refused.rawMessage).toMatch(/refused without running for 120 s/);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("an input that keeps ending the instance", () => {
  it("is let through once its refusal ends, and refused twice as long each time it ends the instance again", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      const h = held({ merged: crashOrTwice });
      h.release();
      const windows: number[] = [];
      for (let strike = 1; strike <= 3; strike++) {
        const ended = await rejectionOf(h.batcher.infer(req(1, CRASH_SEED)), StageError);
        expect(ended).toBeInstanceOf(InstanceEndedError);
        const refused = await rejectionOf(h.batcher.infer(req(1, CRASH_SEED)), StageError);
        const seconds = Number(/refused without running for (\d+) s/.exec(refused.rawMessage)?.[1]);
        windows.push(seconds);
        vi.advanceTimersByTime(seconds * 1000 - 1000);
        await expect(h.batcher.infer(req(1, CRASH_SEED))).rejects.toThrow(/the same input ended/);
        vi.advanceTimersByTime(1000);
      }
      expect(windows).toEqual([30, 60, 120]);
      expect(h.calls).toHaveLength(3); // one run per window: each ended the instance once
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("the re-run budget", () => {
  it("is checked before each re-run: 16 at most; what it cannot pay for runs alone in the lane, its outcome its own", async () => {
    const h = held({ merged: twice });
    // 24 different failing contents among 7 good ones: bisecting them all would take far more than 16 re-runs.
    const requests = Array.from({ length: 31 }, (_, i) => (i % 4 === 1 ? req(1, i + 2) : req(1, -(i + 2))));
    const settled = await asOneBatch(h, requests);
    const { reruns, quarantined } = h.recorder.isolation();
    expect(reruns).toBe(16);
    expect(quarantined).toBeGreaterThan(0);
    // The first run, the merged batch, 16 paid re-runs, then one lone lane run per deferred request.
    expect(h.calls.length).toBe(2 + 16 + quarantined);
    expect(h.calls.slice(2 + 16).every((c) => c.rows.length === 1)).toBe(true);
    for (const [i, outcome] of settled.entries()) {
      const seed = i % 4 === 1 ? i + 2 : -(i + 2);
      if (seed > 0) {
        expect(Array.from((outcome as InferResponseLike).outputs[0]!.data as Float32Array)).toEqual(
          doubled(requests[i]!.inputs[0]!),
        );
      } else {
        // Its own error, never another request's.
        expect((outcome as StageError).rawMessage).toMatch(new RegExp(`negative value \\(${seed * 100 - 1}\\)`));
      }
    }
  });
});

describe("an executor that answers each request", () => {
  it("fails only the request it answers with an error, and computes the rest of the batch", async () => {
    const perRequest: RequestsExecutor = async (requests) => ({
      responses: requests.map((r): RequestOutcome => {
        try {
          return twice(r.inputs[0]!);
        } catch (err) {
          return err as Error;
        }
      }),
    });
    const { batcher, calls, release } = held({ perRequest });
    const first = batcher.infer(req(1, 1));
    const good = [req(2, 2), req(1, 3)];
    const answers = [batcher.infer(good[0]!), batcher.infer(req(1, -4)), batcher.infer(good[1]!)];
    const refused = rejectionOf(answers[1]!, StageError);
    release();
    await first;
    expect((await refused).rawMessage).toMatch(/negative value/);
    for (const [i, r] of [await answers[0]!, await answers[2]!].entries()) {
      expect(Array.from(r.outputs[0]!.data as Float32Array)).toEqual(doubled(good[i]!.inputs[0]!));
    }
    // One execution for the batch of three: nothing ran twice.
    expect(calls.map((c) => c.rows)).toEqual([[1], [2, 1, 1]]);
  });

  it("refuses an answer of another request's rows: dim 0 must be the request's own", async () => {
    // A faulty executor that answers every request with the whole batch's rows.
    const perRequest: RequestsExecutor = async (requests) => {
      const rows = requests.reduce((n, r) => n + r.inputs[0]!.shape[0]!, 0);
      const all = tensor("y", "FP32", [rows, 2], new Float32Array(rows * 2));
      return { responses: requests.map(() => [all]) };
    };
    const { batcher, release } = held({ perRequest });
    const first = batcher.infer(req(1, 1));
    const a = rejectionOf(batcher.infer(req(1, 2)), StageError);
    const b = rejectionOf(batcher.infer(req(2, 3)), StageError);
    release();
    await first;
    expect((await a).code).toBe(Code.Internal);
    expect((await a).rawMessage).toMatch(/a request of 1 produced dim 0 = 3/);
    expect((await b).rawMessage).toMatch(/a request of 2 produced dim 0 = 3/);
  });

  it("fails the whole batch when it gives the wrong number of answers", async () => {
    const perRequest: RequestsExecutor = async (requests) => ({ responses: requests.slice(1).map(() => []) });
    const { batcher, release } = held({ perRequest });
    const first = batcher.infer(req(1, 1)).catch((e: unknown) => e);
    const a = rejectionOf(batcher.infer(req(1, 2)), StageError);
    release();
    await first;
    expect((await a).rawMessage).toMatch(/an execution of 1 requests gave 0 answers/);
  });
});

describe("sequence batching", () => {
  it("fails only the sequence whose request the model cannot compute; the others go on with their state", async () => {
    const config = parseModelConfig(`name: "acc" backend: "typescript" max_batch_size: 4
      input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
      output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
      sequence_batching { max_sequence_idle_microseconds: 5000000
        state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
          initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ] }`);
    const rows: number[] = [];
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    const stage = defineStage({
      config,
      async compute(request) {
        const input = request.inputs.find((t) => t.name === "INPUT")!;
        const state = request.inputs.find((t) => t.name === "STATE_IN")!;
        rows.push(input.shape[0]!);
        if (rows.length === 1) await held;
        const x = input.data as Int32Array;
        if (x.some((v) => v < 0)) throw new StageError(Code.InvalidArgument, "acc", "INPUT must not be negative");
        const sum = Int32Array.from(x, (v, i) => v + (state.data as Int32Array)[i]!);
        return [tensor("OUTPUT", "INT32", input.shape, sum), tensor("STATE_OUT", "INT32", input.shape, sum.slice())];
      },
    });
    const runtime = await createModelRuntime({ config, backend: stageBackend(stage, 1) });
    const send = (id: number, v: number, start = false) =>
      runtime.infer({
        inputs: [tensor("INPUT", "INT32", [1, 1], Int32Array.of(v))],
        parameters: { sequence_id: id, ...(start ? { sequence_start: true } : {}) },
      });
    const out = (r: Awaited<ReturnType<typeof send>>) => (r.outputs[0]!.data as Int32Array)[0];
    const first = send(9, 1, true); // holds the one instance
    await new Promise((r) => setTimeout(r, 5));
    const heads = [send(1, 10, true), send(2, -5, true), send(3, 30, true)];
    const refused = rejectionOf(heads[1]!, StageError);
    release();
    expect(out(await first)).toBe(1);
    expect((await refused).rawMessage).toMatch(/INPUT must not be negative/);
    expect([out(await heads[0]!), out(await heads[2]!)]).toEqual([10, 30]);
    // The three heads ran merged (then alone); sequences 1 and 3 keep their state.
    expect(rows.slice(0, 2)).toEqual([1, 3]);
    expect([out(await send(1, 1)), out(await send(3, 3))]).toEqual([11, 33]);
    await runtime.close();
  });
});
