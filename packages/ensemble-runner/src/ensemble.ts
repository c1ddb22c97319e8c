/**
 * The ensemble as a Stage: each request walks the validated DAG, starting a
 * step the moment its last input exists, so independent steps overlap.
 */

import { clone, create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import {
  type ModelConfig,
  ModelConfigSchema,
  type ModelStatistics,
  ModelTransactionPolicySchema,
} from "@trellis/protocol";
import {
  Code,
  codeName,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  metadataFromConfig,
  nowNs,
  type RequestedOutput,
  type Stage,
  StageError,
  type StageLogger,
  type StageMetadata,
  StatisticsRecorder,
  type Tensor,
  traceExecution,
} from "@trellis/stage";
import {
  checkInferRequest,
  configMaxQueueSize,
  decoupledRefusal,
  type RequestSpec,
  requestRefusal,
  tritonMessages,
} from "@trellis/stage/backend";
import { Limiter } from "./limiter.js";
import { type EnsemblePlan, ensembling, planEnsemble, type StepPlan, stepLabel } from "./plan.js";

export type ResolveStep = (model: string, version: bigint) => Stage | Promise<Stage>;

export interface CreateEnsembleOptions {
  config: ModelConfig;
  /** Version this ensemble serves as; default "1". */
  version?: string;
  /** Turns a step's model_name / model_version (-1 = latest) into a Stage. */
  resolveStep: ResolveStep;
  logger?: StageLogger;
  /** Close the step stages when the ensemble closes (set when the ensemble created them). Default false. */
  ownsSteps?: boolean;
}

/** A step's failure, re-raised by the ensemble with the step's own code. */
export class EnsembleStepError extends StageError {
  constructor(
    code: Code,
    ensemble: string,
    readonly step: number,
    readonly model: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(code, ensemble, `${stepLabel(step, model)}: ${codeName(code)}: ${message}`, options);
  }
}

export interface StepStatistics {
  step: number;
  model: string;
  /** Version of the step's stage. */
  version: string;
  /** Requests holding this step's slot now (running, or finished and waiting for a downstream slot). */
  inflight: number;
  /** Requests waiting for a slot now (only when max_inflight_requests caps the step). */
  waiting: number;
  /** This step's share of the ensemble's traffic, in Triton's shape: queue = waiting for a slot, compute_infer = the call. */
  statistics: ModelStatistics;
}

/** What one request spent in the ensemble's steps: their queues and their computing (Triton sums its steps'). */
export interface EnsembleTimes {
  queueNs: number;
  computeInputNs: number;
  computeInferNs: number;
  computeOutputNs: number;
}

export interface EnsembleStage extends Stage {
  statistics(): ModelStatistics;
  /** The most requests to admit at once (0: unbounded): its tightest step's queue bound. */
  maxQueueSize(): number;
  /** That bound, and the step that sets it, for a refusal's words (the model runtime admits by it). */
  queueBound(): { bound: number; what: string };
  /**
   * One request's answer for a model runtime serving the ensemble: not recorded here (the
   * runtime records it), with the time its steps spent queued and computing.
   */
  execute(request: InferRequest, options?: InferOptions): Promise<{ outputs: Tensor[]; times: EnsembleTimes }>;
  /** A decoupled ensemble's responses for a model runtime serving it (not recorded here). */
  executeStream(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  stepStatistics(): StepStatistics[];
  /** The DAG: each step's model, what it waits for and a topological order. */
  readonly plan: EnsemblePlan;
}

interface StepRuntime {
  plan: StepPlan;
  limiter: Limiter;
  stats: StatisticsRecorder;
}

/** Why a request stopped when its signal fired: the signal's code when it carries one. */
function abortError(name: string, reason: unknown): StageError {
  if (reason instanceof ConnectError) return new StageError(reason.code, name, reason.rawMessage, { cause: reason });
  if (reason instanceof Error && reason.name === "TimeoutError") {
    return new StageError(Code.DeadlineExceeded, name, "deadline exceeded", { cause: reason });
  }
  return new StageError(Code.Canceled, name, "request cancelled", { cause: reason });
}

function stepError(ensemble: string, step: StepPlan, err: unknown): EnsembleStepError {
  const ce = ConnectError.from(err);
  // Stage errors already start with the model's name; say it once.
  const prefix = `${step.model}: `;
  const text = ce.rawMessage.startsWith(prefix) ? ce.rawMessage.slice(prefix.length) : ce.rawMessage;
  return new EnsembleStepError(ce.code, ensemble, step.index, step.model, text, { cause: err });
}

const renamed = (t: Tensor, name: string): Tensor =>
  // Zero-copy: the step sees the producer's very data (and shape), under its own name.
  t.name === name ? t : { name, datatype: t.datatype, shape: t.shape, data: t.data };

type Answers = (
  request: InferRequest,
  options?: InferOptions,
  served?: (times: EnsembleTimes) => void,
) => AsyncIterable<InferResponse>;

/** A coupled ensemble's one answer to a request, served (not recorded here), with its steps' times. */
async function answerWithTimes(answers: Answers, request: InferRequest, options?: InferOptions) {
  let times: EnsembleTimes = { queueNs: 0, computeInputNs: 0, computeInferNs: 0, computeOutputNs: 0 };
  let answer: InferResponse | undefined;
  for await (const response of answers(request, options, (t) => {
    times = t;
  }))
    answer = response;
  return { outputs: answer!.outputs, times };
}

export async function createEnsemble(options: CreateEnsembleOptions): Promise<EnsembleStage> {
  const { config, logger } = options;
  const name = config.name;
  const version = options.version ?? "1";
  const spec = ensembling(config);

  // Steps load concurrently (an ONNX session and an image stage need not wait for each other).
  const settled = await Promise.allSettled(
    spec.step.map(async (s) => options.resolveStep(s.modelName, s.modelVersion)),
  );
  const stages = settled.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  try {
    const failed = settled.findIndex((r) => r.status === "rejected");
    if (failed >= 0) {
      const reason = (settled[failed] as PromiseRejectedResult).reason;
      throw stepError(name, { index: failed, model: spec.step[failed]!.modelName } as StepPlan, reason);
    }
    // A decoupled step (any number of responses per request) makes the ensemble decoupled, as in Triton.
    const decoupledSteps = stages.flatMap((s, i) => (isDecoupled(s.config) || s.inferStream !== undefined ? [i] : []));
    if (decoupledSteps.length > 1) {
      const which = decoupledSteps.map((i) => `step ${i} (${spec.step[i]!.modelName})`).join(", ");
      throw new StageError(
        Code.InvalidArgument,
        name,
        `at most one step may be a decoupled model; ${which} are decoupled`,
      );
    }
    const decoupledStep = decoupledSteps[0] ?? -1;
    if ((decoupledStep >= 0 || isDecoupled(config)) && config.responseCache?.enable) {
      throw new StageError(
        Code.InvalidArgument,
        name,
        "the response cache does not support decoupled models (this ensemble is decoupled: it streams its answers)",
      );
    }
    const metas = await Promise.all(stages.map((s) => s.metadata()));
    const plan = planEnsemble(config, stages, metas);
    return buildEnsemble(
      config,
      version,
      plan,
      spec.maxInflightRequests,
      options.ownsSteps ?? false,
      logger,
      decoupledStep,
    );
  } catch (err) {
    if (options.ownsSteps) await Promise.allSettled([...new Set(stages)].map((s) => s.close()));
    throw err;
  }
}

function buildEnsemble(
  given: ModelConfig,
  version: string,
  plan: EnsemblePlan,
  maxInflight: number,
  ownsSteps: boolean,
  logger: StageLogger | undefined,
  decoupledStep: number,
): EnsembleStage {
  const name = given.name;
  // Triton marks an ensemble with a decoupled step decoupled itself (its config says so).
  const decoupled = decoupledStep >= 0 || isDecoupled(given);
  const config = decoupled ? clone(ModelConfigSchema, given) : given;
  if (decoupled) config.modelTransactionPolicy = create(ModelTransactionPolicySchema, { decoupled: true });
  // Steps that read (directly or not) the decoupled step's outputs run once per response it sends.
  const downstream = new Set<number>();
  const visit = (i: number) => {
    for (const d of plan.steps[i]!.dependents) {
      if (!downstream.has(d)) {
        downstream.add(d);
        visit(d);
      }
    }
  };
  if (decoupledStep >= 0) visit(decoupledStep);
  const allSteps = new Set(plan.steps.map((s) => s.index));
  const beforeDecoupled = new Set([...allSteps].filter((i) => i !== decoupledStep && !downstream.has(i)));
  const metadata: StageMetadata = metadataFromConfig(config, [version]);
  const recorder = new StatisticsRecorder(name, version);
  const steps: StepRuntime[] = plan.steps.map((p) => ({
    plan: p,
    limiter: new Limiter(maxInflight),
    stats: new StatisticsRecorder(p.model, p.stage.version, false),
  }));
  const batching = config.maxBatchSize > 0;
  let closed = false;
  /** How many steps call each stage: a stage two steps call sees each request twice. */
  const calls = new Map<string, number>();
  for (const s of plan.steps) calls.set(s.model, (calls.get(s.model) ?? 0) + 1);

  /**
   * The most requests the ensemble admits at once, and the step that sets it: each step's queue
   * bound (what the step says, else its config's max_queue_size), shared among the steps calling
   * the same model; the tightest wins. Admitting no more than that, no step's queue overflows
   * with this ensemble's requests, so none is refused after an earlier step did its work (a
   * decoded image refused by the inference step). Read per request: a step may be reloaded.
   */
  function entryBound(): { bound: number; step?: StepPlan } {
    let bound = 0;
    let which: StepPlan | undefined;
    for (const s of plan.steps) {
      const own = s.stage.maxQueueSize?.() ?? configMaxQueueSize(s.stage.config) ?? 0;
      if (own <= 0) continue;
      const share = Math.max(1, Math.floor(own / (calls.get(s.model) ?? 1)));
      if (bound === 0 || share < bound) {
        bound = share;
        which = s;
      }
    }
    return { bound, step: which };
  }

  for (const input of metadata.inputs) {
    if (!plan.consumers.has(input.name))
      logger?.warn({ ensemble: name, input: input.name }, "ensemble input is unused");
  }

  /** The ensemble's own tensors, as Triton checks a request against them. */
  const requestSpec: RequestSpec = {
    model: name,
    maxBatchSize: config.maxBatchSize,
    inputs: metadata.inputs.map((m) => ({
      name: m.name,
      datatype: m.datatype,
      dims: batching ? m.shape.slice(1) : m.shape,
      optional: config.input.find((i) => i.name === m.name)?.optional ?? false,
    })),
    outputs: metadata.outputs.map((o) => o.name),
  };

  /** Checks the request against the ensemble's declared tensors (Triton's checks and words); returns the batch size. */
  function checkInputs(request: InferRequest): number {
    return checkInferRequest(request, requestSpec);
  }

  /** Which ensemble outputs to return, and the per-step requested outputs (classification passes through). */
  function requestedOutputs(request: InferRequest): { wanted: string[]; perStep: RequestedOutput[][] } {
    const perStep = plan.steps.map((s) => s.outputs.map((o): RequestedOutput => ({ name: o.name })));
    const asked = request.outputs ?? [];
    if (asked.length === 0) return { wanted: metadata.outputs.map((o) => o.name), perStep };
    for (const o of asked) {
      if (!metadata.outputs.some((m) => m.name === o.name)) {
        throw requestRefusal(tritonMessages.unexpectedOutput(name, o.name));
      }
      // Classification is the frontend's, done once on the ensemble's answer (as Triton's
      // src/classification.cc); the step producing the tensor gets the output's other parameters.
      const { classification: _, ...stepParameters } = o.parameters ?? {};
      if (Object.keys(stepParameters).length > 0) {
        // The step producing it does the work, unless another step reads the tensor.
        if (plan.consumers.has(o.name)) {
          throw new StageError(
            Code.InvalidArgument,
            name,
            `output "${o.name}": parameters are not supported on a tensor other steps also read`,
          );
        }
        const p = plan.producers.get(o.name);
        if (p?.kind === "step") {
          const r = perStep[p.step]!.find((x) => x.name === p.output)!;
          r.parameters = stepParameters;
        }
      }
    }
    return { wanted: asked.map((o) => o.name), perStep };
  }

  /** A step call that succeeded: its statistics, and its share of the request's queue and compute time. */
  function stepSucceeded(
    rt: StepRuntime,
    batch: number,
    queued: number,
    started: number,
    totals: { queueNs: number; computeNs: number },
  ): void {
    const done = nowNs();
    const times = { computeInputNs: 0, computeInferNs: done - started, computeOutputNs: 0 };
    rt.stats.requestSucceeded(done - queued, batch, started - queued, times);
    rt.stats.executed(batch, times);
    totals.queueNs += started - queued;
    totals.computeNs += done - started;
  }

  async function run(
    request: InferRequest,
    tensors: Map<string, Tensor>,
    perStep: RequestedOutput[][],
    batch: number,
    signal: AbortSignal,
    fail: (err: StageError) => void,
    options: InferOptions | undefined,
    totals: { queueNs: number; computeNs: number },
    members: Set<number> = allSteps,
  ): Promise<void> {
    if (members.size === 0) return;
    await new Promise<void>((resolve, reject) => {
      // Steps outside `members` have run already: their tensors are in `tensors`.
      const missing = plan.steps.map((s) => s.dependsOn.filter((d) => members.has(d)).length);
      let remaining = members.size;
      let failed = false;
      const stop = (err: StageError) => {
        if (failed) return;
        failed = true;
        fail(err);
        reject(err);
      };
      const onAbort = () => stop(abortError(name, signal.reason));
      signal.addEventListener("abort", onAbort, { once: true });
      const finish = () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      };

      /** Starts `rt` for this request; resolves once it holds its slot (or is refused). */
      const launch = (rt: StepRuntime): Promise<void> => {
        const step = rt.plan;
        const queued = nowNs();
        const admitted = rt.limiter.acquire(signal);
        admitted.then(
          async () => {
            const started = nowNs();
            let held = true;
            const release = () => {
              if (held) rt.limiter.release();
              held = false;
            };
            try {
              if (signal.aborted) return release();
              const inputs: Tensor[] = [];
              for (const { name: input, tensor } of step.inputs) {
                const t = tensors.get(tensor);
                // Absent only when it is an optional ensemble input the client left out.
                if (t) inputs.push(renamed(t, input));
              }
              let response: InferResponse;
              try {
                response = await step.stage.infer(
                  { id: request.id, inputs, outputs: perStep[step.index], parameters: request.parameters },
                  {
                    signal,
                    priority: options?.priority,
                    timeoutMicroseconds: options?.timeoutMicroseconds,
                    trace: options?.trace?.child(step.model, step.stage.version),
                  },
                );
              } catch (err) {
                rt.stats.requestFailed(nowNs() - queued);
                release();
                stop(signal.aborted ? abortError(name, signal.reason) : stepError(name, step, err));
                return;
              }
              stepSucceeded(rt, batch, queued, started, totals);
              if (signal.aborted) return release();
              for (const o of step.outputs) {
                const t = response.outputs.find((x) => x.name === o.name);
                if (!t) {
                  release();
                  return stop(
                    stepError(name, step, new StageError(Code.Internal, "", `returned no output "${o.name}"`)),
                  );
                }
                tensors.set(o.tensor, t);
              }
              remaining -= 1;
              if (remaining === 0) finish();
              const ready: StepRuntime[] = [];
              for (const d of step.dependents) {
                if (!members.has(d)) continue;
                missing[d]! -= 1;
                if (missing[d] === 0) ready.push(steps[d]!);
              }
              // Triton's max_inflight_requests: this step keeps its slot until every step it
              // unblocked has one, so a full downstream step holds back upstream work.
              if (ready.length === 0) release();
              else void Promise.allSettled(ready.map(launch)).then(release);
            } catch (err) {
              release();
              stop(stepError(name, step, err));
            }
          },
          () => stop(abortError(name, signal.reason)),
        );
        return admitted;
      };

      for (const rt of steps) if (members.has(rt.plan.index) && missing[rt.plan.index] === 0) void launch(rt);
    });
  }

  /**
   * The ensemble's responses to one request. Without a decoupled step: every step runs once,
   * each the moment its inputs exist, and there is one response. With one: the steps it does
   * not feed run first; then, for each response the decoupled step sends, the steps after it
   * run on that response's tensors and the ensemble sends a response of its own (every output
   * asked for: those computed before the decoupled step again with each), one at a time, in order.
   * A failing step aborts the request's signal: steps still waiting never start, running ones
   * are told to stop.
   */
  async function* answers(
    request: InferRequest,
    options?: InferOptions,
    served?: (times: EnsembleTimes) => void,
  ): AsyncGenerator<InferResponse> {
    // Served by a model runtime (`served`): it admits, records and traces; the ensemble reports its times.
    const record = served === undefined;
    const begin = nowNs();
    const outer = options?.signal;
    const controller = new AbortController();
    const onOuterAbort = () => controller.abort(outer?.reason);
    const signal = controller.signal;
    const fail = (err: StageError) => controller.abort(err);
    const totals = { queueNs: 0, computeNs: 0 };
    let held: StepRuntime | undefined;
    let completed = false;
    try {
      if (closed) throw new StageError(Code.Unavailable, name, "ensemble is closed");
      if (outer?.aborted) throw abortError(name, outer.reason);
      const batch = checkInputs(request);
      const { wanted, perStep } = requestedOutputs(request);
      outer?.addEventListener("abort", onOuterAbort, { once: true });
      const tensors = new Map<string, Tensor>();
      for (const t of request.inputs) tensors.set(t.name, t);
      const inputNs = nowNs() - begin;
      const answer = (from: Map<string, Tensor>): InferResponse => ({
        id: request.id,
        modelName: name,
        modelVersion: version,
        outputs: wanted.map((o) => renamed(from.get(o)!, o)),
      });
      await run(request, tensors, perStep, batch, signal, fail, options, totals, beforeDecoupled);
      if (decoupledStep < 0) {
        if (decoupled && record) recorder.firstResponse(nowNs() - begin);
        yield answer(tensors);
      } else {
        const rt = steps[decoupledStep]!;
        const step = rt.plan;
        const queued = nowNs();
        await rt.limiter.acquire(signal);
        held = rt;
        const started = nowNs();
        const inputs: Tensor[] = [];
        for (const { name: input, tensor } of step.inputs) {
          const t = tensors.get(tensor);
          if (t) inputs.push(renamed(t, input));
        }
        const responses = step.stage.inferStream!(
          { id: request.id, inputs, outputs: perStep[step.index], parameters: request.parameters },
          {
            signal,
            priority: options?.priority,
            timeoutMicroseconds: options?.timeoutMicroseconds,
            trace: options?.trace?.child(step.model, step.stage.version),
          },
        );
        let first = true;
        try {
          for await (const response of responses) {
            const each = new Map(tensors);
            for (const o of step.outputs) {
              const t = response.outputs.find((x) => x.name === o.name);
              if (!t) throw new StageError(Code.Internal, "", `returned no output "${o.name}"`);
              each.set(o.tensor, t);
            }
            await run(request, each, perStep, batch, signal, fail, options, totals, downstream);
            if (first && record) recorder.firstResponse(nowNs() - begin);
            first = false;
            yield answer(each);
          }
        } catch (err) {
          rt.stats.requestFailed(nowNs() - queued);
          // A later step's failure is already named; the decoupled step's own is named here.
          if (err instanceof EnsembleStepError) throw err;
          if (signal.aborted) throw abortError(name, signal.reason);
          throw stepError(name, step, err);
        }
        stepSucceeded(rt, batch, queued, started, totals);
      }
      const end = nowNs();
      const times = { computeInputNs: inputNs, computeInferNs: totals.computeNs, computeOutputNs: 0 };
      if (record) {
        recorder.requestSucceeded(end - begin, batch, totals.queueNs, times);
        traceExecution(options?.trace, begin, begin, end, times);
        recorder.executed(batch, times);
      } else served({ queueNs: totals.queueNs, ...times });
      completed = true;
    } catch (err) {
      if (record) recorder.requestFailed(nowNs() - begin);
      throw err instanceof StageError ? err : new StageError(Code.Internal, name, String(err), { cause: err });
    } finally {
      if (held) held.limiter.release();
      outer?.removeEventListener("abort", onOuterAbort);
      // A consumer that stopped early (the client went away) stops the steps still running; a
      // completed request has none, and is not charged an abort (an error object) per request.
      if (!completed && !signal.aborted) controller.abort(new StageError(Code.Canceled, name, "request stopped"));
    }
  }

  const stage: EnsembleStage = {
    name,
    version,
    config,
    plan,
    isReady: async () => !closed && (await Promise.all(plan.steps.map((s) => s.stage.isReady()))).every(Boolean),
    metadata: () => metadata,
    async infer(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
      // A decoupled ensemble answers over a stream (inferStream), as Triton's.
      if (decoupled) throw decoupledRefusal(name);
      let answer: InferResponse | undefined;
      for await (const response of answers(request, options)) answer = response;
      return answer!;
    },
    statistics: () => recorder.snapshot(),
    maxQueueSize: () => entryBound().bound,
    queueBound: () => {
      const { bound, step } = entryBound();
      return { bound, what: step ? `the queue bound of ${stepLabel(step.index, step.model)} (${bound})` : "" };
    },
    execute: (request: InferRequest, options?: InferOptions) => answerWithTimes(answers, request, options),
    executeStream: (request: InferRequest, options?: InferOptions) => answers(request, options, () => {}),
    ...(decoupled ? { inferStream: answers } : {}),
    stepStatistics: () =>
      steps.map((rt) => ({
        step: rt.plan.index,
        model: rt.plan.model,
        version: rt.plan.stage.version,
        inflight: rt.limiter.inflight,
        waiting: rt.limiter.waiting,
        statistics: rt.stats.snapshot(),
      })),
    async close() {
      closed = true;
      if (ownsSteps) await Promise.allSettled([...new Set(plan.steps.map((s) => s.stage))].map((s) => s.close()));
    },
  };
  return stage;
}
