/**
 * The direct scheduler: each request runs at once, alone, as its own execution, with no queue (an
 * ensemble's requests, as Triton's ensemble scheduler takes them, and a remote model's: such a
 * backend bounds and queues its own work, its steps or its server). So there are no priority
 * levels or queue timeouts to keep; the checks, the answer, the statistics and the trace are the
 * dynamic batcher's for an execution of one.
 */
import type { InferOptions, InferRequest, InferResponse } from "@trellis/stage";
import { Code, nowNs, StageError, type StatisticsRecorder, traceExecution } from "@trellis/stage";
import { toConnectError } from "@trellis/stage/backend";
import { answerOf } from "./answers.js";
import { type SchedulingChecks, scheduledSize } from "./checks.js";
import type { FailureIsolation } from "./dynamic/isolation.js";
import { type BatchContext, executionTimes, type RequestsExecutor, withoutTrace } from "./execution.js";
import type { QueueLevel, Scheduler } from "./scheduler.js";

export interface DirectSchedulerOptions {
  name: string;
  version: string;
  maxBatchSize: number;
  recorder: StatisticsRecorder;
  /** Checks one request before it runs (the config's checks, unless the backend checks its own). */
  validate?: (request: InferRequest) => void;
  /** The backend gets a request's trace (an ensemble stamps its steps on it). */
  passTrace?: boolean;
}

/** Its one level: no queue policy applies (admission still bounds what is in flight). */
const LEVEL: QueueLevel = { number: 1, maxQueueSize: 0, queued: 0 };

export class DirectScheduler implements Scheduler {
  readonly queued = 0;
  private closed = false;
  private readonly inFlight = new Set<Promise<unknown>>();
  private readonly checks: SchedulingChecks;

  constructor(
    private readonly options: DirectSchedulerOptions,
    private readonly run: RequestsExecutor,
    isolation?: FailureIsolation,
  ) {
    this.checks = { name: options.name, maxBatchSize: options.maxBatchSize, validate: options.validate, isolation };
  }

  queueLevel(): QueueLevel {
    return LEVEL;
  }

  infer(request: InferRequest, opts: InferOptions = {}): Promise<InferResponse> {
    const answer = this.runAlone(request, opts);
    this.inFlight.add(answer);
    const forget = () => this.inFlight.delete(answer);
    answer.then(forget, forget);
    return answer;
  }

  private async runAlone(request: InferRequest, opts: InferOptions): Promise<InferResponse> {
    const { name, version, maxBatchSize, recorder } = this.options;
    const start = nowNs();
    try {
      const size = scheduledSize(this.checks, this.closed, request, opts.signal);
      const context: BatchContext = {
        batchSize: size,
        requests: [request],
        instance: 0,
        ownsInputs: false,
        options: this.options.passTrace ? opts : withoutTrace(opts),
      };
      const result = await this.run([request], context);
      const t1 = nowNs();
      const outcome = result.responses[0];
      if (result.responses.length !== 1 || outcome === undefined) {
        throw new StageError(Code.Internal, name, `an execution of 1 request gave ${result.responses.length} answers`);
      }
      const response = answerOf(name, version, maxBatchSize, request, size, outcome, false);
      const t2 = nowNs();
      const times = executionTimes(start, t1, t2, result.times);
      recorder.executed(size, times);
      if (response instanceof Error) throw response;
      recorder.requestSucceeded(t2 - start, size, result.times?.queueNs ?? 0, times);
      traceExecution(opts.trace, start, start, t2, times, size);
      return response;
    } catch (err) {
      recorder.requestFailed(nowNs() - start);
      throw toConnectError(err, name);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.allSettled([...this.inFlight]);
  }
}
