/**
 * Failure isolation without amplification. A merged batch that fails is bisected to find the
 * request that failed it (about 2·log2(k) runs for one culprit among k, each run as large as it
 * can be), and the halves that succeed answer their requests. Re-runs spend a per-model budget
 * that merged executions earn back slowly; while it is spent, requests whose content recently
 * failed are kept out of merged batches and run alone in a quarantine lane, which gets one turn
 * per LANE_EVERY merged executions, or after LANE_IDLE_MS without one (a model with no good
 * traffic), so a client that keeps sending a failing request cannot drag its neighbours' batches
 * down. (Under closed-loop clients the queue is often empty the moment a batch ends, its clients
 * still reading their answers: a lane that ran whenever no good request waited would run after
 * every batch.)
 */
import { createHash } from "node:crypto";
import type { InferRequest, StatisticsRecorder } from "@trellis/stage";

/** How long a request's content stays suspect after it failed an execution alone. */
const SUSPECT_MS = 30_000;
/** The most distinct failing contents remembered; the oldest is forgotten first. */
const MAX_SUSPECTS = 4096;
/** Re-run executions a model may spend at once before recent failures are quarantined. */
const BUDGET_BURST = 16;
/** What each merged execution earns back: re-runs stay within 1/16 of executions over time. */
const BUDGET_PER_EXECUTION = 1 / 16;
/** The lane runs one request per this many merged executions… */
export const LANE_EVERY = 8;
/** …or when no merged execution started for this long. */
const LANE_IDLE_MS = 5;

/** One model's isolation state: its re-run budget, the contents that recently failed, the lane's turn. */
export class FailureIsolation {
  /** Content key → when it stops being suspect (ms since the epoch), oldest first. */
  private readonly suspects = new Map<string, number>();
  private readonly keys = new WeakMap<InferRequest, string>();
  private budget = BUDGET_BURST;
  private sinceLane = 0;
  private lastMergedMs = 0;

  constructor(private readonly recorder: StatisticsRecorder) {}

  /** Whether this request goes to the lane: its content failed recently and the re-run budget is spent. */
  isSuspect(request: InferRequest): boolean {
    if (this.budget >= 1 || this.suspects.size === 0) return false;
    const key = this.keyOf(request);
    const until = this.suspects.get(key);
    if (until === undefined) return false;
    if (until > Date.now()) return true;
    this.suspects.delete(key);
    return false;
  }

  /** A request failed an execution on its own: its content is suspect for a while. */
  failed(request: InferRequest): void {
    const key = this.keyOf(request);
    this.suspects.delete(key); // re-inserted last: the map stays in expiry order
    this.suspects.set(key, Date.now() + SUSPECT_MS);
    if (this.suspects.size > MAX_SUSPECTS) {
      const oldest = this.suspects.keys().next().value;
      if (oldest !== undefined) this.suspects.delete(oldest);
    }
  }

  /** A request succeeded on its own: content that failed for a passing reason is forgiven. */
  succeeded(request: InferRequest): void {
    if (this.suspects.size > 0) this.suspects.delete(this.keyOf(request));
  }

  /** `count` executions were run again to find a failed batch's culprit. */
  reran(count: number): void {
    this.budget -= count;
    this.recorder.isolated(count, 0);
  }

  /** A batch left the queue: a lane run resets the lane's turn; a merged one earns back budget. */
  ran(inLane: boolean): void {
    if (inLane) {
      this.sinceLane = 0;
      this.recorder.isolated(0, 1);
      return;
    }
    this.sinceLane += 1;
    this.lastMergedMs = performance.now();
    this.budget = Math.min(BUDGET_BURST, this.budget + BUDGET_PER_EXECUTION);
  }

  /** Whether the lane may run now: enough merged executions ran since its last turn, or none for a while. */
  laneTurn(): boolean {
    return this.sinceLane >= LANE_EVERY || this.laneWaitNs() === 0;
  }

  /** How long until the lane's turn comes without merged executions (ns; 0: it has). */
  laneWaitNs(): number {
    return Math.max(0, Math.ceil((this.lastMergedMs + LANE_IDLE_MS - performance.now()) * 1e6));
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
