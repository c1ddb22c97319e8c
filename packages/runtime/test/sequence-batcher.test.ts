import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import type { InferRequest, Parameters, Stage } from "@trellis/stage";
import { Code, defineStage, StageError, type Tensor, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { afterAll, describe, expect, it } from "vitest";
import { createSequenceBatcher, sequenceTensors, withSequenceBatching } from "../src/schedulers/sequence/batcher.js";

const CONTROLS = `control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 5, 7 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]`;

const ZERO_STATE = `state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]`;

/** An accumulator: OUTPUT = STATE_IN + INPUT = STATE_OUT; SEEN echoes what the controls carried. */
function accumulatorConfig({
  maxBatchSize = 4,
  sequence = `${CONTROLS} ${ZERO_STATE}`,
  outputs = "",
  idleUs = 5_000_000,
} = {}) {
  return parseModelConfig(`name: "acc" backend: "typescript" max_batch_size: ${maxBatchSize}
    input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SEEN" data_type: TYPE_FP32 dims: [ 4 ] } ${outputs} ]
    sequence_batching { max_sequence_idle_microseconds: ${idleUs} ${sequence} }`);
}

const lead = (shape: number[]) => shape.slice(0, -1);

/** The accumulator as a TypeScript stage; `delays` holds each call's delay in ms, in call order. */
function accumulator(config = accumulatorConfig(), delays: number[] = []) {
  const seen: InferRequest[] = [];
  const stage = defineStage({
    config,
    async compute(request) {
      seen.push(request);
      const delay = delays.shift();
      if (delay) await new Promise((r) => setTimeout(r, delay));
      const get = (name: string) => request.inputs.find((t) => t.name === name);
      const input = get("INPUT")!;
      const state = get("STATE_IN")!;
      const sum = Int32Array.from(input.data as Int32Array, (v, i) => v + (state.data as Int32Array)[i]!);
      const start = (get("START")?.data as Float32Array | undefined)?.[0] ?? -1;
      const end = (get("END")?.data as Int32Array | undefined)?.[0] ?? -1;
      const ready = (get("READY")?.data as Uint8Array | undefined)?.[0] ?? -1;
      const corrid = (get("CORRID")?.data as BigUint64Array | undefined)?.[0] ?? -1n;
      return [
        tensor("OUTPUT", "INT32", input.shape, sum),
        tensor("STATE_OUT", "INT32", input.shape, Int32Array.from(sum)),
        tensor("SEEN", "FP32", [...lead(input.shape), 4], Float32Array.of(start, end, ready, Number(corrid))),
      ];
    },
  });
  return { stage, seen };
}

const value = (n: number, batch = true): Tensor => tensor("INPUT", "INT32", batch ? [1, 1] : [1], Int32Array.of(n));
const ask = (stage: Stage, n: number, parameters: Parameters) => stage.infer({ inputs: [value(n)], parameters });
const outputOf = (res: { outputs: Tensor[] }, name = "OUTPUT") =>
  Array.from(res.outputs.find((t) => t.name === name)!.data as ArrayLike<number>);

describe("sequence batcher", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("carries the implicit state from request to request and sends the control values the config names", async () => {
    const { stage: model } = accumulator();
    const stage = await withSequenceBatching(model);
    const first = await ask(stage, 3, { sequence_id: 42, sequence_start: true });
    // An empty output list (as protobuf decodes "none named") means every output, as absent does.
    const middle = await stage.infer({ inputs: [value(4)], outputs: [], parameters: { sequence_id: 42n } });
    const last = await ask(stage, 10, { sequence_id: 42, sequence_end: true });
    expect([outputOf(first), outputOf(middle), outputOf(last)]).toEqual([[3], [7], [17]]);
    // START fp32 [0, 1], END int32 [5, 7], READY bool, CORRID uint64.
    expect(outputOf(first, "SEEN")).toEqual([1, 5, 1, 42]);
    expect(outputOf(middle, "SEEN")).toEqual([0, 5, 1, 42]);
    expect(outputOf(last, "SEEN")).toEqual([0, 7, 1, 42]);
    // The state output is the server's, not the client's: it is not in the config's outputs.
    expect(first.outputs.map((t) => t.name)).toEqual(["OUTPUT", "SEEN"]);
    await stage.close();
  });

  it("keeps sequences apart and runs one sequence's requests in arrival order, however long each takes", async () => {
    // The first call is slow: without ordering the second request of sequence 1 would overtake it.
    const { stage: model, seen } = accumulator(accumulatorConfig(), [60, 0, 0, 0, 0, 0]);
    const stage = await withSequenceBatching(model);
    const answers = await Promise.all([
      ask(stage, 1, { sequence_id: 1, sequence_start: true }),
      ask(stage, 100, { sequence_id: 2, sequence_start: true }),
      ask(stage, 2, { sequence_id: 1 }),
      ask(stage, 200, { sequence_id: 2 }),
      ask(stage, 3, { sequence_id: 1, sequence_end: true }),
      ask(stage, 300, { sequence_id: 3, sequence_start: true, sequence_end: true }),
    ]);
    expect(answers.map((a) => outputOf(a)[0])).toEqual([1, 100, 3, 300, 6, 300]);
    const order = seen
      .filter((r) => r.parameters?.sequence_id === 1)
      .map((r) => (r.inputs.find((t) => t.name === "INPUT")!.data as Int32Array)[0]);
    expect(order).toEqual([1, 2, 3]);
    await stage.close();
  });

  it("answers Triton's errors for a missing ID, a sequence not started, and requests it cannot take", async () => {
    const stage = await withSequenceBatching(accumulator().stage);
    const cases: [() => Promise<unknown>, string][] = [
      [() => ask(stage, 1, {}), "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"],
      [
        () => ask(stage, 1, { sequence_id: 0, sequence_start: true }),
        "must specify a non-zero or non-empty correlation ID",
      ],
      [
        () => ask(stage, 1, { sequence_id: 9 }),
        "inference request for sequence 9 to model 'acc' must specify the START flag on the first request of the sequence",
      ],
      [
        () => ask(stage, 1, { sequence_id: 9, sequence_start: "yes" }),
        "parameter sequence_start: expected a bool, got string yes",
      ],
      [
        () => ask(stage, 1, { sequence_id: 1.5, sequence_start: true }),
        "parameter sequence_id: expected an unsigned integer or a string",
      ],
      [
        () => ask(stage, 1, { sequence_id: "text", sequence_start: true }),
        `sequence_id "text" is a string, but control input CORRID (CONTROL_SEQUENCE_CORRID) takes UINT64`,
      ],
      [
        () =>
          stage.infer({
            inputs: [value(1), tensor("START", "FP32", [1, 1], Float32Array.of(1))],
            parameters: { sequence_id: 3, sequence_start: true },
          }),
        "input START is supplied by the sequence batcher",
      ],
      [
        () =>
          stage.infer({
            inputs: [tensor("INPUT", "INT32", [2, 1], Int32Array.of(1, 2))],
            parameters: { sequence_id: 3, sequence_start: true },
          }),
        "must specify batch-size 1 due to requirements of sequence batcher (input INPUT has shape [2,1])",
      ],
      [
        () =>
          stage.infer({
            inputs: [value(1)],
            outputs: [{ name: "STATE_OUT" }],
            parameters: { sequence_id: 3, sequence_start: true },
          }),
        "output STATE_OUT is the sequence's implicit state; list it in the config's outputs to request it",
      ],
    ];
    for (const [send, message] of cases) {
      const err = await rejectionOf(send(), StageError);
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toContain(message);
    }
    // None of them opened a sequence: sequence 3 still needs its START.
    expect((await rejectionOf(ask(stage, 1, { sequence_id: 3 }), StageError)).rawMessage).toContain(
      "must specify the START flag",
    );
    // Each refusal is the stage's failed request, as Triton counts it.
    const stats = await stage.statistics();
    expect([stats.inferenceStats?.fail?.count, stats.inferenceStats?.success?.count]).toEqual([
      BigInt(cases.length + 1),
      0n,
    ]);
    await stage.close();
  });

  it("forgets a sequence at its END: the ID must START again, with fresh state", async () => {
    const stage = await withSequenceBatching(accumulator().stage);
    await ask(stage, 5, { sequence_id: 7, sequence_start: true });
    await ask(stage, 5, { sequence_id: 7, sequence_end: true });
    expect((await rejectionOf(ask(stage, 1, { sequence_id: 7 }), StageError)).rawMessage).toContain(
      "must specify the START flag",
    );
    expect(outputOf(await ask(stage, 1, { sequence_id: 7, sequence_start: true }))).toEqual([1]);
    // A START on an open sequence restarts its state (Triton ends the earlier sequence early).
    expect(outputOf(await ask(stage, 2, { sequence_id: 7, sequence_start: true }))).toEqual([2]);
    await stage.close();
  });

  it("keeps new sequences in a backlog while every slot is taken, and gives a slot on the holder's END", async () => {
    // max_batch_size 0: one slot per instance.
    const config = accumulatorConfig({ maxBatchSize: 0 });
    const model = accumulator(config).stage;
    const sequencer = await createSequenceBatcher({ config, run: (r, o) => model.infer(r, o) });
    const single = (n: number, parameters: Parameters) => sequencer.infer({ inputs: [value(n, false)], parameters });
    await single(1, { sequence_id: 1, sequence_start: true });
    const events: string[] = [];
    const waiting = single(10, { sequence_id: 2, sequence_start: true }).then((r) => {
      events.push("B started");
      return r;
    });
    await new Promise((r) => setTimeout(r, 30));
    expect([sequencer.active, sequencer.backlogged, sequencer.queued]).toEqual([1, 1, 1]);
    await single(1, { sequence_id: 1, sequence_end: true }).then(() => events.push("A ended"));
    expect(outputOf(await waiting)).toEqual([10]);
    expect(events).toEqual(["A ended", "B started"]);
    expect([sequencer.active, sequencer.backlogged, sequencer.queued]).toEqual([1, 0, 0]);
    // With two instances there are two slots.
    const two = await createSequenceBatcher({ config, instances: 2, run: (r, o) => model.infer(r, o) });
    await two.infer({ inputs: [value(1, false)], parameters: { sequence_id: 1, sequence_start: true } });
    await two.infer({ inputs: [value(1, false)], parameters: { sequence_id: 2, sequence_start: true } });
    expect([two.active, two.backlogged]).toEqual([2, 0]);
    sequencer.close();
    two.close();
  });

  it("releases a sequence idle past max_sequence_idle_microseconds, so a backlogged one runs", async () => {
    const config = accumulatorConfig({ maxBatchSize: 0, idleUs: 50_000 });
    const model = accumulator(config).stage;
    const sequencer = await createSequenceBatcher({ config, run: (r, o) => model.infer(r, o) });
    const single = (n: number, parameters: Parameters) => sequencer.infer({ inputs: [value(n, false)], parameters });
    await single(1, { sequence_id: 1, sequence_start: true });
    const pending = single(5, { sequence_id: 2, sequence_start: true });
    // Sequence 2 waits in the backlog while sequence 1 holds the only slot...
    expect([sequencer.active, sequencer.backlogged]).toEqual([1, 1]);
    // ...and runs once sequence 1 went idle (50 ms) and lost its slot.
    const backlogged = await pending;
    expect([sequencer.active, sequencer.backlogged]).toEqual([1, 0]);
    expect(outputOf(backlogged)).toEqual([5]);
    expect((await rejectionOf(single(1, { sequence_id: 1 }), StageError)).rawMessage).toContain(
      "must specify the START flag",
    );
    sequencer.close();
  });

  it("starts the state from zero_data, from a data_file under initial_state/, or zeros with variable dims as 1", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-seq-"));
    dirs.push(dir);
    await mkdir(join(dir, "initial_state"));
    await writeFile(join(dir, "initial_state", "hundred"), Buffer.from(Int32Array.of(100).buffer));
    const fileState = `state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
      initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "from file" } } ]`;
    const fromFile = await withSequenceBatching(
      accumulator(accumulatorConfig({ sequence: `${CONTROLS} ${fileState}` })).stage,
      {
        modelDir: dir,
      },
    );
    expect(outputOf(await ask(fromFile, 1, { sequence_id: 1, sequence_start: true }))).toEqual([101]);
    expect(outputOf(await ask(fromFile, 1, { sequence_id: 1 }))).toEqual([102]);

    const variable = `state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]`;
    const { stage: model, seen } = accumulator(accumulatorConfig({ sequence: variable }));
    const plain = await withSequenceBatching(model);
    expect(outputOf(await ask(plain, 4, { sequence_id: "s", sequence_start: true }))).toEqual([4]);
    const state = seen[0]!.inputs.find((t) => t.name === "STATE_IN")!;
    expect([state.shape, Array.from(state.data as Int32Array)]).toEqual([[1, 1], [0]]);
    expect(sequenceTensors(model.config).inputs.map((s) => s.name)).toEqual(["STATE_IN"]);

    const missing = await rejectionOf(
      withSequenceBatching(accumulator(accumulatorConfig({ sequence: fileState.replace("hundred", "absent") })).stage, {
        modelDir: dir,
      }),
      StageError,
    );
    expect(missing.rawMessage).toContain("initial_state data_file absent: cannot read it (ENOENT)");
    expect(missing.rawMessage).not.toContain(dir);
    const outside = await rejectionOf(
      withSequenceBatching(
        accumulator(accumulatorConfig({ sequence: fileState.replace("hundred", "../../etc/passwd") })).stage,
        { modelDir: dir },
      ),
      StageError,
    );
    expect(outside.rawMessage).toContain('"../../etc/passwd" must name a file inside the model\'s folder');
    await fromFile.close();
    await plain.close();
  });

  it("refuses control inputs and states the config gets wrong, naming them", async () => {
    const attempts: [string, string][] = [
      [
        "iterative_sequence: true",
        "iterative_sequence is not supported: each request of a sequence is sent by the client",
      ],
      [
        `control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 1 ] } ] } ]`,
        "control_input S: CONTROL_SEQUENCE_START needs one of int32_false_true, fp32_false_true or bool_false_true, with two values [false, true]",
      ],
      [
        `control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]`,
        "control_input C: CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got TYPE_FP32",
      ],
      [
        `control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
          { name: "B" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]`,
        "more than one control_input carries CONTROL_SEQUENCE_END",
      ],
      [
        `state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ 2 ]
          initial_state { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } } ]`,
        "state I/O: initial_state dims [3] must be fixed and fit the state's [2]",
      ],
    ];
    for (const [sequence, message] of attempts) {
      const err = await rejectionOf(
        withSequenceBatching(accumulator(accumulatorConfig({ sequence })).stage),
        StageError,
      );
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toBe(`acc: sequence_batching: ${message}`);
    }
  });

  it("cancels a request waiting behind its sequence's previous one; the sequence goes on", async () => {
    const { stage: model } = accumulator(accumulatorConfig(), [80]);
    const stage = await withSequenceBatching(model);
    const first = ask(stage, 1, { sequence_id: 5, sequence_start: true });
    const controller = new AbortController();
    const second = stage.infer({ inputs: [value(2)], parameters: { sequence_id: 5 } }, { signal: controller.signal });
    const third = ask(stage, 3, { sequence_id: 5 });
    expect(stage.pendingRequests?.()).toBe(2);
    controller.abort(new Error("client went away"));
    const err = await rejectionOf(second, StageError);
    expect([err.code, err.rawMessage]).toEqual([
      Code.Canceled,
      "acc: request cancelled while waiting in its sequence: client went away",
    ]);
    expect([outputOf(await first), outputOf(await third)]).toEqual([[1], [4]]);
    await stage.close();
  });

  it("expires a new sequence's request waiting for a slot at its timeout; the holders go on", async () => {
    // max_batch_size 0 and two instances: two slots, both held.
    const config = accumulatorConfig({ maxBatchSize: 0 });
    const model = accumulator(config).stage;
    const sequencer = await createSequenceBatcher({ config, instances: 2, run: (r, o) => model.infer(r, o) });
    const single = (n: number, parameters: Parameters, timeoutMicroseconds?: number) =>
      sequencer.infer({ inputs: [value(n, false)], parameters }, { timeoutMicroseconds });
    await single(1, { sequence_id: 1, sequence_start: true });
    await single(2, { sequence_id: 2, sequence_start: true });
    const late = single(7, { sequence_id: 3, sequence_start: true }, 40_000);
    expect([sequencer.active, sequencer.backlogged, sequencer.queued]).toEqual([2, 1, 1]);
    const err = await rejectionOf(late, StageError);
    expect([err.code, err.rawMessage]).toEqual([
      Code.Unavailable,
      "acc: Request timeout expired: waited for its sequence's slot longer than its timeout of 40000 µs",
    ]);
    // It left the backlog: the ID is free, and the holders keep their slots and state.
    expect([sequencer.active, sequencer.backlogged, sequencer.queued]).toEqual([2, 0, 0]);
    expect(outputOf(await single(10, { sequence_id: 1 }, 40_000))).toEqual([11]);
    expect((await rejectionOf(single(1, { sequence_id: 3 }), StageError)).rawMessage).toContain(
      "must specify the START flag",
    );
    // A timeout does not cut a request that already runs.
    await single(1, { sequence_id: 1, sequence_end: true });
    expect(outputOf(await single(5, { sequence_id: 4, sequence_start: true }, 1))).toEqual([5]);
    sequencer.close();
  });

  it("gives the state output to a client that asks for it when the config lists it", async () => {
    const config = accumulatorConfig({ outputs: `, { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }` });
    const stage = await withSequenceBatching(accumulator(config).stage);
    const res = await stage.infer({
      inputs: [value(6)],
      outputs: [{ name: "STATE_OUT" }],
      parameters: { sequence_id: 1, sequence_start: true },
    });
    expect(res.outputs.map((t) => [t.name, Array.from(t.data as Int32Array)])).toEqual([["STATE_OUT", [6]]]);
    await stage.close();
  });

  it("keeps what the stage has besides (its own queue bound), and refuses a decoupled stage", async () => {
    const { stage: model } = accumulator();
    const bounded: Stage = Object.assign(model, { maxQueueSize: () => 12 });
    const stage = await withSequenceBatching(bounded);
    expect(stage.maxQueueSize?.()).toBe(12);
    expect("inferStream" in stage).toBe(false);
    await stage.close();

    const decoupled = Object.assign(accumulator().stage, {
      inferStream: async function* () {
        /* never called */
      },
    });
    const err = await rejectionOf(withSequenceBatching(decoupled), StageError);
    expect([err.code, err.rawMessage]).toEqual([
      Code.InvalidArgument,
      "acc: sequence_batching with model_transaction_policy { decoupled: true } is not supported: a sequence's requests here are answered once each",
    ]);
  });
});
