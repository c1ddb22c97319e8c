/**
 * The main thread's side of worker-thread instances: the options, the pool of threads (which
 * are idle, the calls waiting for one, a crashed one's replacement) and closing a thread. The
 * thread's own side is instance-worker.ts; what crosses between them is protocol.ts.
 */
import { Worker } from "node:worker_threads";
import { toBinary } from "@bufbuild/protobuf";
import { type ModelConfig, ModelConfigSchema } from "@trellis/protocol";
import {
  Code,
  type CpuGate,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  StageError,
  type StageLogger,
} from "@trellis/stage";
import { InstanceEndedError } from "@trellis/stage/backend";
import { errorFromWire, type FromInstance, type InstanceLoad, portableRequest, type ToInstance } from "./protocol.js";

export interface WorkerInstancesOptions {
  /** The stage module: a file URL, or a package name resolvable from @trellis/runtime (resolve it first otherwise). */
  specifier: string;
  /** How load errors call the module (default "the stage module"): never an internal path. */
  label?: string;
  /** What each thread's factory is given (what can be sent: no logger, gate or models). */
  factoryOptions: { config: ModelConfig; modelDir: string; version: string; versionDir: string };
  /** Threads to run, each one instance (default 1). */
  instances?: number;
  /** Where the threads' stages log (their calls are forwarded here). */
  logger?: StageLogger;
  /** The server's CPU gate: held shared around each execution in a thread. */
  cpuGate?: CpuGate;
  /**
   * Move the request's whole buffers to the thread instead of copying them: the caller's
   * typed arrays are detached after the call is sent. Default false: a caller may share
   * a tensor (an ensemble feeds one to several steps); responses always move.
   */
  moveRequests?: boolean;
}

const threadImports: string[] = [];

/**
 * Has every instance thread started from now on import `url` before its stage module: for
 * module resolve hooks (node:module register), which Node 20 does not pass on to worker threads.
 */
export function importInInstanceThreads(url: string): void {
  if (!threadImports.includes(url)) threadImports.push(url);
}

export type ReadyMessage = Extract<FromInstance, { type: "ready" }>;

interface Call {
  id: number;
  stream: boolean;
  onResponse(response: InferResponse): void;
  /** The thread is done with the call (answered, failed, crashed, or the stage closed). */
  settle(err?: Error): void;
}

interface Instance {
  worker: Worker;
  index: number;
  call?: Call;
  loaded: boolean;
  /** The thread's last uncaught error, reported when it exits. */
  crash?: Error;
  exited: Promise<void>;
  /** Resolves with the thread's `ready` message, rejects with its load error. */
  ready: Promise<ReadyMessage>;
  /** Resolves when the thread answers `close` (its stage closed). */
  closed?: () => void;
}

const WORKER_URL = new URL("./instance-worker.js", import.meta.url);
/** How long close() lets a thread close its stage before terminating it. */
const CLOSE_GRACE_MS = 5_000;

/** The threads behind startWorkerInstances: which are idle, the calls waiting for one, a crashed one's replacement. */
export class InstancePool {
  readonly model: string;
  readonly count: number;
  private readonly load: InstanceLoad;
  /** Move the requests' buffers to the threads (WorkerInstancesOptions.moveRequests). */
  private readonly move: boolean;
  private readonly logger: StageLogger | undefined;
  private readonly cpuGate: CpuGate | undefined;
  /** By instance index; undefined where a crashed thread could not be replaced. */
  private readonly instances: (Instance | undefined)[] = [];
  private readonly idle: Instance[] = [];
  private readonly waiting: { resolve(i: Instance): void; reject(err: Error): void }[] = [];
  private closing = false;
  private closed: Promise<void> | undefined;
  private nextId = 1;

  constructor(options: WorkerInstancesOptions) {
    const { factoryOptions } = options;
    this.model = factoryOptions.config.name;
    this.count = Math.max(1, options.instances ?? 1);
    this.move = options.moveRequests ?? false;
    this.logger = options.logger;
    this.cpuGate = options.cpuGate;
    this.load = {
      specifier: options.specifier,
      label: options.label ?? "the stage module",
      model: this.model,
      config: toBinary(ModelConfigSchema, factoryOptions.config),
      modelDir: factoryOptions.modelDir,
      version: factoryOptions.version,
      versionDir: factoryOptions.versionDir,
    };
  }

  /** Loads every thread; gives the first one's `ready`, or fails with the first load error (every thread ended). */
  async start(): Promise<ReadyMessage> {
    for (let i = 0; i < this.count; i++) this.instances.push(this.spawn(i));
    let first: ReadyMessage;
    try {
      const readies = await Promise.all(this.instances.map((i) => (i as Instance).ready));
      first = readies[0] as ReadyMessage;
    } catch (err) {
      this.closing = true;
      await Promise.all(this.instances.map((i) => i?.worker.terminate()));
      throw err;
    }
    for (const i of this.instances) this.idle.push(i as Instance);
    return first;
  }

  isReady(): boolean {
    return !this.closing && this.instances.some((i) => i?.loaded);
  }

  /** Calls waiting for an idle thread. */
  waitingCalls(): number {
    return this.waiting.length;
  }

  /**
   * Runs one call on an idle thread, its responses to `onResponse` (one, or a stream's several);
   * resolves when the thread is done with it (rejects at once when aborted).
   */
  async run(
    request: InferRequest,
    opts: InferOptions | undefined,
    stream: boolean,
    onResponse: (r: InferResponse) => void,
  ): Promise<void> {
    if (this.closing) throw this.unavailable("the model is being unloaded");
    const signal = opts?.signal;
    if (signal?.aborted) throw this.canceled();
    const instance = await this.acquire(signal);
    const cpuGate = this.cpuGate;
    let releaseCpu: (() => void) | undefined;
    const transfer: ArrayBuffer[] = [];
    let wire: InferRequest;
    try {
      if (cpuGate) releaseCpu = cpuGate.tryAcquireShared() ?? (await cpuGate.acquireShared());
      if (signal?.aborted) throw this.canceled();
      if (this.closing) throw this.unavailable("the model is being unloaded");
      wire = portableRequest(request, transfer, this.move);
    } catch (err) {
      releaseCpu?.();
      this.release(instance);
      throw err;
    }
    const id = this.nextId++;
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      const onAbort = () => {
        instance.worker.postMessage({ type: "cancel", id } satisfies ToInstance);
        if (settled) return;
        settled = true;
        reject(this.canceled());
      };
      instance.call = {
        id,
        stream,
        onResponse: (r) => {
          if (!settled) onResponse(r);
        },
        settle: (err) => {
          releaseCpu?.();
          signal?.removeEventListener("abort", onAbort);
          if (settled) return;
          settled = true;
          if (err) reject(err);
          else resolve();
        },
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      const options: Extract<ToInstance, { type: "infer" }>["options"] = {};
      if (opts?.priority !== undefined) options.priority = opts.priority;
      if (opts?.timeoutMicroseconds !== undefined) options.timeoutMicroseconds = opts.timeoutMicroseconds;
      try {
        instance.worker.postMessage(
          { type: "infer", id, request: wire, options, stream } satisfies ToInstance,
          transfer,
        );
      } catch (err) {
        // Not sent (a value that cannot be cloned): the thread stays free.
        this.finish(
          instance,
          new StageError(
            Code.InvalidArgument,
            this.model,
            `cannot send the request to an instance: ${(err as Error).message}`,
          ),
        );
      }
    });
  }

  close(): Promise<void> {
    this.closed ??= (async () => {
      this.closing = true;
      const gone = this.unavailable("the model is being unloaded");
      for (const w of this.waiting.splice(0)) w.reject(gone);
      this.idle.length = 0;
      await Promise.all(this.instances.map((instance) => instance && closeInstance(instance, gone)));
    })();
    return this.closed;
  }

  private unavailable(why: string): StageError {
    return new StageError(Code.Unavailable, this.model, why);
  }

  private canceled(): StageError {
    return new StageError(Code.Canceled, this.model, "request cancelled");
  }

  private acquire(signal: AbortSignal | undefined): Instance | Promise<Instance> {
    const free = this.idle.pop();
    if (free) return free;
    if (this.instances.every((i) => i === undefined)) throw this.unavailable("no instance is running");
    return new Promise<Instance>((resolve, reject) => {
      const waiter = {
        resolve: (i: Instance) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(i);
        },
        reject,
      };
      const onAbort = () => {
        const at = this.waiting.indexOf(waiter);
        if (at >= 0) this.waiting.splice(at, 1);
        reject(this.canceled());
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  private release(instance: Instance): void {
    if (this.closing || this.instances[instance.index] !== instance) return;
    const next = this.waiting.shift();
    if (next) next.resolve(instance);
    else this.idle.push(instance);
  }

  private finish(instance: Instance, err?: Error): void {
    const call = instance.call;
    instance.call = undefined;
    call?.settle(err);
    this.release(instance);
  }

  private spawn(index: number): Instance {
    const imports = threadImports.length > 0 ? { imports: [...threadImports] } : {};
    const worker = new Worker(WORKER_URL, { workerData: { ...this.load, ...imports } });
    let onReady!: (m: ReadyMessage) => void;
    let onLoadError!: (err: Error) => void;
    const ready = new Promise<ReadyMessage>((resolve, reject) => {
      onReady = resolve;
      onLoadError = reject;
    });
    ready.catch(() => {});
    let exited!: () => void;
    const instance: Instance = {
      worker,
      index,
      loaded: false,
      ready,
      exited: new Promise<void>((r) => {
        exited = r;
      }),
    };
    worker.on("message", (m: FromInstance) => {
      if (m.type === "ready") {
        instance.loaded = true;
        onReady(m);
      } else if (m.type === "load-error") onLoadError(errorFromWire(m.error, this.model));
      else this.onMessage(instance, m);
    });
    worker.on("error", (err) => {
      instance.crash = err;
    });
    worker.on("exit", (code) => {
      exited();
      this.onExit(instance, code, onLoadError);
    });
    return instance;
  }

  /** A loaded thread's message: a log line, or an answer to its call. */
  private onMessage(instance: Instance, m: Exclude<FromInstance, { type: "ready" | "load-error" }>): void {
    switch (m.type) {
      case "log":
        this.forwardLog(m, instance.index);
        return;
      case "response":
        if (instance.call?.id !== m.id) return;
        instance.call.onResponse(m.response);
        if (!instance.call.stream) this.finish(instance);
        return;
      case "end":
        if (instance.call?.id === m.id) this.finish(instance);
        return;
      case "error":
        if (instance.call?.id === m.id) this.finish(instance, errorFromWire(m.error, this.model));
        return;
      case "closed":
        instance.closed?.();
        return;
    }
  }

  private onExit(instance: Instance, code: number, onLoadError: (err: Error) => void): void {
    const { model } = this;
    const index = instance.index;
    const why = instance.crash?.message ?? `exit code ${code}`;
    if (!instance.loaded) {
      onLoadError(new StageError(Code.Internal, model, `an instance's worker thread stopped while loading: ${why}`));
    }
    if (this.closing || this.instances[index] !== instance) return;
    // A crash: the call it ran fails, a new thread takes its place.
    const call = instance.call;
    instance.call = undefined;
    const at = this.idle.indexOf(instance);
    if (at >= 0) this.idle.splice(at, 1);
    call?.settle(
      new InstanceEndedError(Code.Internal, model, `the instance's worker thread crashed: ${why}`, "exited"),
    );
    if (!instance.loaded) return;
    this.logger?.error({ model, instance: index, err: instance.crash }, "instance worker thread crashed; replacing it");
    this.replace(index);
  }

  private replace(index: number): void {
    const fresh = this.spawn(index);
    this.instances[index] = fresh;
    fresh.ready.then(
      () => this.release(fresh),
      (err: unknown) => {
        if (this.closing) return;
        this.logger?.error({ model: this.model, instance: index, err }, "instance worker thread could not be replaced");
        this.instances[index] = undefined;
        void fresh.worker.terminate();
        if (this.instances.every((i) => i === undefined)) {
          for (const w of this.waiting.splice(0)) w.reject(this.unavailable("no instance is running"));
        }
      },
    );
  }

  private forwardLog(m: Extract<FromInstance, { type: "log" }>, index: number): void {
    const logger = this.logger;
    if (!logger) return;
    const obj = typeof m.obj === "string" ? m.obj : { ...m.obj, instance: index };
    logger[m.level](obj, m.msg);
  }
}

/** Fails the instance's call with `gone`, asks its thread to close its stage (waiting CLOSE_GRACE_MS at most), then ends the thread. */
async function closeInstance(instance: Instance, gone: StageError): Promise<void> {
  const call = instance.call;
  instance.call = undefined;
  call?.settle(gone);
  const answered = new Promise<void>((r) => {
    instance.closed = r;
  });
  instance.worker.postMessage({ type: "close" } satisfies ToInstance);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    answered,
    instance.exited,
    new Promise<void>((r) => {
      timer = setTimeout(r, CLOSE_GRACE_MS);
    }),
  ]);
  clearTimeout(timer);
  await instance.worker.terminate();
}
