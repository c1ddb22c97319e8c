import { createClient } from "@connectrpc/connect";
import { listenStage } from "@trellis/frontends";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { GRPCInferenceService } from "@trellis/protocol";
import { withSequenceBatching } from "@trellis/runtime";
import { Code, defineStage, type Stage, StageError, type Tensor, tensor } from "@trellis/stage";
import { invalidArgument } from "@trellis/stage/backend";
import { describe, expect, it, vi } from "vitest";
import { createEnsemble, EnsembleStepError } from "../src/index.js";
import { cfg, deferred, type FnStage, fnStage, mapF32, unaryConfig, untilAborted } from "./helpers.js";

const x = (values: number[][]): Tensor => tensor("X", "FP32", [values.length, 4], Float32Array.from(values.flat()));
const values = (t: Tensor | undefined) => Array.from(t?.data as Float32Array);

const STEP = {
  inc: `{ model_name: "inc" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "a" } }`,
  dbl: `{ model_name: "dbl" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "b" } }`,
  join: `{ model_name: "join" model_version: -1 input_map { key: "A" value: "a" } input_map { key: "B" value: "b" } output_map { key: "SUM" value: "Y" } }`,
};

function diamondConfig(order: (keyof typeof STEP)[], extra = "") {
  return cfg(`
    name: "diamond"
    platform: "ensemble"
    max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    ensemble_scheduling { ${extra} step [ ${order.map((s) => STEP[s]).join(", ")} ] }
  `);
}

const joinConfig = cfg(`
  name: "join"
  backend: "typescript"
  max_batch_size: 8
  input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
  output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
`);

/** inc(x)+dbl(x) where each branch waits for the other to start: only concurrent branches finish. */
function diamondStages(opts: { barrier?: boolean } = {}) {
  let started = 0;
  const both = deferred();
  const branch = async () => {
    if (!opts.barrier) return;
    started += 1;
    if (started === 2) both.resolve();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error("branches did not run concurrently")), 5000);
    });
    await Promise.race([both.promise, timeout]).finally(() => clearTimeout(timer));
  };
  const stages: Record<string, FnStage> = {
    inc: fnStage(unaryConfig("inc"), async ({ IN }) => {
      await branch();
      return [mapF32(IN!, "OUT", (v) => v + 1)];
    }),
    dbl: fnStage(unaryConfig("dbl"), async ({ IN }) => {
      await branch();
      return [mapF32(IN!, "OUT", (v) => v * 2)];
    }),
    join: fnStage(joinConfig, ({ A, B }) => {
      const a = A!.data as Float32Array;
      return [mapF32(B!, "SUM", (v) => v)].map((t) => ({
        ...t,
        data: (t.data as Float32Array).map((v, i) => v + a[i]!),
      }));
    }),
  };
  return { stages, resolveStep: (model: string) => stages[model]! };
}

const permutations = <T>(xs: T[]): T[][] =>
  xs.length <= 1
    ? [xs]
    : xs.flatMap((v, i) => permutations([...xs.slice(0, i), ...xs.slice(i + 1)]).map((p) => [v, ...p]));

describe("DAG execution", () => {
  it("runs a diamond's branches concurrently and joins them", async () => {
    const { stages, resolveStep } = diamondStages({ barrier: true });
    const ensemble = await createEnsemble({ config: diamondConfig(["join", "dbl", "inc"]), resolveStep });
    const res = await ensemble.infer({ inputs: [x([[1, 2, 3, 4]])] });
    expect(res.modelName).toBe("diamond");
    expect(res.outputs.map((t) => [t.name, t.shape])).toEqual([["Y", [1, 4]]]);
    expect(values(res.outputs[0])).toEqual([1 + 1 + 2, 2 + 1 + 4, 3 + 1 + 6, 4 + 1 + 8]);
    expect(stages.join!.calls).toHaveLength(1);
  });

  it("gives the same result whatever order the steps are listed in", async () => {
    const results = new Set<string>();
    for (const order of permutations<keyof typeof STEP>(["inc", "dbl", "join"])) {
      const { resolveStep } = diamondStages({ barrier: true });
      const ensemble = await createEnsemble({ config: diamondConfig(order), resolveStep });
      const res = await ensemble.infer({
        inputs: [
          x([
            [1, 2, 3, 4],
            [-1, 0, 0.5, 10],
          ]),
        ],
      });
      results.add(JSON.stringify(values(res.outputs[0])));
      expect(ensemble.plan.order.map((i) => ensemble.plan.steps[i]!.model).at(-1)).toBe("join");
    }
    expect([...results]).toEqual([JSON.stringify([4, 7, 10, 13, -2, 1, 2.5, 31])]);
  });

  it("passes tensors between steps without copying", async () => {
    const produced: Tensor[] = [];
    const a = fnStage(unaryConfig("a"), ({ IN }) => {
      const out = mapF32(IN!, "OUT", (v) => v * 3);
      produced.push(out);
      return [out];
    });
    const b = fnStage(unaryConfig("b"), ({ IN }) => {
      const out = mapF32(IN!, "OUT", (v) => v - 1);
      produced.push(out);
      return [out];
    });
    const config = cfg(`
      name: "chain" platform: "ensemble" max_batch_size: 8
      input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
      ensemble_scheduling { step [
        { model_name: "a" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "mid" } },
        { model_name: "b" model_version: -1 input_map { key: "IN" value: "mid" } output_map { key: "OUT" value: "Y" } }
      ] }`);
    const ensemble = await createEnsemble({ config, resolveStep: (m) => (m === "a" ? a : b) });
    const input = x([[1, 2, 3, 4]]);
    const res = await ensemble.infer({ inputs: [input] });
    const aIn = a.calls[0]!.request.inputs[0]!;
    const bIn = b.calls[0]!.request.inputs[0]!;
    expect(aIn.name).toBe("IN");
    expect(aIn.data).toBe(input.data);
    expect(bIn.name).toBe("IN");
    expect(bIn.data).toBe(produced[0]!.data);
    expect(res.outputs[0]!.name).toBe("Y");
    expect(res.outputs[0]!.data).toBe(produced[1]!.data);
    expect(values(res.outputs[0])).toEqual([2, 5, 8, 11]);
    // Steps are asked for exactly the outputs the ensemble maps.
    expect(a.calls[0]!.request.outputs).toEqual([{ name: "OUT" }]);
  });

  it("names the failing step, keeps its code and never runs later steps", async () => {
    const { stages, resolveStep } = diamondStages();
    const failing = fnStage(joinConfig, () => {
      throw invalidArgument("join", "input A: batch item 0 is NaN");
    });
    const after = fnStage(unaryConfig("after"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v)]);
    const config = cfg(`
      name: "failing" platform: "ensemble" max_batch_size: 8
      input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] } ]
      ensemble_scheduling { step [ ${STEP.inc}, ${STEP.dbl}, ${STEP.join},
        { model_name: "after" model_version: -1 input_map { key: "IN" value: "Y" } output_map { key: "OUT" value: "Z" } } ] }`);
    const ensemble = await createEnsemble({
      config,
      resolveStep: (m) => (m === "join" ? failing : m === "after" ? after : resolveStep(m)),
    });
    const err = await ensemble.infer({ inputs: [x([[1, 2, 3, 4]])] }).catch((e) => e);
    expect(err).toBeInstanceOf(EnsembleStepError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe("failing: step 2 join: INVALID_ARGUMENT: input A: batch item 0 is NaN");
    expect(err.step).toBe(2);
    expect(stages.inc!.calls).toHaveLength(1);
    expect(after.calls).toHaveLength(0);
    expect(ensemble.stepStatistics().map((s) => [s.inflight, s.waiting])).toEqual([
      [0, 0],
      [0, 0],
      [0, 0],
      [0, 0],
    ]);
    const stats = ensemble.statistics();
    expect(stats.inferenceStats?.fail?.count).toBe(1n);
    expect(ensemble.stepStatistics()[2]!.statistics.inferenceStats?.fail?.count).toBe(1n);
  });

  it("aborts a running sibling when a branch fails, and the request rejects at once", async () => {
    const slow = fnStage(unaryConfig("inc"), (_, signal) => untilAborted(signal));
    const fast = fnStage(unaryConfig("dbl"), () => {
      throw new StageError(Code.ResourceExhausted, "dbl", "queue full");
    });
    const { stages } = diamondStages();
    const ensemble = await createEnsemble({
      config: diamondConfig(["inc", "dbl", "join"]),
      resolveStep: (m) => (m === "inc" ? slow : m === "dbl" ? fast : stages.join!),
    });
    const err = await ensemble.infer({ inputs: [x([[1, 2, 3, 4]])] }).catch((e) => e);
    expect(err.code).toBe(Code.ResourceExhausted);
    expect(err.rawMessage).toContain("step 1 dbl: RESOURCE_EXHAUSTED: queue full");
    expect(slow.calls[0]!.signal?.aborted).toBe(true);
    expect(stages.join!.calls).toHaveLength(0);
    await vi.waitFor(() => expect(slow.active).toBe(0));
    expect(ensemble.stepStatistics().every((s) => s.inflight === 0 && s.waiting === 0)).toBe(true);
  });

  it("propagates the caller's cancellation and deadline to running steps", async () => {
    const hang = fnStage(unaryConfig("inc"), (_, signal) => untilAborted(signal));
    const { stages } = diamondStages();
    const ensemble = await createEnsemble({
      config: diamondConfig(["inc", "dbl", "join"]),
      resolveStep: (m) => (m === "inc" ? hang : stages[m]!),
    });
    const controller = new AbortController();
    const pending = ensemble.infer({ inputs: [x([[1, 2, 3, 4]])] }, { signal: controller.signal });
    await vi.waitFor(() => expect(hang.calls).toHaveLength(1));
    controller.abort();
    const cancelled = await pending.catch((e) => e);
    expect(cancelled.code).toBe(Code.Canceled);
    expect(hang.calls[0]!.signal?.aborted).toBe(true);

    const late = await ensemble
      .infer({ inputs: [x([[1, 2, 3, 4]])] }, { signal: AbortSignal.timeout(50) })
      .catch((e) => e);
    expect(late.code).toBe(Code.DeadlineExceeded);
    expect(hang.calls[1]!.signal?.aborted).toBe(true);
    expect(stages.join!.calls).toHaveLength(0);
  });

  it("caps each step at max_inflight_requests and holds upstream work back", async () => {
    const gate = deferred();
    const up = fnStage(unaryConfig("up"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v + 1)]);
    const down = fnStage(unaryConfig("down"), async ({ IN }) => {
      await gate.promise;
      return [mapF32(IN!, "OUT", (v) => v * 10)];
    });
    const config = cfg(`
      name: "capped" platform: "ensemble" max_batch_size: 8
      input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
      ensemble_scheduling { max_inflight_requests: 2 step [
        { model_name: "down" model_version: -1 input_map { key: "IN" value: "mid" } output_map { key: "OUT" value: "Y" } },
        { model_name: "up" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "mid" } }
      ] }`);
    const ensemble = await createEnsemble({ config, resolveStep: (m) => (m === "up" ? up : down) });
    const pending = Array.from({ length: 6 }, (_, i) => ensemble.infer({ inputs: [x([[i, i, i, i]])] }));
    // down holds 2; up finished 2 more that wait for down's slots, keeping up's 2 slots; 2 requests wait for up.
    await vi.waitFor(() =>
      expect(ensemble.stepStatistics().map((s) => [s.model, s.inflight, s.waiting])).toEqual([
        ["down", 2, 2],
        ["up", 2, 2],
      ]),
    );
    expect(up.calls).toHaveLength(4);
    expect(down.calls).toHaveLength(2);
    gate.resolve();
    const results = await Promise.all(pending);
    expect(results.map((r) => values(r.outputs[0])[0])).toEqual([10, 20, 30, 40, 50, 60]);
    expect(down.maxActive).toBe(2);
    expect(ensemble.stepStatistics().every((s) => s.inflight === 0 && s.waiting === 0)).toBe(true);
    const downStats = ensemble.stepStatistics()[0]!.statistics;
    expect(downStats.inferenceStats?.success?.count).toBe(6n);
    expect(downStats.inferenceStats!.queue!.ns).toBeGreaterThan(0n);
  });

  it("hands the request's sequence parameters to its steps, so a stateful step keeps each sequence's state", async () => {
    const accConfig = cfg(`
      name: "acc"
      backend: "typescript"
      max_batch_size: 8
      input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
      sequence_batching {
        state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 4 ]
          initial_state { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zero" } } ]
      }`);
    const acc = await withSequenceBatching(
      fnStage(accConfig, ({ IN, SUM_IN }) => {
        const sum = mapF32(IN!, "OUT", (v) => v);
        (sum.data as Float32Array).forEach((v, i, a) => {
          a[i] = v + (SUM_IN!.data as Float32Array)[i]!;
        });
        return [sum, { ...sum, name: "SUM_OUT" }];
      }),
    );
    const stages: Record<string, Stage> = {
      inc: fnStage(unaryConfig("inc"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v + 1)]),
      acc,
    };
    const ensemble = await createEnsemble({
      config: cfg(`
        name: "running_total"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "inc" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "x1" } },
          { model_name: "acc" model_version: -1 input_map { key: "IN" value: "x1" } output_map { key: "OUT" value: "Y" } }
        ] }`),
      resolveStep: (model: string) => stages[model]!,
    });
    const send = (parameters: Record<string, number | boolean>) =>
      ensemble.infer({ inputs: [x([[0, 1, 2, 3]])], parameters });
    expect(values((await send({ sequence_id: 9, sequence_start: true })).outputs[0])).toEqual([1, 2, 3, 4]);
    expect(values((await send({ sequence_id: 9 })).outputs[0])).toEqual([2, 4, 6, 8]);
    expect(values((await send({ sequence_id: 9, sequence_end: true })).outputs[0])).toEqual([3, 6, 9, 12]);
    const outside = await send({}).catch((e: unknown) => e);
    expect(outside).toBeInstanceOf(EnsembleStepError);
    expect((outside as EnsembleStepError).code).toBe(Code.InvalidArgument);
    expect((outside as EnsembleStepError).rawMessage).toContain(
      "inference request to model 'acc' must specify a non-zero or non-empty correlation ID",
    );
    await ensemble.close();
    await acc.close();
  });

  describe("with a decoupled step", () => {
    /** prep (X -> P = X + 1, LEN) -> burst (decoupled: P -> one B = P * k per k = 1..n) -> post (B -> Y = B * 10). */
    function streamingEnsemble(opts: { n?: number; failAt?: number; postFailsAt?: number; extra?: string } = {}) {
      const seen = { prep: 0, post: 0, burstClosed: false, burstSignal: undefined as AbortSignal | undefined };
      const prepConfig = cfg(`name: "prep" backend: "typescript" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "LEN" data_type: TYPE_FP32 dims: [ 1 ] } ]`);
      const prep = fnStage(prepConfig, ({ IN }) => {
        seen.prep++;
        return [
          mapF32(IN!, "OUT", (v) => v + 1),
          tensor("LEN", "FP32", [IN!.shape[0]!, 1], new Float32Array(IN!.shape[0]!).fill(4)),
        ];
      });
      const burst = defineStage({
        config: cfg(`name: "burst" backend: "typescript" max_batch_size: 8
          input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
          model_transaction_policy { decoupled: true }`),
        async *computeStream(request, options) {
          seen.burstSignal = options?.signal;
          try {
            for (let k = 1; k <= (opts.n ?? 3); k++) {
              if (k === opts.failAt) throw new StageError(Code.ResourceExhausted, "burst", `out of tokens at ${k}`);
              yield [mapF32(request.inputs[0]!, "OUT", (v) => v * k)];
              await new Promise((r) => setTimeout(r, 5));
            }
          } finally {
            seen.burstClosed = true;
          }
        },
      });
      const post = fnStage(unaryConfig("post"), ({ IN }) => {
        seen.post++;
        if (seen.post === opts.postFailsAt) throw new StageError(Code.InvalidArgument, "post", "cannot read this one");
        return [mapF32(IN!, "OUT", (v) => v * 10)];
      });
      const stages: Record<string, Stage> = { prep, burst, post };
      const config = cfg(`
        name: "streaming"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "LEN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ${opts.extra ?? ""}
        ensemble_scheduling { step [
          { model_name: "prep" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "p" } output_map { key: "LEN" value: "LEN" } },
          { model_name: "burst" model_version: -1 input_map { key: "IN" value: "p" } output_map { key: "OUT" value: "b" } },
          { model_name: "post" model_version: -1 input_map { key: "IN" value: "b" } output_map { key: "OUT" value: "Y" } }
        ] }`);
      return { seen, stages, build: () => createEnsemble({ config, resolveStep: (m: string) => stages[m]! }) };
    }
    const collect = async (stage: Stage, signal?: AbortSignal) => {
      const out: { y: number[]; len: number[] }[] = [];
      for await (const r of stage.inferStream!({ inputs: [x([[0, 1, 2, 3]])] }, signal ? { signal } : {})) {
        out.push({ y: values(r.outputs[0]), len: values(r.outputs[1]) });
      }
      return out;
    };

    it("runs the steps after it once per response, the steps before it once, and is decoupled itself", async () => {
      const { seen, build } = streamingEnsemble();
      const ensemble = await build();
      expect(ensemble.config.modelTransactionPolicy?.decoupled).toBe(true);
      expect(await collect(ensemble)).toEqual([
        { y: [10, 20, 30, 40], len: [4] },
        { y: [20, 40, 60, 80], len: [4] },
        { y: [30, 60, 90, 120], len: [4] },
      ]);
      expect([seen.prep, seen.post]).toEqual([1, 3]);
      const once = await ensemble.infer({ inputs: [x([[0, 1, 2, 3]])] }).catch((e: unknown) => e);
      expect((once as StageError).code).toBe(Code.Unimplemented);
      const stats = ensemble.statistics();
      expect([stats.inferenceStats?.success?.count, stats.executionCount]).toEqual([1n, 1n]);
      expect(ensemble.stepStatistics().map((s) => s.statistics.inferenceStats?.success?.count)).toEqual([1n, 1n, 3n]);
    });

    it("names the step that fails mid-stream, after the responses already sent, and stops the decoupled step", async () => {
      const decoupledFails = streamingEnsemble({ failAt: 3 });
      const answers: number[][] = [];
      const failure = await (async () => {
        for await (const r of (await decoupledFails.build()).inferStream!({ inputs: [x([[0, 1, 2, 3]])] })) {
          answers.push(values(r.outputs[0]));
        }
      })().catch((e: unknown) => e);
      expect(answers).toHaveLength(2);
      expect(failure).toBeInstanceOf(EnsembleStepError);
      expect([(failure as EnsembleStepError).code, (failure as EnsembleStepError).rawMessage]).toEqual([
        Code.ResourceExhausted,
        "streaming: step 1 burst: RESOURCE_EXHAUSTED: out of tokens at 3",
      ]);

      const laterFails = streamingEnsemble({ postFailsAt: 2, n: 5 });
      const err = await collect(await laterFails.build()).catch((e: unknown) => e);
      expect((err as EnsembleStepError).rawMessage).toBe(
        "streaming: step 2 post: INVALID_ARGUMENT: cannot read this one",
      );
      expect(laterFails.seen.burstClosed).toBe(true);
    });

    it("stops the decoupled step when the caller stops reading", async () => {
      const { seen, build } = streamingEnsemble({ n: 50 });
      const ensemble = await build();
      for await (const r of ensemble.inferStream!({ inputs: [x([[0, 1, 2, 3]])] })) {
        expect(values(r.outputs[0])).toEqual([10, 20, 30, 40]);
        break;
      }
      expect(seen.burstClosed).toBe(true);
      expect(seen.burstSignal?.aborted).toBe(true);
      expect(seen.post).toBe(1);
    });

    it("refuses two decoupled steps, and a response cache", async () => {
      const { stages } = streamingEnsemble();
      const two = cfg(`name: "two" platform: "ensemble" max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "burst" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "b" } },
          { model_name: "burst" model_version: -1 input_map { key: "IN" value: "b" } output_map { key: "OUT" value: "Y" } }
        ] }`);
      const err = await createEnsemble({ config: two, resolveStep: (m: string) => stages[m]! }).catch(
        (e: unknown) => e,
      );
      expect((err as StageError).rawMessage).toBe(
        "two: at most one step may be a decoupled model; step 0 (burst), step 1 (burst) are decoupled",
      );
      const cached = await streamingEnsemble({ extra: "response_cache { enable: true }" })
        .build()
        .catch((e: unknown) => e);
      expect((cached as StageError).rawMessage).toContain("the response cache does not support decoupled models");
    });
  });

  it("keeps Triton statistics for the ensemble and per step", async () => {
    const { resolveStep } = diamondStages();
    const ensemble = await createEnsemble({ config: diamondConfig(["inc", "dbl", "join"]), resolveStep });
    for (let i = 0; i < 3; i++)
      await ensemble.infer({
        inputs: [
          x([
            [1, 2, 3, 4],
            [5, 6, 7, 8],
          ]),
        ],
      });
    const s = ensemble.statistics();
    expect([s.name, s.version, s.inferenceCount, s.executionCount]).toEqual(["diamond", "1", 6n, 3n]);
    expect(s.inferenceStats?.success?.count).toBe(3n);
    expect(s.inferenceStats!.computeInfer!.ns).toBeGreaterThan(0n);
    const steps = ensemble.stepStatistics();
    expect(steps.map((x) => [x.step, x.model, x.statistics.inferenceStats?.success?.count])).toEqual([
      [0, "inc", 3n],
      [1, "dbl", 3n],
      [2, "join", 3n],
    ]);
  });

  it("checks requests against the ensemble's inputs, in Triton's words (core src/infer_request.cc)", async () => {
    const { stages, resolveStep } = diamondStages();
    const ensemble = await createEnsemble({ config: diamondConfig(["inc", "dbl", "join"]), resolveStep });
    const wrongType = await ensemble
      .infer({ inputs: [tensor("X", "INT32", [1, 4], new Int32Array(4))] })
      .catch((e) => e);
    expect(wrongType.code).toBe(Code.InvalidArgument);
    expect(wrongType.rawMessage).toBe(
      "[request id: <id_unknown>] inference input 'X' data-type is 'INT32', but model 'diamond' expects 'FP32'",
    );
    const tooBig = await ensemble
      .infer({ inputs: [tensor("X", "FP32", [9, 4], new Float32Array(36))] })
      .catch((e) => e);
    expect(tooBig.rawMessage).toContain("inference request batch-size must be <= 8 for 'diamond'");
    const missing = await ensemble.infer({ inputs: [] }).catch((e) => e);
    expect(missing.rawMessage).toBe(
      "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'diamond'. Got input(s) [], but missing required input(s) ['X']. Please provide all required input(s).",
    );
    expect(stages.inc!.calls).toHaveLength(0);
  });

  it("is itself a Stage: nests inside another ensemble and serves over gRPC", async () => {
    const { resolveStep } = diamondStages();
    const inner = await createEnsemble({ config: diamondConfig(["join", "inc", "dbl"]), resolveStep });
    const double = fnStage(unaryConfig("dbl"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v * 2)]);
    const outerConfig = cfg(`
      name: "outer" platform: "ensemble" max_batch_size: 4
      input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "FINAL" data_type: TYPE_FP32 dims: [ 4 ] } ]
      ensemble_scheduling { step [
        { model_name: "diamond" model_version: 1 input_map { key: "X" value: "RAW" } output_map { key: "Y" value: "y" } },
        { model_name: "dbl" model_version: -1 input_map { key: "IN" value: "y" } output_map { key: "OUT" value: "FINAL" } }
      ] }`);
    // The inner ensemble is reached over real gRPC, as a remote step.
    const server = await listenStage(inner);
    let remote: Stage | undefined;
    try {
      remote = await connectStage(grpcTransport(server.url), "diamond");
      const outer = await createEnsemble({
        config: outerConfig,
        resolveStep: (m, v) => {
          expect(m === "diamond" ? v : -1n).toBe(m === "diamond" ? 1n : -1n);
          return m === "diamond" ? remote! : double;
        },
      });
      const res = await outer.infer({ inputs: [tensor("RAW", "FP32", [1, 4], Float32Array.of(1, 2, 3, 4))] });
      expect(values(res.outputs[0])).toEqual([8, 14, 20, 26]);
      const outerServer = await listenStage(outer);
      try {
        const client = createClient(GRPCInferenceService, grpcTransport(outerServer.url));
        const meta = await client.modelMetadata({ name: "outer" });
        expect(meta.inputs.map((i) => [i.name, i.datatype, i.shape])).toEqual([["RAW", "FP32", [-1n, 4n]]]);
        const stats = await client.modelStatistics({ name: "outer" });
        expect(stats.modelStats[0]?.inferenceStats?.success?.count).toBe(1n);
      } finally {
        await outerServer.close();
      }
    } finally {
      await server.close();
    }
  });
});
