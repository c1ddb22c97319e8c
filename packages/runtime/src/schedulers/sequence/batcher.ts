/**
 * Triton's sequence batcher (config `sequence_batching`), for stateful models:
 * the requests of one sequence (one correlation ID, from a START request to an
 * END one) run one at a time in arrival order; each runs with the control
 * tensors the config asks for (START, END, READY, CORRID) and the sequence's
 * implicit state (the `state` entries: the model's output state of one request
 * is its input state in the next). A sequence holds a slot from its START to
 * its END; with every slot taken, new sequences wait in a backlog, and a
 * sequence idle past max_sequence_idle_microseconds loses its slot.
 *
 * Heads of different sequences reach the model's own infer concurrently, so its
 * dynamic batcher can batch them (Triton's "oldest" strategy). Batch positions
 * are not pinned to slots (Triton's "direct" promise): a model here keeps no
 * per-slot state of its own; it reads its state from the state tensors or keys
 * it by CORRID.
 *
 * This file holds the batcher (checking a sequence's requests, queueing them, running each with
 * its tensors) and withSequenceBatching; the config's controls and states are read in layout.ts,
 * the added tensors made in tensors.ts, slots and correlation IDs kept in slots.ts.
 */
import { clone, create } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import { InferStatisticsSchema, ModelStatisticsSchema, StatisticDurationSchema } from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse, Stage } from "@trellis/stage";
import { Code, formatShape, nowNs, StageError } from "@trellis/stage";
import { deadlineTimer, delegateStage, toConnectError } from "@trellis/stage/backend";
import { readInitialStates, readLayout, type SequenceLayout, tensorsOf } from "./layout.js";
import type { SequenceBatcher, SequenceBatcherOptions } from "./options.js";
import {
  cancelledWaiting,
  type Sequence,
  type SequenceFlags,
  SequenceSlots,
  sequenceFlags,
  type Waiting,
} from "./slots.js";
import { controlTensor, corridTensor, initialStateTensor } from "./tensors.js";

export { type SequenceTensorSpec, sequenceTensors } from "./layout.js";
export type { SequenceBatcher, SequenceBatcherOptions } from "./options.js";

/** A sequence batcher for `options.config`; refuses a config without sequence_batching. */
export async function createSequenceBatcher(options: SequenceBatcherOptions): Promise<SequenceBatcher> {
  const { config } = options;
  const layout = readLayout(config);
  if (!layout) {
    throw new StageError(Code.InvalidArgument, config.name, "the config has no sequence_batching section");
  }
  const initialData = await readInitialStates(config, layout, options.modelDir);
  return new Sequencer(options, layout, initialData);
}

class Sequencer extends SequenceSlots implements SequenceBatcher {
  /** The model has a batch dimension (max_batch_size > 0). */
  private readonly batching: boolean;
  /** The batch dim the added tensors carry: [1] when the model batches. */
  private readonly lead: number[];
  private readonly extraInputs: Set<string>;
  private readonly stateOutputs: Set<string>;
  private readonly configOutputs: string[];

  constructor(
    options: SequenceBatcherOptions,
    layout: SequenceLayout,
    /** Each state's initial_state data_file bytes, by state input name. */
    private readonly initialData: Map<string, Uint8Array>,
  ) {
    super(options, layout);
    const { config } = options;
    this.batching = config.maxBatchSize > 0;
    this.lead = this.batching ? [1] : [];
    this.extraInputs = new Set(tensorsOf(layout).inputs.map((s) => s.name));
    this.stateOutputs = new Set(layout.states.map((s) => s.output));
    this.configOutputs = config.output.map((o) => o.name);
  }

  get queued(): number {
    return this.queuedCount;
  }

  get active(): number {
    return this.activeCount;
  }

  get backlogged(): number {
    return this.backlog.length;
  }

  infer(request: InferRequest, inferOptions?: InferOptions): Promise<InferResponse> {
    const startNs = nowNs();
    if (this.closed) return this.refuse(startNs, new StageError(Code.Unavailable, this.model, "stage is closed"));
    let flags: SequenceFlags;
    try {
      flags = this.checkRequest(request);
    } catch (err) {
      return this.refuse(startNs, toConnectError(err, this.model));
    }
    const { id, start, end } = flags;
    const key = `${typeof id}:${id}`;
    let seq = this.open.get(key);
    if (!seq) {
      if (!start) {
        return this.refuse(
          startNs,
          this.bad(
            `inference request for sequence ${id} to model '${this.model}' must specify the START flag on the first request of the sequence`,
          ),
        );
      }
      seq = this.startSequence(key, id);
    }
    // An END closes the sequence: a later request with this ID must START a new one.
    if (end) {
      this.open.delete(key);
      seq.ended = true;
    }
    seq.lastArrival = performance.now();
    if (!end) this.watchIdle(key, seq);
    const target = seq;
    return new Promise<InferResponse>((resolve, reject) => {
      const w: Waiting = { request, startNs, options: inferOptions, start, end, resolve, reject };
      const signal = inferOptions?.signal;
      if (signal) {
        if (signal.aborted) {
          this.options.onRefused?.(nowNs() - startNs);
          reject(new StageError(Code.Canceled, this.model, "request cancelled before it was queued"));
          return;
        }
        const onAbort = () => this.withdraw(target, w, cancelledWaiting(this.model, signal));
        signal.addEventListener("abort", onAbort, { once: true });
        w.detach = () => signal.removeEventListener("abort", onAbort);
      }
      const timeoutUs = inferOptions?.timeoutMicroseconds ?? 0;
      if (timeoutUs > 0) {
        w.deadline = deadlineTimer(Math.max(1, Math.ceil(timeoutUs / 1000)), () =>
          this.withdraw(
            target,
            w,
            new StageError(
              Code.Unavailable,
              this.model,
              `Request timeout expired: waited for its sequence's slot longer than its timeout of ${timeoutUs} µs`,
            ),
          ),
        );
      }
      target.queue.push(w);
      this.queuedCount++;
      this.pump(target);
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    const sequences = new Set([...this.open.values(), ...this.backlog]);
    for (const seq of sequences) {
      if (seq.timer) clearTimeout(seq.timer);
      for (const w of seq.queue.splice(0)) {
        w.detach?.();
        clearTimeout(w.deadline);
        this.queuedCount--;
        this.options.onRefused?.(nowNs() - w.startNs);
        w.reject(new StageError(Code.Unavailable, this.model, "stage is closed"));
      }
    }
    this.open.clear();
    this.backlog.length = 0;
  }

  /** Refuses a request before it queues, counting the failure. */
  private refuse(startNs: number, err: ConnectError): Promise<never> {
    this.options.onRefused?.(nowNs() - startNs);
    return Promise.reject(err);
  }

  private bad(msg: string): StageError {
    return new StageError(Code.InvalidArgument, this.model, msg);
  }

  /** The request's sequence flags; refuses what the client may not send (the batcher's own tensors, a batch of several). */
  private checkRequest(request: InferRequest): SequenceFlags {
    const model = this.model;
    const flags = sequenceFlags(model, request.parameters);
    for (const t of request.inputs) {
      if (this.extraInputs.has(t.name)) {
        throw this.bad(
          `input ${t.name} is supplied by the sequence batcher (sequence_batching control_input or state), not by the client`,
        );
      }
      if (this.batching && t.shape[0] !== 1) {
        throw this.bad(
          `inference request to model '${model}' must specify batch-size 1 due to requirements of sequence batcher (input ${t.name} has shape ${formatShape(t.shape)})`,
        );
      }
    }
    for (const o of request.outputs ?? []) {
      if (this.stateOutputs.has(o.name) && !this.configOutputs.includes(o.name)) {
        throw this.bad(
          `output ${o.name} is the sequence's implicit state; list it in the config's outputs to request it`,
        );
      }
    }
    return flags;
  }

  /** Runs the sequence's next request, when it holds a slot and none of its requests is running. */
  protected override pump(seq: Sequence): void {
    if (!seq.hasSlot || seq.running) return;
    const w = seq.queue.shift();
    if (!w) {
      if (seq.ended) this.release(seq);
      return;
    }
    const model = this.model;
    this.queuedCount--;
    w.detach?.();
    clearTimeout(w.deadline);
    seq.running = true;
    let request: InferRequest;
    try {
      request = this.forModel(seq, w);
    } catch (err) {
      seq.running = false;
      this.options.onRefused?.(nowNs() - w.startNs);
      w.reject(toConnectError(err, model));
      this.pump(seq);
      return;
    }
    this.options
      .run(request, w.options)
      .then(
        (response) => w.resolve(this.fromModel(seq, w, response)),
        (err: unknown) => w.reject(toConnectError(err, model)),
      )
      .catch((err: unknown) => w.reject(toConnectError(err, model)))
      .finally(() => {
        seq.running = false;
        this.pump(seq);
      });
  }

  /** The request as the model gets it: control and state tensors added, state outputs asked for. */
  private forModel(seq: Sequence, w: Waiting): InferRequest {
    const { layout, lead } = this;
    const inputs = [...w.request.inputs];
    for (const c of layout.controls) {
      inputs.push(controlTensor(c, c.kind === "READY" ? true : c.kind === "START" ? w.start : w.end, lead));
    }
    if (layout.corrid) inputs.push(corridTensor(this.model, layout.corrid, seq.id, lead));
    for (const s of layout.states) {
      inputs.push((!w.start && seq.state.get(s.input)) || initialStateTensor(s, lead, this.initialData.get(s.input)));
    }
    const wanted = w.request.outputs?.length ? w.request.outputs : this.configOutputs.map((name) => ({ name }));
    const outputs =
      wanted.length > 0
        ? [
            ...wanted,
            ...[...this.stateOutputs].filter((n) => !wanted.some((o) => o.name === n)).map((name) => ({ name })),
          ]
        : undefined;
    return { ...w.request, inputs, ...(outputs ? { outputs } : {}) };
  }

  /** Keeps the response's output states for the next request; gives the client what it asked for. */
  private fromModel(seq: Sequence, w: Waiting, response: InferResponse): InferResponse {
    const model = this.model;
    for (const s of this.layout.states) {
      const out = response.outputs.find((t) => t.name === s.output);
      if (!out)
        throw new StageError(
          Code.Internal,
          model,
          `the model gave no output state ${s.output} (state input ${s.input})`,
        );
      if (out.datatype !== s.datatype) {
        throw new StageError(
          Code.Internal,
          model,
          `output state ${s.output}: expected ${s.datatype}, got ${out.datatype}`,
        );
      }
      seq.state.set(s.input, { ...out, name: s.input });
    }
    // No outputs named (absent or empty, as protobuf gives it) means every config output.
    const asked = w.request.outputs?.length ? w.request.outputs.map((o) => o.name) : undefined;
    const keep = (name: string) =>
      asked ? asked.includes(name) : !this.stateOutputs.has(name) || this.configOutputs.includes(name);
    return { ...response, outputs: response.outputs.filter((t) => keep(t.name)) };
  }
}

/**
 * `stage` with its config's sequence_batching applied in front of its infer:
 * what the repository loader does for a TypeScript stage whose config has
 * it. The stage's compute sees the control and state tensors as inputs.
 */
export async function withSequenceBatching(
  stage: Stage,
  options: { modelDir?: string; instances?: number } = {},
): Promise<Stage> {
  if (stage.inferStream) {
    // Its requests are answered once each through the sequencer; a stream would bypass it.
    throw new StageError(
      Code.InvalidArgument,
      stage.name,
      "sequence_batching with model_transaction_policy { decoupled: true } is not supported: a sequence's requests here are answered once each",
    );
  }
  // Requests the sequence batcher fails itself never reach the stage: counted here as its failures.
  const refused = { count: 0n, ns: 0n };
  const sequencer = await createSequenceBatcher({
    config: stage.config,
    ...options,
    run: (request, inferOptions) => stage.infer(request, inferOptions),
    onRefused: (ns) => {
      refused.count += 1n;
      refused.ns += BigInt(Math.round(ns));
    },
  });
  // The rest (readiness, metadata, a queue bound of its own) is the stage's.
  return delegateStage(stage, {
    infer: (request, inferOptions) => sequencer.infer(request, inferOptions),
    async statistics() {
      const stats = clone(ModelStatisticsSchema, await stage.statistics());
      stats.inferenceStats ??= create(InferStatisticsSchema);
      stats.inferenceStats.fail ??= create(StatisticDurationSchema);
      stats.inferenceStats.fail.count += refused.count;
      stats.inferenceStats.fail.ns += refused.ns;
      return stats;
    },
    pendingRequests: () => sequencer.queued + (stage.pendingRequests?.() ?? 0),
    async close() {
      sequencer.close();
      await stage.close();
    },
  });
}
