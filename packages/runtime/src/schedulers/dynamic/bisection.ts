/**
 * Finding the request that failed a batch, so that only it fails (its neighbours are answered),
 * without multiplying the cost of the failure. Every re-run is paid from the model's budget
 * (isolation.ts), checked before the run: a request it cannot pay for goes back to the batcher,
 * which runs it alone in the quarantine lane (DeferredRerun).
 *
 * - A batch that failed for an ordinary reason (an exception, a bad output) is bisected on the
 *   same instance: each half runs again merged, a half that succeeds answers its requests, a
 *   half that fails is split again. One culprit among k costs about 2·log2(k) runs.
 * - A batch whose run ended its instance (a crash, a timeout: InstanceEndedError in @trellis/stage/backend) costs a
 *   restart or a whole timeout per failing run, so it is not bisected: its requests run again
 *   alone, in order, until one ends the instance again (that one is the culprit: it fails, and its
 *   input is refused for a while), and the rest then run merged. The request the backend names as
 *   the one it was working on (InstanceEndedError.suspect) goes last: when every other request
 *   succeeded alone, the last is the culprit and fails without running again (one restart in all),
 *   its input refused for a while too. A request whose input is refused by then (the same input
 *   as the culprit's) is refused without running.
 */
import type { InferRequest, RequestOutcome } from "@trellis/stage";
import { nowNs, StageError } from "@trellis/stage";
import { endedInstance, type InstanceEndedError, toConnectError } from "@trellis/stage/backend";
import type { BatchContext, BatchExecutor, BatchResult, RequestsExecutor } from "../execution.js";

import { type FailureIsolation, messageWithoutStage } from "./isolation.js";
import { mergeRequests, rowsOf, splitRows } from "./merge-rows.js";

/** Runs `requests` as one execution: each one's outcome; throws when the execution failed as a whole. */
type RunBatch = (requests: readonly InferRequest[], context: BatchContext) => Promise<RequestOutcome[]>;

/** How long the run that threw each error took (ms): what an input that ended its instance cost. */
const runCosts = new WeakMap<object, number>();

/** Notes that the run which threw `err` started at `t0` (performance.now()); returns `err`. */
function costed(err: unknown, t0: number): unknown {
  if (typeof err === "object" && err !== null) runCosts.set(err, performance.now() - t0);
  return err;
}

const costOf = (err: unknown): number => (typeof err === "object" && err !== null ? (runCosts.get(err) ?? 0) : 0);

/**
 * A merged executor answering request by request: the requests are concatenated along dim 0,
 * computed at once, and the outputs split back by rows; a failed batch is isolated (see above).
 */
export function mergedExecutor(name: string, execute: BatchExecutor, isolation?: FailureIsolation): RequestsExecutor {
  const run: RunBatch = async (requests, context) => {
    const sizes = requests.map(rowsOf);
    const total = sizes.reduce((n, size) => n + size, 0);
    const single = requests.length === 1;
    const result = await execute(single ? requests[0]! : mergeRequests(requests), {
      batchSize: total,
      requests,
      instance: context.instance,
      ownsInputs: !single,
      ...(single && context.options ? { options: context.options } : {}),
    });
    return splitRows(name, result, sizes, total);
  };
  const isolate = failureIsolator(name, run, isolation, true);
  return async (requests, context) => {
    if (requests.length === 1) {
      const request = requests[0]!;
      let result: BatchResult;
      const t0 = performance.now();
      try {
        result = await execute(request, context);
      } catch (err) {
        isolation && failedAlone(isolation, request, costed(err, t0));
        throw err;
      }
      isolation?.succeeded(request);
      return { responses: [result.outputs], ...(result.times ? { times: result.times } : {}) };
    }
    const sizes = requests.map(rowsOf);
    const t0 = nowNs();
    const merged = mergeRequests(requests);
    const mergeNs = nowNs() - t0;
    let result: BatchResult;
    const t1 = performance.now();
    try {
      result = await execute(merged, context);
    } catch (err) {
      return { responses: await isolate(requests, context, costed(err, t1)) };
    }
    const reported = result.times ?? {};
    return {
      responses: splitRows(name, result, sizes, context.batchSize),
      times: { ...reported, computeInputNs: mergeNs + (reported.computeInputNs ?? 0) },
    };
  };
}

/**
 * A request-by-request executor (Triton's `execute(requests)`, e.g. a Python model) whose batch
 * that ended its instance is isolated (see above), so a request that crashes or hangs the model
 * fails alone. Any other failure of the whole batch fails the batch, as in Triton.
 */
export function isolatedRequestsExecutor(
  name: string,
  executeRequests: RequestsExecutor,
  isolation: FailureIsolation,
): RequestsExecutor {
  const run: RunBatch = async (requests, context) => (await executeRequests(requests, context)).responses;
  const isolate = failureIsolator(name, run, isolation, false);
  return async (requests, context) => {
    const t0 = performance.now();
    try {
      const result = await executeRequests(requests, context);
      if (requests.length === 1) isolation.succeeded(requests[0]!);
      return result;
    } catch (err) {
      costed(err, t0);
      if (requests.length === 1) failedAlone(isolation, requests[0]!, err);
      if (requests.length === 1 || !endedInstance(err)) throw err;
      return { responses: await isolate(requests, context, err) };
    }
  };
}

/** A request failed an execution on its own: suspect for a while, refused for a while if it ended its instance. */
function failedAlone(isolation: FailureIsolation, request: InferRequest, err: unknown): void {
  if (endedInstance(err)) isolation.endedAlone(request, err, costOf(err));
  else isolation.failed(request);
}

/**
 * The isolation of a failed batch of several requests over `run`: each request's outcome.
 * `bisects`: whether an ordinary failure is bisected (merged executions) or fails the batch.
 */
function failureIsolator(name: string, run: RunBatch, isolation: FailureIsolation | undefined, bisects: boolean) {
  /** Runs `requests` again as one execution, paid from the budget; isolates again when it fails. */
  const rerun = async (
    requests: readonly InferRequest[],
    context: BatchContext,
    batchError: unknown,
  ): Promise<RequestOutcome[]> => {
    if (isolation && !isolation.tryRerun()) return requests.map(() => unpaid(name, batchError));
    const t0 = performance.now();
    try {
      const outcomes = await run(requests, context);
      if (requests.length === 1 && !(outcomes[0] instanceof Error)) isolation?.succeeded(requests[0]!);
      return outcomes;
    } catch (err) {
      costed(err, t0);
      if (requests.length > 1) return isolate(requests, context, err);
      if (isolation) failedAlone(isolation, requests[0]!, err);
      return [toConnectError(err, name)];
    }
  };

  /**
   * Each request alone (the backend's suspect last, after any other request with its input) until
   * one ends the instance again; then the rest together. A request whose input is refused by then
   * (the culprit's, sent twice) is refused without running.
   */
  const aloneUntilCulprit = async (
    requests: readonly InferRequest[],
    context: BatchContext,
    batchError: InstanceEndedError,
  ): Promise<RequestOutcome[]> => {
    const outcomes: RequestOutcome[] = new Array(requests.length);
    const order = suspectLast(requests, batchError.suspect, isolation);
    const last = order[order.length - 1]!;
    const refused = (i: number) => {
      const refusal = isolation?.refusal(requests[i]!);
      if (refusal) outcomes[i] = refusal;
      return refusal !== undefined;
    };
    for (let k = 0; k < order.length; k++) {
      const i = order[k]!;
      if (refused(i)) continue;
      const rest = order.slice(k);
      if (
        order.slice(0, k).every((j) => !(outcomes[j] instanceof Error)) &&
        rest.every((j) => j === last || isolation?.sameInput(requests[j]!, requests[last]!))
      ) {
        // Every other request ran alone without ending the instance: these (one input) did, and
        // that input is refused for a while as if it had ended the instance alone.
        isolation?.endedAlone(requests[last]!, batchError, costOf(batchError));
        for (const j of rest) outcomes[j] = culpritByElimination(name, batchError);
        break;
      }
      const [outcome] = await rerun([requests[i]!], context, batchError);
      outcomes[i] = outcome!;
      if (endedInstance(outcome)) {
        const others = order.slice(k + 1).filter((j) => !refused(j));
        if (others.length > 0) {
          const answers = await rerun(
            others.map((j) => requests[j]!),
            context,
            batchError,
          );
          others.forEach((j, n) => {
            outcomes[j] = answers[n]!;
          });
        }
        break;
      }
    }
    return outcomes;
  };

  const isolate = async (
    requests: readonly InferRequest[],
    context: BatchContext,
    err: unknown,
  ): Promise<RequestOutcome[]> => {
    if (endedInstance(err)) return aloneUntilCulprit(requests, context, err);
    if (!bisects) return requests.map(() => toConnectError(err, name));
    const half = Math.ceil(requests.length / 2);
    const first = await rerun(requests.slice(0, half), context, err);
    return first.concat(await rerun(requests.slice(half), context, err));
  };
  return isolate;
}

/**
 * The outcome of a request of a failed batch that the re-run budget could not pay to run again:
 * the batcher sends it back to run alone in its quarantine lane (whose share of executions is
 * bounded), so it gets its own outcome. Anywhere else it is the batch's error, saying why.
 */
export class DeferredRerun extends StageError {}

/** The batch's error for one of its requests, its code and stage kept, saying `why` (as `Kind`). */
function batchErrorFor(name: string, batchError: unknown, why: string, Kind = StageError): StageError {
  const e = toConnectError(batchError, name);
  const stage = e instanceof StageError ? e.stage : name;
  return new Kind(e.code, stage, `${messageWithoutStage({ rawMessage: e.rawMessage, stage })} (${why})`);
}

const unpaid = (name: string, batchError: unknown) =>
  batchErrorFor(
    name,
    batchError,
    "it ran in a batch that failed, and the model's budget for running failed batches again to find the culprit is spent",
    DeferredRerun,
  );

/**
 * The order in which a batch that ended its instance runs its requests alone: as they came, with
 * `suspect` (when it names one of them) last and any other request with its input just before it.
 */
function suspectLast(
  requests: readonly InferRequest[],
  suspect: number | undefined,
  isolation: FailureIsolation | undefined,
): number[] {
  const order = requests.map((_, i) => i);
  if (suspect === undefined || suspect < 0 || suspect >= requests.length) return order;
  const alike = (i: number) => i !== suspect && isolation?.sameInput(requests[i]!, requests[suspect]!) === true;
  return [...order.filter((i) => i !== suspect && !alike(i)), ...order.filter(alike), suspect];
}

/** The error of the request found to have ended its instance because every other one of its batch succeeded alone. */
const culpritByElimination = (name: string, batchError: unknown) =>
  batchErrorFor(
    name,
    batchError,
    "its batch ended the model's instance and every other request of it succeeded alone, so this one was not run again",
  );
