/**
 * One model instance: a python3 process running stub.py, answering one execution at a time.
 * A crash (exit) or a hang (the execution's deadline) fails that execution UNAVAILABLE naming
 * the model; the next execution starts a fresh process (the instance restarted).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, constants, ftruncateSync, mkdtempSync, openSync, readSync, rmSync } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { InferOptions, InferRequest, ModelCaller, Tensor } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import { InstanceEndedError } from "@trellis/stage/backend";
import { answerControl, answerModelCall, parametersFromJson, parametersJson } from "./bls.js";
import { codeOfTriton } from "./codes.js";
import { ResponseStream, type StreamItem } from "./decoupled.js";
import {
  decodeTensor,
  encodeFrame,
  encodeTensors,
  type Frame,
  FrameReader,
  frameCopyStats,
  type TensorMeta,
} from "./frames.js";
import { answerMetric, applyMetricUpdate } from "./metrics.js";

export const STUB_PATH = fileURLToPath(new URL("../python/stub.py", import.meta.url));

export interface StubOptions {
  modelName: string;
  pythonExecutable: string;
  /** initialize(args)'s dict, and the model file to load. */
  initialize: Record<string, string>;
  modelFile: string;
  /** Longest one execution may take before the process is killed. */
  executeTimeoutMs: number;
  /** Longest the load (imports, initialize) may take, at start and at each restart. */
  loadTimeoutMs: number;
  maxFrameBytes: number;
  /** Most responses a decoupled model may send one request. */
  maxStreamResponses: number;
  models?: ModelCaller;
  onLog?: (line: string) => void;
  /** Large results through the stub's answer file where it can be opened (default), else all through the pipe. */
  answerFile?: boolean;
}

export type StubAnswer = Tensor[] | Error;

interface WireResponse {
  outputs?: TensorMeta[];
  parameters?: Record<string, unknown>;
  error?: string;
  code?: number;
}

type Waiter = { resolve(frame: Frame): void; reject(error: Error): void };

/**
 * Results with bodies from this size on come through the stub's answer file (stub.py's
 * AnswerFile), read in the thread pool; smaller ones through the pipe, where one chunk holds them.
 */
const ANSWER_FILE_FROM = 1 << 20;

export class StubProcess {
  private child: ChildProcess | undefined;
  private waiter: Waiter | undefined;
  private stderrTail = "";
  private starting: Promise<void> | undefined;
  /** How many processes this instance has started (1 + restarts). */
  starts = 0;
  /** Executions sent so far: each one's id, which a cancellation names. */
  private executions = 0;
  /** A decoupled model's requests still open, by "execute:index" (their responses' frames name it). */
  private readonly streams = new Map<string, ResponseStream>();
  /** Decoupled executions take the process one at a time (the batcher does it for the others). */
  private turns: Promise<void> = Promise.resolve();
  /** Which request the model last read (stub.py's Progress): a file's descriptor, opened at the first start. */
  private progressFd: number | undefined;
  /** The current process's answer file (stub.py's AnswerFile), where it could be opened. */
  private answerFile: FileHandle | undefined;
  /** Frames wait here, in order, behind a body being read from the answer file. */
  private reading: Promise<void> | undefined;

  constructor(private readonly options: StubOptions) {}

  /** Starts the process and loads the model, or throws with the traceback's last lines. */
  start(): Promise<void> {
    this.starting ??= this.launch().catch((e: unknown) => {
      this.starting = undefined;
      throw e;
    });
    return this.starting;
  }

  private async launch(): Promise<void> {
    const { options } = this;
    this.starts += 1;
    this.progressFd ??= openProgressFile();
    // The previous process's file: closed once any read of it is done (FileHandle waits for it).
    void this.answerFile?.close().catch(() => {});
    this.answerFile = undefined;
    const child = spawn(options.pythonExecutable, ["-u", STUB_PATH], {
      stdio: ["pipe", "pipe", "pipe", this.progressFd ?? "ignore"],
    });
    this.child = child;
    const reader = new FrameReader(options.maxFrameBytes);
    const spawned = new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", (e: NodeJS.ErrnoException) => {
        if (this.child === child) this.child = undefined;
        reject(pythonStartError(options.modelName, options.pythonExecutable, e));
      });
    });
    child.stdout?.on("data", (chunk: Buffer) => {
      try {
        for (const frame of reader.push(chunk)) this.receive(child, frame);
      } catch (e) {
        // Over the bound (from the length prefix, nothing buffered): that execution fails, named.
        const message = `model "${options.modelName}": ${(e as Error).message} on a Python answer (--python-max-answer-bytes); the instance restarts for the next request`;
        this.fail(new StageError(Code.ResourceExhausted, options.modelName, message));
        this.detach(child);
        child.kill("SIGKILL");
      }
    });
    child.stderr?.on("data", (chunk: Buffer) => {
      const text = chunk.toString();
      this.stderrTail = (this.stderrTail + text).slice(-4000);
      options.onLog?.(text);
    });
    child.on("exit", (code, signal) => {
      // A process already stopped (its deadline passed) has failed its execution already.
      if (this.child !== child) return;
      this.detach(child);
      this.fail(
        new InstanceEndedError(
          Code.Unavailable,
          options.modelName,
          `model "${options.modelName}": its Python process exited (${signal ?? `code ${code}`}); the instance restarts for the next request`,
          "exited",
          this.requestBeingRead(),
        ),
      );
    });
    child.stdin?.on("error", () => {});
    await spawned;
    const answer = await this.exchange(
      { type: "init", model_file: options.modelFile, initialize: options.initialize },
      [],
      options.loadTimeoutMs,
    );
    if (answer.header.type === "load_failed") {
      child.kill("SIGKILL");
      throw new StageError(
        Code.InvalidArgument,
        options.modelName,
        `model.py failed to load: ${String(answer.header.message)}`,
      );
    }
    if (options.answerFile !== false) this.answerFile = await openAnswerFile(child, answer.header.answer_fd);
  }

  /** Delivers a frame in the order it came, its body first read from the answer file if it is there. */
  private receive(child: ChildProcess, frame: Frame): void {
    const inFile = frame.header.body_in_file;
    // The file as it is now, when the frame came: a body waiting its turn is not read from a file
    // a restart opens meanwhile (and a stopped process's frames are not delivered anyway).
    const file = this.answerFile;
    if (inFile === undefined && this.reading === undefined) {
      this.deliver(frame);
      return;
    }
    const reading = (this.reading ?? Promise.resolve()).then(async () => {
      try {
        const whole = inFile === undefined ? frame : await this.readAnswerBody(frame, inFile, file);
        // A process stopped meanwhile (its deadline passed) has failed its execution already.
        if (this.child === child) this.deliver(whole);
      } catch (e) {
        if (this.child === child)
          this.fail(new StageError(Code.Internal, this.options.modelName, (e as Error).message), false);
      }
    });
    this.reading = reading;
    void reading.then(() => {
      if (this.reading === reading) this.reading = undefined;
    });
  }

  /** A result's body, from the answer file (one read in the thread pool, no work on the event loop). */
  private async readAnswerBody(frame: Frame, length: unknown, file: FileHandle | undefined): Promise<Frame> {
    const { modelName: name, maxFrameBytes } = this.options;
    if (typeof length !== "number" || !Number.isSafeInteger(length) || length < 0 || !file)
      throw new Error(`model "${name}": its Python process named an answer file it was not given`);
    if (length > maxFrameBytes) return { header: frame.header, body: frame.body, droppedBytes: length };
    const body = Buffer.allocUnsafe(length);
    for (let at = 0; at < length; ) {
      const { bytesRead } = await file.read(body, at, length - at, at);
      if (bytesRead === 0) throw new Error(`model "${name}": its Python process's answer file ended early`);
      at += bytesRead;
    }
    frameCopyStats.bytesCopied += length;
    frameCopyStats.fromAnswerFiles += length;
    return { header: frame.header, body };
  }

  private deliver(frame: Frame): void {
    if (frame.droppedBytes !== undefined) {
      this.dropped(frame);
      return;
    }
    if (frame.header.type === "bls" || frame.header.type === "control") {
      void this.answerModelCall(frame);
      return;
    }
    if (frame.header.type === "metric") {
      this.child?.stdin?.write(answerMetric(frame.header));
      return;
    }
    if (frame.header.type === "response") {
      const key = `${frame.header.execute}:${frame.header.index}`;
      this.streams.get(key)?.push(frame);
      if (frame.header.final === true && this.streams.delete(key)) {
        this.child?.stdin?.write(
          encodeFrame({ type: "forget", execute: frame.header.execute, index: frame.header.index }),
        );
      }
      return;
    }
    if (frame.header.type === "metric_update") {
      applyMetricUpdate(frame.header, this.options.onLog);
      return;
    }
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.resolve(frame);
  }

  /**
   * A frame over --python-max-answer-bytes, its body dropped unread: an answer fails its execution
   * (a decoupled response its request), and the process keeps running. Another frame (a BLS
   * request the model waits on) cannot be answered: the process is stopped.
   */
  private dropped(frame: Frame): void {
    const { modelName: name, maxFrameBytes } = this.options;
    const error = new StageError(
      Code.ResourceExhausted,
      name,
      `model "${name}": its Python process sent a ${frame.droppedBytes}-byte answer, over the ${maxFrameBytes}-byte bound (--python-max-answer-bytes); it was dropped`,
    );
    if (frame.header.type === "result") {
      this.fail(error, false);
      return;
    }
    if (frame.header.type === "response") {
      this.streams.get(`${frame.header.execute}:${frame.header.index}`)?.fail(error);
      return;
    }
    const child = this.child;
    this.fail(error);
    if (child) {
      this.detach(child);
      child.kill("SIGKILL");
    }
  }

  /** The next execution starts a fresh process; this one's late output and exit are ignored. */
  private detach(child: ChildProcess): void {
    if (this.child !== child) return;
    this.child = undefined;
    this.starting = undefined;
  }

  /** Fails the execution waiting; `ended`: the process is gone too, and every open decoupled request with it. */
  private fail(error: Error, ended = true): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.reject(error);
    if (!ended) return;
    // The process is gone (or being stopped): no open decoupled request gets another response.
    const open = [...this.streams.values()];
    this.streams.clear();
    for (const stream of open) stream.fail(error);
  }

  /** Sends one frame and waits for the stub's answer, killing the process past the deadline. */
  private exchange(header: object, parts: Uint8Array[], timeoutMs = this.options.executeTimeoutMs): Promise<Frame> {
    const child = this.child;
    if (!child?.stdin)
      return Promise.reject(
        new StageError(Code.Unavailable, this.options.modelName, "its Python process is not running"),
      );
    return new Promise<Frame>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.fail(
          new InstanceEndedError(
            Code.Unavailable,
            this.options.modelName,
            `model "${this.options.modelName}": its Python process gave no answer within ${timeoutMs} ms and was stopped; the instance restarts for the next request`,
            "timed out",
            this.requestBeingRead(),
          ),
        );
        this.detach(child);
        child.kill("SIGKILL");
      }, timeoutMs);
      this.waiter = {
        resolve: (f) => {
          clearTimeout(timer);
          resolve(f);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      child.stdin?.write(encodeFrame(header, parts));
    });
  }

  /**
   * Runs `execute(requests)` in the stub: each request's outputs (with its response parameters),
   * or an error of its own with the code the model gave it. `options.signal` (a batch of one)
   * tells the model of a cancellation: `request.is_cancelled()`.
   */
  async execute(requests: readonly InferRequest[], options?: InferOptions): Promise<StubAnswer[]> {
    await this.start();
    const parts: Uint8Array[] = [];
    let offset = 0;
    const wire = requests.map((r, i) => {
      const inputs = encodeTensors(r.inputs, parts, offset);
      offset = parts.reduce((n, p) => n + p.byteLength, 0);
      return {
        id: r.id ?? String(i),
        inputs,
        outputs: (r.outputs ?? []).map((o) => o.name),
        parameters: parametersJson(r.parameters),
      };
    });
    const executeId = ++this.executions;
    const child = this.child;
    // Large results come through the answer file, up to the bound (a larger one comes through the pipe, dropped unread).
    const answerFile = this.answerFile ? { answer_file: ANSWER_FILE_FROM, answer_max: this.options.maxFrameBytes } : {};
    const cancel = () => child?.stdin?.write(encodeFrame({ type: "cancel", execute: executeId, index: 0 }));
    const signal = requests.length === 1 ? options?.signal : undefined;
    signal?.addEventListener("abort", cancel, { once: true });
    let frame: Frame;
    try {
      frame = await this.exchange({ type: "execute", id: executeId, requests: wire, ...answerFile }, parts);
    } finally {
      signal?.removeEventListener("abort", cancel);
    }
    const name = this.options.modelName;
    if (frame.header.type === "failed") {
      const error = new StageError(codeOfTriton(frame.header.code), name, String(frame.header.message));
      return requests.map(() => error);
    }
    const responses = (frame.header.responses ?? []) as WireResponse[];
    if (responses.length !== requests.length) {
      const error = new StageError(
        Code.Internal,
        name,
        `model "${name}": execute() returned ${responses.length} responses for ${requests.length} requests`,
      );
      return requests.map(() => error);
    }
    return responses.map((r) => {
      if (r.error !== undefined) return new StageError(codeOfTriton(r.code), name, r.error);
      const outputs = (r.outputs ?? []).map((m) => decodeTensor(m, frame.body));
      // The runtime gives these to the client as the response's parameters.
      return r.parameters ? Object.assign(outputs, { parameters: parametersFromJson(r.parameters) }) : outputs;
    });
  }

  /**
   * A decoupled model's request: execute([request]) with a response sender, then every response
   * it sends until TRITONSERVER_RESPONSE_COMPLETE_FINAL (bounded: see decoupled.ts).
   */
  async *executeDecoupled(request: InferRequest, options?: InferOptions): AsyncGenerator<StreamItem> {
    const stream = await this.startDecoupled(request, options?.signal);
    yield* stream;
  }

  private async startDecoupled(request: InferRequest, signal?: AbortSignal): Promise<ResponseStream> {
    const { modelName: name, executeTimeoutMs, maxFrameBytes, maxStreamResponses } = this.options;
    let release!: () => void;
    const previous = this.turns;
    this.turns = new Promise<void>((r) => {
      release = r;
    });
    await previous;
    try {
      await this.start();
      const parts: Uint8Array[] = [];
      const wire = {
        id: request.id ?? "0",
        inputs: encodeTensors(request.inputs, parts, 0),
        outputs: (request.outputs ?? []).map((o) => o.name),
        parameters: parametersJson(request.parameters),
      };
      const executeId = ++this.executions;
      const key = `${executeId}:0`;
      const child = this.child;
      const stream = new ResponseStream({
        modelName: name,
        idleMs: executeTimeoutMs,
        maxUnreadBytes: maxFrameBytes,
        maxResponses: maxStreamResponses,
        close: () => {
          if (!this.streams.delete(key)) return;
          child?.stdin?.write(encodeFrame({ type: "cancel", execute: executeId, index: 0, close: true }));
        },
      });
      this.streams.set(key, stream);
      if (signal?.aborted) stream.fail(new StageError(Code.Canceled, name, "request cancelled"));
      signal?.addEventListener("abort", () => stream.fail(new StageError(Code.Canceled, name, "request cancelled")), {
        once: true,
      });
      const frame = await this.exchange({ type: "execute", id: executeId, decoupled: true, requests: [wire] }, parts);
      if (frame.header.type === "failed" || frame.header.error !== undefined) {
        stream.fail(
          new StageError(codeOfTriton(frame.header.code), name, String(frame.header.message ?? frame.header.error)),
        );
      }
      return stream;
    } finally {
      release();
    }
  }

  /** A BLS request or model control from the model: run by the server's models, answered on the same pipe. */
  private async answerModelCall(frame: Frame): Promise<void> {
    const child = this.child;
    const models = this.options.models;
    // False once the stub that asked is gone (ended or restarted): a stream then stops pulling.
    const send = (reply: Buffer): boolean => {
      if (!child?.stdin || child.stdin.destroyed || this.child !== child) return false;
      child.stdin.write(reply);
      return true;
    };
    if (frame.header.type === "control") send(await answerControl(models, frame.header));
    else await answerModelCall(models, frame, this.options.maxFrameBytes, send);
  }

  /**
   * The index of the request of the current execution that the model read last (the one it was
   * computing when its process ended), if it read any.
   */
  private requestBeingRead(): number | undefined {
    if (this.progressFd === undefined) return undefined;
    const cell = Buffer.alloc(8);
    try {
      readSync(this.progressFd, cell, 0, 8, 0);
    } catch {
      return undefined;
    }
    const [execution, indexPlusOne] = [cell.readUInt32LE(0), cell.readUInt32LE(4)];
    return execution === (this.executions & 0xffffffff) && indexPlusOne > 0 ? indexPlusOne - 1 : undefined;
  }

  /** Calls finalize() and ends the process (killed if it does not end in time). */
  async close(): Promise<void> {
    if (this.progressFd !== undefined) {
      closeSync(this.progressFd);
      this.progressFd = undefined;
    }
    void this.answerFile?.close().catch(() => {});
    this.answerFile = undefined;
    const child = this.child;
    if (!child) return;
    try {
      await this.exchange({ type: "finalize" }, []);
    } catch {
      // A process that cannot finalize is stopped below all the same.
    }
    child.kill("SIGKILL");
  }
}

/**
 * An 8-byte file for stub.py's Progress, open for reading and writing, its name already removed
 * (nothing is left behind, whatever happens to the server); undefined where it cannot be made.
 */
function openProgressFile(): number | undefined {
  let dir: string | undefined;
  try {
    dir = mkdtempSync(join(tmpdir(), "trellis-python-"));
    const fd = openSync(join(dir, "progress"), "w+", 0o600);
    ftruncateSync(fd, 8);
    return fd;
  } catch {
    return undefined;
  } finally {
    if (dir) rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The stub's answer file, opened through /proc as its own descriptor (it outlives the process, so
 * a read under way when the process ends completes). Non-blocking, and only a regular file is
 * kept: the number comes from the stub, and a FIFO or device there must not stall the server.
 * Undefined where there is none (no memfd, no /proc): answers then all come through the pipe.
 */
async function openAnswerFile(child: ChildProcess, fd: unknown): Promise<FileHandle | undefined> {
  if (typeof fd !== "number" || !Number.isSafeInteger(fd) || fd < 0 || child.pid === undefined) return undefined;
  let file: FileHandle | undefined;
  try {
    file = await open(`/proc/${child.pid}/fd/${fd}`, constants.O_RDONLY | constants.O_NONBLOCK);
    if ((await file.stat()).isFile()) return file;
  } catch {
    // No such path on this system: the pipe carries everything.
  }
  await file?.close().catch(() => {});
  return undefined;
}

/** Why the Python executable did not start, for the model's load or restart error. */
export function pythonStartError(model: string, python: string, e: NodeJS.ErrnoException): StageError {
  return new StageError(
    Code.Unavailable,
    model,
    e.code === "ENOENT"
      ? `the Python executable "${python}" was not found (set --python-executable)`
      : `the Python executable "${python}" could not start: ${e.message}`,
  );
}
