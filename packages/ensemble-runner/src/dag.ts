/**
 * DAG execution: one pass of a request over a set of steps, each started the moment its last
 * input exists (so independent steps overlap), each holding its slot until the steps it
 * unblocked hold theirs (Triton's max_inflight_requests).
 */
import {
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type RequestedOutput,
  type Stage,
  type StageError,
  type Tensor,
} from "@trellis/stage";
import { abortError, missingOutput, stepError } from "./errors.js";
import type { Limiter } from "./limiter.js";
import {
  requestBatch,
  type StepRuntime,
  type StepTotals,
  stepOptions,
  stepRecorder,
  stepRequest,
  stepSucceeded,
} from "./steps.js";

/** One request as its steps see it: shared by every pass over the DAG it makes. */
export interface RequestContext {
  /** The ensemble's name, for errors. */
  ensemble: string;
  steps: StepRuntime[];
  /** The stages this request's steps run on (by step index), held for it since it began. */
  stages: readonly Stage[];
  request: InferRequest;
  options: InferOptions | undefined;
  perStep: RequestedOutput[][];
  batch: number;
  signal: AbortSignal;
  /** Aborts the request's signal, so steps still waiting never start and running ones stop. */
  fail: (err: StageError) => void;
  totals: StepTotals;
  /** The decoupled step while this request holds its slot (released when the request ends). */
  held?: StepRuntime;
  /** Each tensor's batch size: of the request that made it (0: made by a model that does not batch). */
  batchOf: WeakMap<Tensor, number>;
}

/**
 * Runs the steps in `members` for the request, reading and adding to `tensors` (steps outside
 * `members` have run already: their tensors are there). Rejects with the first failure.
 */
export async function runSteps(
  ctx: RequestContext,
  tensors: Map<string, Tensor>,
  members: ReadonlySet<number>,
): Promise<void> {
  if (members.size === 0) return;
  await new Promise<void>((resolve, reject) => new DagPass(ctx, tensors, members, resolve, reject).start());
}

/** A step's slot, released at most once. */
function slotRelease(limiter: Limiter): () => void {
  let held = true;
  return () => {
    if (held) limiter.release();
    held = false;
  };
}

class DagPass {
  /** Per step, how many of its producers in `members` have not finished. */
  private readonly missing: number[];
  private remaining: number;
  private failed = false;
  private readonly onAbort = () => this.stop(abortError(this.ctx.ensemble, this.ctx.signal.reason));

  constructor(
    private readonly ctx: RequestContext,
    private readonly tensors: Map<string, Tensor>,
    private readonly members: ReadonlySet<number>,
    private readonly resolve: () => void,
    private readonly reject: (err: StageError) => void,
  ) {
    this.missing = ctx.steps.map((rt) => rt.plan.dependsOn.filter((d) => members.has(d)).length);
    this.remaining = members.size;
    ctx.signal.addEventListener("abort", this.onAbort, { once: true });
  }

  start(): void {
    for (const rt of this.ctx.steps) {
      if (this.members.has(rt.plan.index) && this.missing[rt.plan.index] === 0) void this.launch(rt);
    }
  }

  private stop(err: StageError): void {
    if (this.failed) return;
    this.failed = true;
    this.ctx.fail(err);
    this.reject(err);
  }

  private finish(): void {
    this.ctx.signal.removeEventListener("abort", this.onAbort);
    this.resolve();
  }

  /** Starts `rt` for this request; resolves once it holds its slot (or is refused). */
  private launch(rt: StepRuntime): Promise<void> {
    const queued = nowNs();
    const admitted = rt.limiter.acquire(this.ctx.signal);
    admitted.then(
      () => this.runStep(rt, queued),
      () => this.stop(abortError(this.ctx.ensemble, this.ctx.signal.reason)),
    );
    return admitted;
  }

  /** Calls `rt`, which holds its slot, then starts the steps it unblocked. */
  private async runStep(rt: StepRuntime, queued: number): Promise<void> {
    const { ctx } = this;
    const step = rt.plan;
    const started = nowNs();
    const release = slotRelease(rt.limiter);
    try {
      if (ctx.signal.aborted) return release();
      let response: InferResponse;
      let sent: InferRequest;
      const stage = ctx.stages[step.index] as Stage;
      const options = stepOptions(step, stage.version, ctx.signal, ctx.options);
      const stats = stepRecorder(rt, stage.version);
      try {
        sent = stepRequest(step, stage, this.tensors, ctx.request, ctx.perStep, ctx.batchOf);
        response = await stage.infer(sent, options);
      } catch (err) {
        options.trace?.failed?.();
        stats.requestFailed(nowNs() - queued);
        release();
        this.stop(
          ctx.signal.aborted ? abortError(ctx.ensemble, ctx.signal.reason) : stepError(ctx.ensemble, step, err),
        );
        return;
      }
      stepSucceeded(stats, ctx.batch, queued, started, ctx.totals);
      if (ctx.signal.aborted) return release();
      for (const o of step.outputs) {
        const t = response.outputs.find((x) => x.name === o.name);
        if (!t) {
          release();
          return this.stop(stepError(ctx.ensemble, step, missingOutput(o.name)));
        }
        this.tensors.set(o.tensor, t);
        ctx.batchOf.set(t, requestBatch(stage, sent));
      }
      this.remaining -= 1;
      if (this.remaining === 0) this.finish();
      this.startDependents(rt, release);
    } catch (err) {
      release();
      this.stop(stepError(ctx.ensemble, step, err));
    }
  }

  /**
   * Starts the dependents of `rt` whose last input it made. Triton's max_inflight_requests: `rt`
   * keeps its slot until every step it unblocked has one, so a full downstream step holds back
   * upstream work.
   */
  private startDependents(rt: StepRuntime, release: () => void): void {
    const ready: StepRuntime[] = [];
    for (const d of rt.plan.dependents) {
      if (!this.members.has(d)) continue;
      this.missing[d]! -= 1;
      if (this.missing[d] === 0) ready.push(this.ctx.steps[d]!);
    }
    if (ready.length === 0) release();
    else void Promise.allSettled(ready.map((r) => this.launch(r))).then(release);
  }
}
