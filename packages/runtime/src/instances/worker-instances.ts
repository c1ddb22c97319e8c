/**
 * A TypeScript stage's instances in worker threads (instance_group count N,
 * config parameter worker_threads "true"): each thread imports the stage
 * module and calls its factory, and the Stage returned here hands each call to
 * an idle thread, so N synchronous, CPU-bound computes run at once. Tensors
 * cross as transferables: a buffer the sender owns moves, a view into a larger
 * one (a request body, Node's Buffer pool) is copied first, alone.
 *
 * What cannot cross a thread: the stage's `models` (BLS caller) is not given
 * to worker instances; its logger calls come back as messages to the main
 * thread's logger; the CPU gate is held (shared) here around each execution.
 *
 * This file holds the Stage over the threads (startWorkerInstances, a decoupled
 * stage's streamed calls); the threads themselves are pool.ts, what crosses to
 * them protocol.ts, a thread's own side instance-worker.ts.
 */
import { fromBinary } from "@bufbuild/protobuf";
import { ModelConfigSchema } from "@trellis/protocol";
import {
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type Stage,
  StatisticsRecorder,
} from "@trellis/stage";
import { InstancePool, type WorkerInstancesOptions } from "./pool.js";

export { importInInstanceThreads, type WorkerInstancesOptions } from "./pool.js";

/**
 * Starts `instances` worker threads, each loading the stage module, and resolves
 * once every one has (a module that fails to import, or a factory that throws,
 * fails the load with a StageError naming the model). The Stage it gives runs
 * each call on an idle thread, one call per thread at a time, the others queued
 * in order. A thread that crashes fails its call INTERNAL and is replaced.
 */
export async function startWorkerInstances(options: WorkerInstancesOptions): Promise<Stage & { instances: number }> {
  const pool = new InstancePool(options);
  const first = await pool.start();
  const name = first.name || pool.model;
  const version = first.version;
  const config = fromBinary(ModelConfigSchema, first.config);
  const { metadata } = first;
  const recorder = new StatisticsRecorder(name, version, false);

  const stage: Stage & { instances: number } = {
    name,
    version,
    config,
    instances: pool.count,
    isReady: () => pool.isReady(),
    metadata: () => metadata,
    async infer(request, opts) {
      const start = nowNs();
      let response: InferResponse | undefined;
      try {
        await pool.run(request, opts, false, (r) => {
          response = r;
        });
      } catch (err) {
        recorder.requestFailed(nowNs() - start);
        throw err;
      }
      recorder.ranAlone(start, config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 1) : 1);
      return response as InferResponse;
    },
    statistics: () => recorder.snapshot(),
    pendingRequests: () => pool.waitingCalls(),
    close: () => pool.close(),
  };
  if (first.stream) stage.inferStream = (request, opts) => streamCall(pool, request, opts);
  return stage;
}

/** A decoupled stage's responses to one request, as its thread sends them. */
async function* streamCall(
  pool: InstancePool,
  request: InferRequest,
  opts: InferOptions | undefined,
): AsyncGenerator<InferResponse> {
  const responses: InferResponse[] = [];
  let done = false;
  let failure: unknown;
  let wake: (() => void) | undefined;
  // Our own signal too: a consumer that stops reading cancels the call in its thread.
  const own = new AbortController();
  const outer = opts?.signal;
  const forward = () => own.abort();
  if (outer?.aborted) own.abort();
  else outer?.addEventListener("abort", forward, { once: true });
  const onResponse = (r: InferResponse) => {
    responses.push(r);
    wake?.();
  };
  pool.run(request, { ...opts, signal: own.signal }, true, onResponse).then(
    () => {
      done = true;
      wake?.();
    },
    (err: unknown) => {
      failure = err;
      done = true;
      wake?.();
    },
  );
  try {
    while (true) {
      const next = responses.shift();
      if (next) {
        yield next;
        continue;
      }
      if (done) {
        if (failure !== undefined) throw failure;
        return;
      }
      await new Promise<void>((r) => {
        wake = r;
      });
      wake = undefined;
    }
  } finally {
    outer?.removeEventListener("abort", forward);
    if (!done) own.abort();
  }
}
