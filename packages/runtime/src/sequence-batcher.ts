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
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { clone, create } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import {
  InferStatisticsSchema,
  ModelSequenceBatching_Control_Kind as Kind,
  type ModelConfig,
  ModelStatisticsSchema,
  StatisticDurationSchema,
} from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse, ParameterValue, Stage } from "@trellis/stage";
import {
  Code,
  type DataType,
  datatypeFromConfig,
  elementCount,
  formatShape,
  nowNs,
  StageError,
  type Tensor,
  type TensorData,
} from "@trellis/stage";
import {
  allocate,
  bytesOf,
  deadlineTimer,
  delegateStage,
  elementSize,
  modelFilePath,
  type NumericType,
  toConnectError,
  viewAs,
} from "@trellis/stage/backend";

/** A tensor the sequence batcher adds to each request: its name, datatype and dims (without the batch dim). */
export interface SequenceTensorSpec {
  name: string;
  datatype: DataType;
  dims: number[];
}

type BooleanKind = "START" | "END" | "READY";

interface BooleanControl {
  kind: BooleanKind;
  name: string;
  datatype: "INT32" | "FP32" | "BOOL";
  /** [false value, true value] */
  values: [number, number];
}

interface CorridControl {
  name: string;
  datatype: "UINT64" | "INT64" | "UINT32" | "INT32" | "BYTES";
}

interface StateSpec {
  input: string;
  output: string;
  datatype: DataType;
  dims: number[];
  /** The first request's input state: what initial_state gives, else zeros with variable dims as 1 (Triton's). */
  initial: { dims: number[]; data?: Uint8Array };
}

interface SequenceLayout {
  controls: BooleanControl[];
  corrid?: CorridControl;
  states: StateSpec[];
  idleMs: number;
  slotsPerInstance: number;
}

const KIND_NAMES: Record<number, BooleanKind | "CORRID"> = {
  [Kind.CONTROL_SEQUENCE_START]: "START",
  [Kind.CONTROL_SEQUENCE_END]: "END",
  [Kind.CONTROL_SEQUENCE_READY]: "READY",
  [Kind.CONTROL_SEQUENCE_CORRID]: "CORRID",
};
const CORRID_TYPES = ["UINT64", "INT64", "UINT32", "INT32", "BYTES"] as const;

/** The config's sequence_batching section, or undefined when the model has none. */
function sequenceSection(config: ModelConfig) {
  return config.schedulingChoice.case === "sequenceBatching" ? config.schedulingChoice.value : undefined;
}

/** Reads and checks the config's control inputs and states; a bad entry fails the load, named. */
function readLayout(config: ModelConfig): SequenceLayout | undefined {
  const sb = sequenceSection(config);
  if (!sb) return undefined;
  const model = config.name;
  const bad = (msg: string) => new StageError(Code.InvalidArgument, model, `sequence_batching: ${msg}`);
  if (sb.iterativeSequence) {
    throw bad("iterative_sequence is not supported: each request of a sequence is sent by the client");
  }
  const controls: BooleanControl[] = [];
  let corrid: CorridControl | undefined;
  const seen = new Set<string>();
  for (const input of sb.controlInput) {
    if (!input.name) throw bad("a control_input has no name");
    if (input.control.length !== 1) {
      throw bad(`control_input ${input.name}: expected one control, got ${input.control.length}`);
    }
    const control = input.control[0]!;
    const kind = KIND_NAMES[control.kind];
    if (!kind) throw bad(`control_input ${input.name}: unknown control kind ${control.kind}`);
    if (seen.has(kind)) throw bad(`more than one control_input carries CONTROL_SEQUENCE_${kind}`);
    seen.add(kind);
    if (kind === "CORRID") {
      const datatype = datatypeFromConfig(control.dataType);
      if (!(CORRID_TYPES as readonly string[]).includes(datatype)) {
        throw bad(
          `control_input ${input.name}: CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got ${control.dataType === 0 ? "none" : `TYPE_${datatype === "BYTES" ? "STRING" : datatype}`}`,
        );
      }
      corrid = { name: input.name, datatype: datatype as CorridControl["datatype"] };
      continue;
    }
    const given = [
      ["INT32", control.int32FalseTrue],
      ["FP32", control.fp32FalseTrue],
      ["BOOL", control.boolFalseTrue.map(Number)],
    ].filter(([, v]) => (v as number[]).length > 0) as [BooleanControl["datatype"], number[]][];
    const [datatype, values] = given[0] ?? [];
    if (given.length !== 1 || !datatype || values?.length !== 2) {
      throw bad(
        `control_input ${input.name}: CONTROL_SEQUENCE_${kind} needs one of int32_false_true, fp32_false_true or bool_false_true, with two values [false, true]`,
      );
    }
    controls.push({ kind, name: input.name, datatype, values: [values[0]!, values[1]!] });
  }
  const states = sb.state.map((s): StateSpec => {
    if (!s.inputName || !s.outputName) throw bad("a state needs input_name and output_name");
    const datatype = datatypeFromConfig(s.dataType);
    const dims = s.dims.map(Number);
    const where = `state ${s.inputName}/${s.outputName}`;
    if (s.initialState.length > 1) throw bad(`${where}: at most one initial_state, got ${s.initialState.length}`);
    const init = s.initialState[0];
    if (!init)
      return { input: s.inputName, output: s.outputName, datatype, dims, initial: { dims: variableAsOne(dims) } };
    const initDims = init.dims.map(Number);
    if (init.dataType !== s.dataType) {
      throw bad(
        `${where}: initial_state data_type ${datatypeFromConfig(init.dataType)} differs from the state's ${datatype}`,
      );
    }
    const fits =
      initDims.length === dims.length && initDims.every((d, i) => d >= 0 && (dims[i] === -1 || dims[i] === d));
    if (!fits) {
      throw bad(
        `${where}: initial_state dims ${formatShape(initDims)} must be fixed and fit the state's ${formatShape(dims)}`,
      );
    }
    if (init.stateData.case === undefined) throw bad(`${where}: initial_state needs zero_data or data_file`);
    if (datatype === "BYTES" && init.stateData.case === "dataFile") {
      throw bad(`${where}: a TYPE_STRING state cannot be read from data_file`);
    }
    return { input: s.inputName, output: s.outputName, datatype, dims, initial: { dims: initDims } };
  });
  const idleUs = Number(sb.maxSequenceIdleMicroseconds);
  const oldest = sb.strategyChoice.case === "oldest" ? sb.strategyChoice.value : undefined;
  const slotsPerInstance =
    oldest && oldest.maxCandidateSequences > 0 ? oldest.maxCandidateSequences : Math.max(1, config.maxBatchSize);
  return { controls, corrid, states, idleMs: idleUs > 0 ? idleUs / 1000 : 1000, slotsPerInstance };
}

const variableAsOne = (dims: number[]) => dims.map((d) => (d < 0 ? 1 : d));
const encoder = new TextEncoder();

/**
 * The inputs the sequence batcher gives a model beyond its config's `input`
 * section (control inputs, then state inputs), and the state outputs it takes
 * back: what a stage's request checks must let through, and what an ONNX
 * model's own inputs are checked against. Empty for a model without
 * sequence_batching.
 */
export function sequenceTensors(config: ModelConfig): { inputs: SequenceTensorSpec[]; outputs: SequenceTensorSpec[] } {
  const layout = readLayout(config);
  return layout ? tensorsOf(layout) : { inputs: [], outputs: [] };
}

function tensorsOf(layout: SequenceLayout): { inputs: SequenceTensorSpec[]; outputs: SequenceTensorSpec[] } {
  const controls = [...layout.controls, ...(layout.corrid ? [layout.corrid] : [])].map((c) => ({
    name: c.name,
    datatype: c.datatype,
    dims: [1],
  }));
  const states = layout.states.map((s) => ({ name: s.input, datatype: s.datatype, dims: s.dims }));
  return {
    inputs: [...controls, ...states],
    outputs: layout.states.map((s) => ({ name: s.output, datatype: s.datatype, dims: s.dims })),
  };
}

export interface SequenceBatcherOptions {
  /** The model's config: sequence_batching says what to add; max_batch_size whether tensors carry a batch dim. */
  config: ModelConfig;
  /** `<repository>/<model>`: initial_state data files are read from its `initial_state` folder. */
  modelDir?: string;
  /** Model instances (default 1): each holds max(1, max_batch_size) sequence slots, or oldest's max_candidate_sequences. */
  instances?: number;
  /** Runs one request of a sequence, its control and state tensors added: the model's own infer. */
  run(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /**
   * Called for each request that fails before reaching `run` (refused, cancelled while it
   * waited, or the stage closed), with its time in ns: the stage counts it as a failed request.
   */
  onRefused?(elapsedNs: number): void;
}

export interface SequenceBatcher {
  infer(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /** Requests waiting for their sequence's previous request or for a slot (not yet handed to `run`). */
  readonly queued: number;
  /** Sequences holding a slot. */
  readonly active: number;
  /** Sequences waiting for a slot. */
  readonly backlogged: number;
  /** Fails waiting requests with UNAVAILABLE and stops the idle timers; requests already running finish. */
  close(): void;
}

interface Waiting {
  request: InferRequest;
  startNs: number;
  options: InferOptions | undefined;
  start: boolean;
  end: boolean;
  detach?: () => void;
  /** The request's own timeout while it waits (not once it runs), as the dynamic batcher's queue. */
  deadline?: NodeJS.Timeout;
  resolve(response: InferResponse): void;
  reject(err: ConnectError): void;
}

interface Sequence {
  id: bigint | string;
  queue: Waiting[];
  running: boolean;
  hasSlot: boolean;
  /** The END request has arrived: the sequence takes no more requests and frees its slot once it has run. */
  ended: boolean;
  /** Input state for the next request, by state input name. */
  state: Map<string, Tensor>;
  lastArrival: number;
  timer?: NodeJS.Timeout;
}

/** The error for a request cancelled while it waited in its sequence, with the signal's reason. */
function cancelledWaiting(model: string, signal: AbortSignal): StageError {
  const reason: unknown = signal.reason;
  const text = reason instanceof Error ? reason.message : reason === undefined ? "" : String(reason);
  return new StageError(
    Code.Canceled,
    model,
    `request cancelled while waiting in its sequence${text ? `: ${text}` : ""}`,
  );
}

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

type SequenceFlags = ReturnType<typeof sequenceFlags>;

class Sequencer implements SequenceBatcher {
  private readonly model: string;
  /** The model has a batch dimension (max_batch_size > 0). */
  private readonly batching: boolean;
  /** The batch dim the added tensors carry: [1] when the model batches. */
  private readonly lead: number[];
  private readonly extraInputs: Set<string>;
  private readonly stateOutputs: Set<string>;
  private readonly configOutputs: string[];
  /** Sequences started and not ended, by `${typeof id}:${id}`. */
  private readonly open = new Map<string, Sequence>();
  /** Sequences waiting for a slot, oldest first. */
  private readonly backlog: Sequence[] = [];
  private freeSlots: number;
  private queuedCount = 0;
  private activeCount = 0;
  private closed = false;

  constructor(
    private readonly options: SequenceBatcherOptions,
    private readonly layout: SequenceLayout,
    /** Each state's initial_state data_file bytes, by state input name. */
    private readonly initialData: Map<string, Uint8Array>,
  ) {
    const { config } = options;
    this.model = config.name;
    this.batching = config.maxBatchSize > 0;
    this.lead = this.batching ? [1] : [];
    this.extraInputs = new Set(tensorsOf(layout).inputs.map((s) => s.name));
    this.stateOutputs = new Set(layout.states.map((s) => s.output));
    this.configOutputs = config.output.map((o) => o.name);
    this.freeSlots = layout.slotsPerInstance * Math.max(1, options.instances ?? 1);
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

  /** A new sequence, opened under `key`: it takes a free slot, or joins the backlog. */
  private startSequence(key: string, id: bigint | string): Sequence {
    const seq: Sequence = {
      id,
      queue: [],
      running: false,
      hasSlot: false,
      ended: false,
      state: new Map(),
      lastArrival: 0,
    };
    this.open.set(key, seq);
    if (this.freeSlots > 0) {
      this.freeSlots--;
      seq.hasSlot = true;
      this.activeCount++;
    } else this.backlog.push(seq);
    return seq;
  }

  /** `w` was cancelled or timed out: it leaves its sequence's queue, if it still waits there. */
  private withdraw(seq: Sequence, w: Waiting, error: StageError): void {
    const i = seq.queue.indexOf(w);
    if (i < 0) return;
    seq.queue.splice(i, 1);
    this.queuedCount--;
    w.detach?.();
    clearTimeout(w.deadline);
    this.options.onRefused?.(nowNs() - w.startNs);
    w.reject(error);
    // A backlogged sequence left with nothing to run gives its backlog place up, as an ended one its slot.
    if (seq.queue.length === 0 && !seq.running && (seq.ended || (!seq.hasSlot && w.start))) {
      if (!seq.ended && this.open.get(`${typeof seq.id}:${seq.id}`) === seq) {
        this.open.delete(`${typeof seq.id}:${seq.id}`);
        seq.ended = true;
      }
      this.release(seq);
    }
  }

  /**
   * The sequence's idle check, once per sequence rather than once per request: when it fires it
   * looks at the last arrival and waits again for what is left (a full period while a request
   * is queued or running), so a steady sequence costs no timer work per request.
   */
  private watchIdle(key: string, seq: Sequence): void {
    if (seq.timer) return;
    const check = () => this.idleCheck(key, seq, check);
    seq.timer = setTimeout(check, this.layout.idleMs).unref();
  }

  /** `check` is this call itself, re-armed while the sequence is busy or not yet idle long enough. */
  private idleCheck(key: string, seq: Sequence, check: () => void): void {
    const { idleMs } = this.layout;
    seq.timer = undefined;
    if (this.closed) return;
    const idleFor = performance.now() - seq.lastArrival;
    const busy = seq.running || seq.queue.length > 0;
    if (busy || idleFor < idleMs) {
      seq.timer = setTimeout(check, busy ? idleMs : idleMs - idleFor).unref();
      return;
    }
    // Idle past max_sequence_idle_microseconds: the sequence is forgotten and its slot goes to another.
    if (this.open.get(key) === seq) this.open.delete(key);
    seq.ended = true;
    this.release(seq);
  }

  private release(seq: Sequence): void {
    if (seq.timer) clearTimeout(seq.timer);
    if (!seq.hasSlot) {
      // A backlogged sequence whose requests were all cancelled, or that went idle, leaves the backlog.
      const i = this.backlog.indexOf(seq);
      if (i >= 0) this.backlog.splice(i, 1);
      return;
    }
    seq.hasSlot = false;
    this.activeCount--;
    const next = this.backlog.shift();
    if (next) {
      next.hasSlot = true;
      this.activeCount++;
      this.pump(next);
    } else this.freeSlots++;
  }

  /** Runs the sequence's next request, when it holds a slot and none of its requests is running. */
  private pump(seq: Sequence): void {
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

/** A START, END or READY control's tensor: its false or true value, `lead` its batch dim. */
function controlTensor(c: BooleanControl, on: boolean, lead: number[]): Tensor {
  const value = c.values[on ? 1 : 0];
  const data =
    c.datatype === "FP32"
      ? Float32Array.of(value)
      : c.datatype === "INT32"
        ? Int32Array.of(value)
        : Uint8Array.of(value ? 1 : 0);
  return { name: c.name, datatype: c.datatype, shape: [...lead, 1], data } as Tensor;
}

/** The CORRID control's tensor: the sequence's ID, refused when it does not fit the control's datatype. */
function corridTensor(model: string, c: CorridControl, id: bigint | string, lead: number[]): Tensor {
  const shape = [...lead, 1];
  if (c.datatype === "BYTES") return { name: c.name, datatype: "BYTES", shape, data: [encoder.encode(String(id))] };
  if (typeof id === "string") {
    throw new StageError(
      Code.InvalidArgument,
      model,
      `sequence_id "${id}" is a string, but control input ${c.name} (CONTROL_SEQUENCE_CORRID) takes ${c.datatype}: send an unsigned integer`,
    );
  }
  const limit =
    c.datatype === "UINT32"
      ? 2n ** 32n
      : c.datatype === "INT32"
        ? 2n ** 31n
        : c.datatype === "INT64"
          ? 2n ** 63n
          : 2n ** 64n;
  if (id >= limit)
    throw new StageError(
      Code.InvalidArgument,
      model,
      `sequence_id ${id} does not fit control input ${c.name} (CONTROL_SEQUENCE_CORRID, ${c.datatype})`,
    );
  const data =
    c.datatype === "UINT64"
      ? BigUint64Array.of(id)
      : c.datatype === "INT64"
        ? BigInt64Array.of(id)
        : c.datatype === "UINT32"
          ? Uint32Array.of(Number(id))
          : Int32Array.of(Number(id));
  return { name: c.name, datatype: c.datatype, shape, data } as Tensor;
}

/** A state's input for a sequence's first request: its initial_state data_file (`file`), else zeros. */
function initialStateTensor(s: StateSpec, lead: number[], file: Uint8Array | undefined): Tensor {
  const shape = [...lead, ...s.initial.dims];
  const count = elementCount(shape);
  if (s.datatype === "BYTES")
    return { name: s.input, datatype: "BYTES", shape, data: Array.from({ length: count }, () => new Uint8Array(0)) };
  const data = allocate(s.datatype as NumericType, count) as Exclude<TensorData, Uint8Array[]>;
  if (file) bytesOf(data).set(file);
  return { name: s.input, datatype: s.datatype, shape, data } as Tensor;
}

/** sequence_id, sequence_start and sequence_end from a request's parameters, checked as Triton checks them. */
function sequenceFlags(
  model: string,
  parameters: Record<string, ParameterValue> | undefined,
): { id: bigint | string; start: boolean; end: boolean } {
  const bad = (msg: string) => new StageError(Code.InvalidArgument, model, msg);
  const raw = parameters?.sequence_id;
  let id: bigint | string;
  if (raw === undefined || raw === 0 || raw === 0n || raw === "") {
    throw bad(`inference request to model '${model}' must specify a non-zero or non-empty correlation ID`);
  } else if (typeof raw === "string") id = raw;
  else if (typeof raw === "bigint" && raw > 0n && raw < 2n ** 64n) id = raw;
  else if (typeof raw === "number" && Number.isSafeInteger(raw) && raw > 0) id = BigInt(raw);
  else throw bad(`parameter sequence_id: expected an unsigned integer or a string, got ${typeof raw} ${String(raw)}`);
  const flag = (key: "sequence_start" | "sequence_end") => {
    const v = parameters?.[key];
    if (v === undefined) return false;
    if (typeof v !== "boolean") throw bad(`parameter ${key}: expected a bool, got ${typeof v} ${String(v)}`);
    return v;
  };
  return { id, start: flag("sequence_start"), end: flag("sequence_end") };
}

/** Each state's initial_state data_file, read and checked against its dims: `<modelDir>/initial_state/<file>`. */
async function readInitialStates(
  config: ModelConfig,
  layout: SequenceLayout,
  modelDir: string | undefined,
): Promise<Map<string, Uint8Array>> {
  const out = new Map<string, Uint8Array>();
  const sb = sequenceSection(config)!;
  for (const [i, s] of layout.states.entries()) {
    const init = sb.state[i]!.initialState[0];
    if (init?.stateData.case !== "dataFile") continue;
    const where = `sequence_batching: state ${s.input}/${s.output}: initial_state data_file ${init.stateData.value}`;
    if (!modelDir) throw new StageError(Code.InvalidArgument, config.name, `${where}: no model folder to read it from`);
    const path = modelFilePath(join(modelDir, "initial_state"), init.stateData.value, `${where}:`, config.name);
    const bytes = await readFile(path).catch((err: NodeJS.ErrnoException) => {
      throw new StageError(Code.InvalidArgument, config.name, `${where}: cannot read it (${err.code ?? "unreadable"})`);
    });
    const need = elementCount(s.initial.dims) * elementSize(s.datatype);
    if (bytes.byteLength !== need) {
      throw new StageError(
        Code.InvalidArgument,
        config.name,
        `${where}: ${s.datatype} ${formatShape(s.initial.dims)} needs ${need} bytes, got ${bytes.byteLength}`,
      );
    }
    out.set(s.input, viewAs("UINT8", bytes));
  }
  return out;
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
