/**
 * The sequence batcher's slot and correlation bookkeeping: a request's correlation ID and
 * START/END flags, the sequences open by ID, which hold a slot and which wait in the backlog,
 * a waiting request withdrawn (cancelled, timed out), and a sequence idle past
 * max_sequence_idle_microseconds giving its slot up. The batcher (batcher.ts) runs the requests.
 */
import type { ConnectError } from "@connectrpc/connect";
import type { InferOptions, InferRequest, InferResponse, ParameterValue, Tensor } from "@trellis/stage";
import { Code, nowNs, StageError } from "@trellis/stage";
import type { SequenceLayout } from "./layout.js";
import type { SequenceBatcherOptions } from "./options.js";

export interface Waiting {
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

export interface Sequence {
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
export function cancelledWaiting(model: string, signal: AbortSignal): StageError {
  const reason: unknown = signal.reason;
  const text = reason instanceof Error ? reason.message : reason === undefined ? "" : String(reason);
  return new StageError(
    Code.Canceled,
    model,
    `request cancelled while waiting in its sequence${text ? `: ${text}` : ""}`,
  );
}

/** sequence_id, sequence_start and sequence_end from a request's parameters, checked as Triton checks them. */
export function sequenceFlags(
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

export type SequenceFlags = ReturnType<typeof sequenceFlags>;

/** The slots and sequences of a sequence batcher; `pump` (the batcher's) runs a sequence's next request. */
export abstract class SequenceSlots {
  protected readonly model: string;
  /** Sequences started and not ended, by `${typeof id}:${id}`. */
  protected readonly open = new Map<string, Sequence>();
  /** Sequences waiting for a slot, oldest first. */
  protected readonly backlog: Sequence[] = [];
  protected freeSlots: number;
  protected queuedCount = 0;
  protected activeCount = 0;
  protected closed = false;

  constructor(
    protected readonly options: SequenceBatcherOptions,
    protected readonly layout: SequenceLayout,
  ) {
    this.model = options.config.name;
    this.freeSlots = layout.slotsPerInstance * Math.max(1, options.instances ?? 1);
  }

  /** A new sequence, opened under `key`: it takes a free slot, or joins the backlog. */
  protected startSequence(key: string, id: bigint | string): Sequence {
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
  protected withdraw(seq: Sequence, w: Waiting, error: StageError): void {
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
  protected watchIdle(key: string, seq: Sequence): void {
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

  protected release(seq: Sequence): void {
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
  protected abstract pump(seq: Sequence): void;
}
