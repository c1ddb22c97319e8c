/**
 * One ensemble's requests: each walks the validated DAG (dag.ts), fanning out after a decoupled
 * step when there is one (decoupled.ts), and is recorded in the ensemble's statistics.
 */
import { clone, create } from "@bufbuild/protobuf";
import { type ModelConfig, ModelConfigSchema, ModelTransactionPolicySchema } from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  metadataFromConfig,
  nowNs,
  StageError,
  type StageMetadata,
  StatisticsRecorder,
  type Tensor,
  traceExecution,
} from "@trellis/stage";
import { checkInferRequest, type RequestSpec } from "@trellis/stage/backend";
import { EntryBound, ensembleRequestSpec, requestedOutputs } from "./admission.js";
import { reshapedFor } from "./batch-shapes.js";
import { type RequestContext, runSteps } from "./dag.js";
import { downstreamOf, fanOut } from "./decoupled.js";
import { abortError } from "./errors.js";
import { type HoldStep, StepHolder, type StepSet } from "./held-steps.js";
import type { EnsemblePlan } from "./plan.js";
import { type EnsembleTimes, renamed, type StepRuntime, stepRuntimes } from "./steps.js";

export interface EnsembleRunnerOptions {
  /** The ensemble's config as given (a decoupled step makes the served config decoupled). */
  config: ModelConfig;
  /** Version this ensemble serves as. */
  version: string;
  plan: EnsemblePlan;
  /** Each step's max_inflight_requests (0: unbounded). */
  maxInflight: number;
  /** The decoupled step's index, -1 for none. */
  decoupledStep: number;
  /** Each step's model_version (-1: latest), by step index. */
  versions: readonly bigint[];
  /** How a request takes its steps' models (see HoldStep); without it, every request runs on the plan's stages. */
  holdStep?: HoldStep;
}

/** Reports the times of a request a model runtime serves (it admits, records and traces). */
export type Served = (times: EnsembleTimes) => void;

export class EnsembleRunner {
  readonly name: string;
  readonly version: string;
  readonly plan: EnsemblePlan;
  /** Whether the ensemble streams its answers: it has a decoupled step, or its config says so. */
  readonly decoupled: boolean;
  /** The served config: decoupled when the ensemble is. */
  readonly config: ModelConfig;
  readonly metadata: StageMetadata;
  readonly recorder: StatisticsRecorder;
  readonly steps: StepRuntime[];
  readonly entryBound: EntryBound;
  /** Each request's hold on its steps' models. */
  readonly holder: StepHolder;
  closed = false;
  private readonly decoupledStep: number;
  /** Steps that read (directly or not) the decoupled step's outputs: they run once per response it sends. */
  private readonly downstream: Set<number>;
  private readonly beforeDecoupled: Set<number>;
  private readonly requestSpec: RequestSpec;

  constructor(options: EnsembleRunnerOptions) {
    const { config: given, version, plan, decoupledStep } = options;
    this.name = given.name;
    this.version = version;
    this.plan = plan;
    this.decoupledStep = decoupledStep;
    // Triton marks an ensemble with a decoupled step decoupled itself (its config says so).
    this.decoupled = decoupledStep >= 0 || isDecoupled(given);
    this.config = this.decoupled ? clone(ModelConfigSchema, given) : given;
    if (this.decoupled) this.config.modelTransactionPolicy = create(ModelTransactionPolicySchema, { decoupled: true });
    this.downstream = downstreamOf(plan, decoupledStep);
    this.beforeDecoupled = new Set(
      plan.steps.map((s) => s.index).filter((i) => i !== decoupledStep && !this.downstream.has(i)),
    );
    this.metadata = metadataFromConfig(this.config, [version]);
    this.recorder = new StatisticsRecorder(this.name, version);
    this.steps = stepRuntimes(plan, options.maxInflight);
    this.holder = new StepHolder(this.name, plan, options.versions, options.holdStep);
    this.entryBound = new EntryBound(plan, () => this.holder.latest);
    this.requestSpec = ensembleRequestSpec(this.config, this.metadata);
  }

  /**
   * The ensemble's responses to one request. Without a decoupled step: every step runs once,
   * each the moment its inputs exist, and there is one response. With one: the steps it does
   * not feed run first; then, for each response the decoupled step sends, the steps after it
   * run on that response's tensors and the ensemble sends a response of its own (every output
   * asked for: those computed before the decoupled step again with each), one at a time, in order.
   * A failing step aborts the request's signal: steps still waiting never start, running ones
   * are told to stop. Served by a model runtime (`served`), the request is not recorded here.
   */
  async *answers(request: InferRequest, options?: InferOptions, served?: Served): AsyncGenerator<InferResponse> {
    const { name } = this;
    const record = served === undefined;
    const begin = nowNs();
    const outer = options?.signal;
    const controller = new AbortController();
    const onOuterAbort = () => controller.abort(outer?.reason);
    let ctx: RequestContext | undefined;
    let held: StepSet | undefined;
    let completed = false;
    try {
      if (this.closed) throw new StageError(Code.Unavailable, name, "ensemble is closed");
      if (outer?.aborted) throw abortError(name, outer.reason);
      // Checks the request against the ensemble's declared tensors (Triton's checks and words).
      const batch = checkInferRequest(request, this.requestSpec);
      const { wanted, perStep } = requestedOutputs(name, this.plan, this.metadata, request);
      // Each step's model looked up once, and kept loaded until this request ends.
      held = this.holder.take();
      outer?.addEventListener("abort", onOuterAbort, { once: true });
      ctx = this.requestContext(request, options, perStep, batch, controller, held.stages);
      const tensors = new Map<string, Tensor>();
      // The ensemble's inputs have its request's batch size (0: the ensemble does not batch).
      const inputBatch = this.config.maxBatchSize > 0 ? batch : 0;
      for (const t of request.inputs) {
        tensors.set(t.name, t);
        ctx.batchOf.set(t, inputBatch);
      }
      const inputNs = nowNs() - begin;
      const answer = (from: Map<string, Tensor>): InferResponse => ({
        id: request.id,
        modelName: name,
        modelVersion: this.version,
        outputs: wanted.map((o) => this.output(from.get(o)!, o, ctx as RequestContext)),
      });
      await runSteps(ctx, tensors, this.beforeDecoupled);
      if (this.decoupledStep < 0) {
        if (this.decoupled && record) this.recorder.firstResponse(nowNs() - begin);
        yield answer(tensors);
      } else {
        const firstResponse = () => {
          if (record) this.recorder.firstResponse(nowNs() - begin);
        };
        yield* fanOut(ctx, this.steps[this.decoupledStep]!, tensors, this.downstream, answer, firstResponse);
      }
      this.succeeded(ctx, begin, inputNs, options, served);
      completed = true;
    } catch (err) {
      if (record) this.recorder.requestFailed(nowNs() - begin);
      throw err instanceof StageError ? err : new StageError(Code.Internal, name, String(err), { cause: err });
    } finally {
      if (ctx?.held) ctx.held.limiter.release();
      held?.release();
      outer?.removeEventListener("abort", onOuterAbort);
      // A consumer that stopped early (the client went away) stops the steps still running; a
      // completed request has none, and is not charged an abort (an error object) per request.
      if (!completed && !controller.signal.aborted) {
        controller.abort(new StageError(Code.Canceled, name, "request stopped"));
      }
    }
  }

  /** An ensemble output: the tensor under its ensemble name, shaped for whether the ensemble batches. */
  private output(t: Tensor, name: string, ctx: RequestContext): Tensor {
    const declared = this.config.output.find((o) => o.name === name);
    const dims = declared && (declared.reshape ? declared.reshape.shape : declared.dims).map(Number);
    return reshapedFor(renamed(t, name), dims, this.config.maxBatchSize > 0, ctx.batchOf.get(t) ?? 0);
  }

  private requestContext(
    request: InferRequest,
    options: InferOptions | undefined,
    perStep: RequestContext["perStep"],
    batch: number,
    controller: AbortController,
    stages: RequestContext["stages"],
  ): RequestContext {
    return {
      ensemble: this.name,
      steps: this.steps,
      stages,
      request,
      options,
      perStep,
      batch,
      signal: controller.signal,
      fail: (err: StageError) => controller.abort(err),
      batchOf: new WeakMap(),
      totals: { queueNs: 0, computeNs: 0 },
    };
  }

  /** A request answered: recorded and traced here, or its times reported to the runtime serving it. */
  private succeeded(
    ctx: RequestContext,
    begin: number,
    inputNs: number,
    options: InferOptions | undefined,
    served: Served | undefined,
  ): void {
    const end = nowNs();
    const { totals, batch } = ctx;
    const times = { computeInputNs: inputNs, computeInferNs: totals.computeNs, computeOutputNs: 0 };
    if (served === undefined) {
      this.recorder.requestSucceeded(end - begin, batch, totals.queueNs, times);
      traceExecution(options?.trace, begin, begin, end, times, batch);
      this.recorder.executed(batch, times);
    } else served({ queueNs: totals.queueNs, ...times });
  }
}
