/**
 * Decoupled fan-out: an ensemble with a decoupled step (any number of responses per request)
 * runs the steps after it once per response it sends, and answers once per response.
 */
import { type InferResponse, nowNs, type Stage, type Tensor } from "@trellis/stage";
import { type RequestContext, runSteps } from "./dag.js";
import { abortError, EnsembleStepError, missingOutput, stepError } from "./errors.js";
import type { EnsemblePlan } from "./plan.js";
import { requestBatch, type StepRuntime, stepOptions, stepRecorder, stepRequest, stepSucceeded } from "./steps.js";

/** The steps that read (directly or not) step `from`'s outputs: they run once per response it sends. */
export function downstreamOf(plan: EnsemblePlan, from: number): Set<number> {
  const downstream = new Set<number>();
  const visit = (i: number) => {
    for (const d of plan.steps[i]!.dependents) {
      if (!downstream.has(d)) {
        downstream.add(d);
        visit(d);
      }
    }
  };
  if (from >= 0) visit(from);
  return downstream;
}

/**
 * Calls the decoupled step `rt` once the steps before it made `tensors`; for each response it
 * sends, runs the `downstream` steps on that response's tensors and yields `answer` of them, one
 * at a time, in order. `firstResponse` is called before the first answer is yielded. The step's
 * slot is left in `ctx.held` for the request to release when it ends.
 */
export async function* fanOut(
  ctx: RequestContext,
  rt: StepRuntime,
  tensors: Map<string, Tensor>,
  downstream: ReadonlySet<number>,
  answer: (from: Map<string, Tensor>) => InferResponse,
  firstResponse: () => void,
): AsyncGenerator<InferResponse> {
  const step = rt.plan;
  const queued = nowNs();
  await rt.limiter.acquire(ctx.signal);
  ctx.held = rt;
  const started = nowNs();
  const stage = ctx.stages[step.index] as Stage;
  const stats = stepRecorder(rt, stage.version);
  const sent = stepRequest(step, stage, tensors, ctx.request, ctx.perStep, ctx.batchOf);
  const responses = stage.inferStream!(sent, stepOptions(step, stage.version, ctx.signal, ctx.options));
  const batch = requestBatch(stage, sent);
  let first = true;
  try {
    for await (const response of responses) {
      const each = new Map(tensors);
      for (const o of step.outputs) {
        const t = response.outputs.find((x) => x.name === o.name);
        if (!t) throw missingOutput(o.name);
        each.set(o.tensor, t);
        ctx.batchOf.set(t, batch);
      }
      await runSteps(ctx, each, downstream);
      if (first) firstResponse();
      first = false;
      yield answer(each);
    }
  } catch (err) {
    stats.requestFailed(nowNs() - queued);
    // A later step's failure is already named; the decoupled step's own is named here.
    if (err instanceof EnsembleStepError) throw err;
    if (ctx.signal.aborted) throw abortError(ctx.ensemble, ctx.signal.reason);
    throw stepError(ctx.ensemble, step, err);
  }
  stepSucceeded(stats, ctx.batch, queued, started, ctx.totals);
}
