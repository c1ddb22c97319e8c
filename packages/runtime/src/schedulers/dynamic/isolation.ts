/**
 * Failure isolation without amplification. A merged batch that fails is bisected to find the
 * request that failed it (about 2·log2(k) runs for one culprit among k, each run as large as it
 * can be), and the halves that succeed answer their requests (bisection.ts). Every re-run is paid
 * from a per-model budget, checked before the run and never overdrawn, that merged executions earn
 * back slowly: what the budget cannot pay for runs alone in the lane (DeferredRerun). While the
 * budget is not full, requests whose content recently failed alone are kept out of merged batches
 * and run alone in a quarantine lane, one lane run at a time, which gets one turn per LANE_EVERY
 * merged executions, or when no merged execution ran (none in flight, none started or ended) for
 * LANE_IDLE_MS (a model with no good traffic), so a client that keeps sending a failing request
 * cannot drag its neighbours' batches down. (Under closed-loop clients the queue is often empty the
 * moment a batch ends, its clients still reading their answers: a lane that ran whenever no good
 * request waited would run after every batch; one timed from a merged run's start would run beside
 * every long one.) An input whose lone run ended its instance (a crash, a timeout: costly restarts,
 * InstanceEndedError) is not run again for a while: it is refused at once, naming why, for
 * SUSPECT_MS or COST_MULTIPLE times what its run cost the instance (a 2 s timeout: 2 minutes),
 * whichever is longer, so resending it can take at most about 1/COST_MULTIPLE of the instance's
 * time; each time the same input ends the instance again when let through, it is refused twice as
 * long (up to MAX_REFUSAL_MS, or its first window if longer), so a client resending it costs one
 * restart per window, ever rarer.
 */
import { createHash } from "node:crypto";
import type { InferRequest, StatisticsRecorder } from "@trellis/stage";
import { StageError } from "@trellis/stage";
import type { InstanceEndedError } from "@trellis/stage/backend";

/** How long a request's content stays suspect after it failed an execution alone. */
const SUSPECT_MS = 30_000;
/** An input that ended its instance is refused at least this many times as long as its run took. */
const COST_MULTIPLE = 60;
/** The longest an input that keeps ending the instance is refused at a time (unless its first window is longer). */
const MAX_REFUSAL_MS = 16 * SUSPECT_MS;
/** How long an input that ended the instance is remembered after its refusal ends (its strikes kept). */
const STRIKES_KEPT_MS = 2 * MAX_REFUSAL_MS;
/** The most distinct failing contents remembered (each kind); the oldest is forgotten first. */
const MAX_SUSPECTS = 4096;
/** Re-run executions a model may spend at once; suspects merge again only once it is full. */
export const BUDGET_BURST = 16;
/** What each merged execution earns back: re-runs stay within 1/16 of executions over time. */
export const BUDGET_PER_EXECUTION = 1 / 16;
/** The lane runs one request per this many merged executions… */
export const LANE_EVERY = 8;
/** …or when no merged execution ran for this long. */
const LANE_IDLE_MS = 5;

/** Why an input that ended its instance is refused, and until when (ms since the epoch). */
interface Fatal {
  until: number;
  /** How many times its run ended the instance (each doubles the refusal). */
  strikes: number;
  at: number;
  code: InstanceEndedError["code"];
  why: string;
}

/** One model's isolation state: its re-run budget, the contents that recently failed, the lane's turn. */
export class FailureIsolation {
  /** Content key → when it stops being suspect (ms since the epoch), oldest first. */
  private readonly suspects = new Map<string, number>();
  /** Content key → its lone run ended the instance: refused until then, oldest first. */
  private readonly fatal = new Map<string, Fatal>();
  private readonly keys = new WeakMap<InferRequest, string>();
  private budget = BUDGET_BURST;
  private sinceLane = 0;
  private mergedRunning = 0;
  private laneRunning = 0;
  /** When a merged execution last started or ended (performance.now() ms). */
  private lastMergedMs = 0;
  /** The end of the latest refusal window (ms since the epoch): past it no input is refused. */
  private refusingUntil = 0;
  /** Inputs that ended their instance so far: the batcher re-checks its queue when this grows. */
  fatalCount = 0;

  constructor(
    private readonly recorder: StatisticsRecorder,
    private readonly name = recorder.name,
  ) {}

  /** Whether this request goes to the lane: its content failed alone recently and the re-run budget is not full. */
  isSuspect(request: InferRequest): boolean {
    if (this.budget >= BUDGET_BURST || this.suspects.size === 0) return false;
    const key = this.keyOf(request);
    const until = this.suspects.get(key);
    if (until === undefined) return false;
    if (until > Date.now()) return true;
    this.suspects.delete(key);
    return false;
  }

  /** Whether some input is refused now (refusal() may answer); false: no request need be hashed for it. */
  get refusing(): boolean {
    return this.refusingUntil > Date.now();
  }

  /** The refusal of an input whose lone run ended its instance less than SUSPECT_MS ago; undefined: run it. */
  refusal(request: InferRequest): StageError | undefined {
    if (!this.refusing) return undefined;
    const fatal = this.fatal.get(this.keyOf(request));
    const now = Date.now();
    // Past its window it is let through once more, its strikes kept a while (endedAlone).
    if (fatal === undefined || fatal.until <= now) return undefined;
    const ago = Math.max(0, Math.round((now - fatal.at) / 1000));
    return new StageError(
      fatal.code,
      this.name,
      `the same input ended the model's instance ${ago} s ago (${fatal.why}); it is refused without running for ${Math.round((fatal.until - fatal.at) / 1000)} s after that`,
    );
  }

  /** A request failed an execution on its own: its content is suspect for a while. */
  failed(request: InferRequest): void {
    remember(this.suspects, this.keyOf(request), Date.now() + SUSPECT_MS);
  }

  /**
   * A request's execution on its own ended its instance, its run having taken `costMs`: the same
   * input is refused for a while (longer the more its run cost).
   */
  endedAlone(request: InferRequest, error: InstanceEndedError, costMs = 0): void {
    const now = Date.now();
    const key = this.keyOf(request);
    const previous = this.fatal.get(key);
    const kept = previous !== undefined && previous.until + STRIKES_KEPT_MS > now;
    const strikes = (kept ? previous.strikes : 0) + 1;
    const firstMs = Math.max(SUSPECT_MS, COST_MULTIPLE * costMs);
    const refusalMs = Math.min(Math.max(MAX_REFUSAL_MS, firstMs), firstMs * 2 ** (strikes - 1));
    const why = messageWithoutStage(error);
    remember(this.fatal, key, { until: now + refusalMs, at: now, code: error.code, why, strikes });
    this.refusingUntil = Math.max(this.refusingUntil, now + refusalMs);
    this.fatalCount += 1;
    this.failed(request);
  }

  /** A request succeeded on its own: content that failed for a passing reason is forgiven. */
  succeeded(request: InferRequest): void {
    if (this.suspects.size > 0) this.suspects.delete(this.keyOf(request));
    // Its strikes are forgotten only if it was hashed anyway: no request is hashed just for this.
    const key = this.keys.get(request);
    if (key !== undefined) this.fatal.delete(key);
  }

  /**
   * Pays for one re-run to isolate a failed batch's culprit: false, paying nothing, when the
   * budget cannot (the caller fails those requests instead). Checked before every re-run.
   */
  tryRerun(): boolean {
    if (this.budget < 1) return false;
    this.budget -= 1;
    this.recorder.isolated(1, 0);
    return true;
  }

  /** Re-runs the budget can pay for now. */
  get rerunsLeft(): number {
    return Math.floor(this.budget);
  }

  /** A batch left the queue: a lane run resets the lane's turn; a merged one earns back budget. */
  ran(inLane: boolean): void {
    if (inLane) {
      this.sinceLane = 0;
      this.laneRunning += 1;
      this.recorder.isolated(0, 1);
      return;
    }
    this.sinceLane += 1;
    this.mergedRunning += 1;
    this.lastMergedMs = performance.now();
    this.budget = Math.min(BUDGET_BURST, this.budget + BUDGET_PER_EXECUTION);
  }

  /** A batch's execution ended (answered or failed). */
  finished(inLane: boolean): void {
    if (inLane) {
      this.laneRunning -= 1;
      return;
    }
    this.mergedRunning -= 1;
    this.lastMergedMs = performance.now();
  }

  /**
   * Whether the lane may run now: it is not running, and enough merged executions ran since its
   * last turn, or none ran for a while.
   */
  laneTurn(): boolean {
    if (this.laneRunning > 0) return false;
    return this.sinceLane >= LANE_EVERY || this.laneWaitNs() === 0;
  }

  /** How long until the lane's turn comes without merged executions (ns; 0: it has). */
  laneWaitNs(): number {
    const idleMs = this.mergedRunning > 0 ? LANE_IDLE_MS : this.lastMergedMs + LANE_IDLE_MS - performance.now();
    return Math.max(0, Math.ceil(idleMs * 1e6));
  }

  /** Whether two requests carry the same inputs (names, datatypes, shapes, bytes). */
  sameInput(a: InferRequest, b: InferRequest): boolean {
    return a === b || this.keyOf(a) === this.keyOf(b);
  }

  /** A digest of the request's inputs (names, datatypes, shapes, bytes), computed once per request. */
  private keyOf(request: InferRequest): string {
    let key = this.keys.get(request);
    if (key !== undefined) return key;
    const hash = createHash("sha256");
    for (const t of [...request.inputs].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      hash.update(`${t.name}\u0000${t.datatype}\u0000${t.shape.join(",")}\u0000`);
      if (Array.isArray(t.data)) {
        for (const element of t.data as Uint8Array[]) hash.update(`${element.byteLength}:`).update(element);
      } else {
        const view = t.data as ArrayBufferView;
        hash.update(new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
      }
    }
    key = hash.digest("base64");
    this.keys.set(request, key);
    return key;
  }
}

/** Sets key → value last in `map` (kept in expiry order), forgetting the oldest past MAX_SUSPECTS. */
function remember<V>(map: Map<string, V>, key: string, value: V): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > MAX_SUSPECTS) {
    const oldest = map.keys().next().value;
    if (oldest !== undefined) map.delete(oldest);
  }
}

/** An error's message without the "stage: " prefix StageError puts before it. */
export function messageWithoutStage(e: { rawMessage: string; stage?: string }): string {
  const prefix = `${e.stage ?? ""}: `;
  return e.stage && e.rawMessage.startsWith(prefix) ? e.rawMessage.slice(prefix.length) : e.rawMessage;
}
