/**
 * Triton's request tracing (levels TIMESTAMPS and TENSORS): the settings from
 * --trace-config and the trace extension (global, and per model), the sampling
 * (every trace_rate-th request, trace_count in all), and where traces go: in
 * trace mode "triton", the JSON trace file Triton's tools read (per trace a
 * header object, then its timestamps and its tensors, an ensemble's steps as
 * traces of their own whose parent_id is the ensemble's); in mode
 * "opentelemetry", spans over OTLP (otel.ts).
 */
import { randomBytes } from "node:crypto";
import { rename, writeFile } from "node:fs/promises";
import type { TraceControl, TraceSettings } from "@trellis/frontends";
import { Code, nowNs, type RequestTrace, StageError, type StageLogger, type Tensor } from "@trellis/stage";
import { float16ArrayToFloat32, type TensorActivity, type TraceActivity } from "@trellis/stage/backend";
import type { FinishedTrace, OtelExport } from "./otel.js";
import {
  type KeptSpan,
  type KeptTrace,
  placeRemoteSpan,
  type RecentTraceBounds,
  type RecentTraces,
  sanitizeRemoteSpan,
} from "./recent-traces.js";

/**
 * The header that asks for one request to be traced whatever the sampling: "1" keeps its trace
 * among the recent ones (the page sets it); "reply" also sends it back in the response (a
 * calling Trellis server sets it on a remote step's call). Honoured as the trace settings' access
 * rules allow: with the trace endpoints restricted, only with their key.
 */
export const TRACE_ASK_HEADER = "trellis-trace";

export type TraceMode = "triton" | "opentelemetry";
export type TraceLevel = "TIMESTAMPS" | "TENSORS";
const LEVELS: readonly TraceLevel[] = ["TIMESTAMPS", "TENSORS"];

export interface TraceValues {
  mode: TraceMode;
  /** TIMESTAMPS, TENSORS or both when tracing; empty is OFF. */
  level: TraceLevel[];
  /** Every rate-th request is traced; 0: none (but, in opentelemetry mode, those carrying a traceparent). */
  rate: number;
  /** Traces still to collect; -1 never stops. */
  count: number;
  /** Write every logFrequency traces to `<file>.<n>`; 0 writes everything to `<file>` at shutdown. */
  logFrequency: number;
  file: string;
  /** Bounds of the recent traces kept in memory (--trace-config recent,count= / recent,bytes=); default DEFAULT_RECENT_TRACE_BOUNDS. */
  recent?: RecentTraceBounds;
}

/** Triton's defaults: off, every 1000th request, no limit, written at shutdown. */
export const DEFAULT_TRACE_VALUES: Readonly<TraceValues> = {
  mode: "triton",
  level: [],
  rate: 1000,
  count: -1,
  logFrequency: 0,
  file: "",
};

const KEYS = {
  trace_level: "level",
  trace_rate: "rate",
  trace_count: "count",
  log_frequency: "logFrequency",
  trace_file: "file",
  trace_mode: "mode",
} as const satisfies Record<string, keyof TraceValues | undefined>;
type SettingName = keyof typeof KEYS;
const SETTING_NAMES = Object.keys(KEYS) as SettingName[];

/** The settings as the trace extension writes them. */
export function traceSettingsOf(v: TraceValues): TraceSettings {
  return {
    trace_file: v.file,
    trace_level: v.level.length > 0 ? [...v.level] : ["OFF"],
    trace_rate: String(v.rate),
    trace_count: String(v.count),
    log_frequency: String(v.logFrequency),
    trace_mode: v.mode,
  };
}

const invalid = (msg: string) => new StageError(Code.InvalidArgument, "", msg);
/** How long shutdown waits for the last spans to reach the OpenTelemetry collector. */
const OTEL_SHUTDOWN_WAIT_MS = 2000;
// Refusals start with Triton's words (server src/http_server.cc HandleTrace, src/tracer.cc); ours follow.
const noFile =
  "trace file name is not given: tracing needs a trace file, set when the server starts (--trace-config triton,file=<path>)";
/** A settings update that would trace without a file: TraceManager::UpdateTraceSetting's words, then ours. */
const noFileUpdate = `Attempting to set invalid trace setting :${noFile}`;

function wholeNumber(setting: string, values: string[], min: number): number {
  if (values.length !== 1) throw invalid(`Unable to parse '${setting}': expected one value, got ${values.length}`);
  const text = values[0]!.trim();
  const n = Number(text);
  if (text === "" || !Number.isSafeInteger(n)) throw invalid(`Unable to parse '${setting}', got: ${values[0]}`);
  if (n < min) {
    // Triton words the trace_count floor its own way; the others as out of range.
    throw invalid(
      setting === "trace_count"
        ? `Unable to parse 'trace_count'. Expecting value >= ${min}, got:${values[0]}`
        : `Unable to parse '${setting}', value is out of range [ ${min}, ${2 ** 32 - 1} ], got: ${values[0]}`,
    );
  }
  return n;
}

/**
 * One setting's value from its wire form (what --trace-config and the trace extension
 * carry), as a TraceValues field; trace_mode checks only. Throws a StageError naming it.
 */
export function parseTraceSetting(setting: string, values: string[]): Partial<TraceValues> {
  switch (setting) {
    case "trace_level": {
      for (const v of values) {
        if (v !== "OFF" && !(LEVELS as readonly string[]).includes(v))
          throw invalid(`trace_level: expected OFF, TIMESTAMPS or TENSORS, got "${v}"`);
      }
      if (values.includes("OFF") && values.length > 1) {
        throw invalid("Expect only one trace level 'OFF' is specified");
      }
      return { level: LEVELS.filter((l) => values.includes(l)) };
    }
    case "trace_rate":
      return { rate: wholeNumber(setting, values, 0) };
    case "trace_count":
      return { count: wholeNumber(setting, values, -1) };
    case "log_frequency":
      return { logFrequency: wholeNumber(setting, values, 0) };
    case "trace_file":
      if (values.length !== 1) throw invalid(`trace_file: expected one value, got ${values.length}`);
      return { file: values[0]! };
    case "trace_mode":
      if (values.length === 1 && (values[0] === "triton" || values[0] === "opentelemetry")) {
        return { mode: values[0] };
      }
      throw invalid(`trace_mode: expected triton or opentelemetry, got "${values.join(",")}"`);
    default:
      throw invalid(`unknown trace setting "${setting}"; the settings are ${SETTING_NAMES.join(", ")}`);
  }
}

/** Where the traces sampled under one set of settings stand: requests seen, traces still to take. */
interface Sampler {
  seen: number;
  remaining: number;
}

/** A model's own settings (the rest follow the global ones) and its own sampling. */
interface ModelTracing extends Sampler {
  overrides: Partial<TraceValues>;
}

interface Timestamp {
  name: TraceActivity;
  ns: number;
}

/**
 * A tensor as Triton's TENSORS trace writes it: the elements as one comma-separated
 * string (BYTES elements as UTF-8 text, FP16 and BF16 as the numbers they hold, BOOL
 * as 1 and 0), the shape as "1,16", and the datatype.
 */
export function tracedTensor(tensor: Tensor): { name: string; data: string; shape: string; dtype: string } {
  let values: Iterable<unknown>;
  switch (tensor.datatype) {
    case "BYTES":
      values = (tensor.data as Uint8Array[]).map((element) => textDecoder.decode(element));
      break;
    case "FP16":
      values = float16ArrayToFloat32(tensor.data as Uint16Array);
      break;
    case "BF16":
      values = Array.from(tensor.data as Uint16Array, (bits) => bf16View(bits));
      break;
    case "BOOL":
      values = Array.from(tensor.data as ArrayLike<number | boolean>, (v) => (v ? 1 : 0));
      break;
    default:
      values = tensor.data as Iterable<unknown>;
  }
  return {
    name: tensor.name,
    data: Array.from(values, String).join(","),
    shape: tensor.shape.join(","),
    dtype: tensor.datatype,
  };
}

const textDecoder = new TextDecoder();
const bf16Scratch = new DataView(new ArrayBuffer(4));
/** A BF16 pattern's value: the top half of an FP32. */
function bf16View(bits: number): number {
  bf16Scratch.setUint32(0, bits << 16);
  return bf16Scratch.getFloat32(0);
}

/** What a trace records: its level. */
interface Recording {
  timestamps: boolean;
  tensors: boolean;
}

/** What a trace and its children share: whether it is kept, sent back, and its W3C trace id. */
interface TraceScope {
  /** Kept among the recent traces: remote steps are asked for their own. */
  kept: boolean;
  /** The caller asked for it back in the response. */
  reply: boolean;
  traceId?: string;
}

class Trace implements RequestTrace {
  private readonly timestamps: Timestamp[] = [];
  private readonly tensors: { activity: TensorActivity; tensor: object }[] = [];
  private readonly children: Trace[] = [];
  private ended = false;
  private ranInBatch?: number;
  private markedFailed = false;
  private remoteSpan?: KeptSpan;

  constructor(
    private readonly newId: () => number,
    readonly id: number,
    private readonly model: string,
    private readonly version: string,
    private readonly requestId: string | undefined,
    private readonly parentId: number | undefined,
    private readonly recording: Recording,
    /** Collects the trace; a child has none (it is collected with its parent). */
    private readonly onEnd?: (trace: Trace) => void,
    private readonly scope: TraceScope = { kept: false, reply: false },
  ) {}

  stamp(activity: TraceActivity, ns: number = nowNs()): void {
    if (this.recording.timestamps) this.timestamps.push({ name: activity, ns });
  }

  tensor(activity: TensorActivity, tensor: Tensor): void {
    // Written out now: the stage may reuse the tensor's memory once the request is answered.
    if (this.recording.tensors) this.tensors.push({ activity, tensor: tracedTensor(tensor) });
  }

  child(model: string, version: string): RequestTrace {
    const child = new Trace(
      this.newId,
      this.newId(),
      model,
      version,
      undefined,
      this.id,
      this.recording,
      undefined,
      this.scope,
    );
    this.children.push(child);
    return child;
  }

  failed(): void {
    this.markedFailed = true;
  }

  batchSize(size: number): void {
    this.ranInBatch = size;
  }

  remoteHeaders(): Record<string, string> | undefined {
    if (!this.scope.kept) return undefined;
    this.scope.traceId ??= randomBytes(16).toString("hex");
    return {
      traceparent: `00-${this.scope.traceId}-${randomBytes(8).toString("hex")}-01`,
      [TRACE_ASK_HEADER]: "reply",
    };
  }

  remote(reply: string): void {
    this.remoteSpan = sanitizeRemoteSpan(reply);
  }

  reply(): string | undefined {
    return this.scope.reply ? JSON.stringify(this.keptSpan(this.originNs())) : undefined;
  }

  /** The first timestamp taken (the waterfall's zero). */
  originNs(): number {
    let origin = Number.POSITIVE_INFINITY;
    for (const t of this.timestamps) origin = Math.min(origin, t.ns);
    return Number.isFinite(origin) ? origin : nowNs();
  }

  /** This trace as the recent traces keep it, times in µs from `originNs`. */
  keptSpan(originNs: number): KeptSpan {
    const times: KeptSpan["times"] = {};
    for (const t of this.timestamps) times[t.name] = (t.ns - originNs) / 1000;
    const children = this.children.map((c) => c.keptSpan(originNs));
    if (this.remoteSpan) children.push(placeRemoteSpan(this.remoteSpan, times));
    return {
      model: this.model,
      version: this.version,
      times,
      ...(this.ranInBatch !== undefined ? { batchSize: this.ranInBatch } : {}),
      // A step its ensemble saw fail; a request that began and never finished computing.
      failed:
        this.markedFailed ||
        (this.parentId === undefined && times.REQUEST_START !== undefined && times.COMPUTE_END === undefined),
      ...(this.tensors.length > 0 ? { tensors: this.tensors } : {}),
      children,
    };
  }

  /** The whole trace as the recent traces keep it. */
  kept(onDemand: boolean): KeptTrace {
    const origin = this.originNs();
    return {
      id: this.id,
      ...(this.requestId ? { requestId: this.requestId } : {}),
      startedAt: Date.now() - (nowNs() - origin) / 1e6,
      onDemand,
      root: this.keptSpan(origin),
    };
  }

  end(): void {
    if (this.ended || !this.onEnd) return;
    this.ended = true;
    this.onEnd(this);
  }

  /** The trace as the OpenTelemetry export takes it (the last stamp of each name). */
  finished(): FinishedTrace {
    return {
      id: this.id,
      model: this.model,
      version: this.version,
      requestId: this.requestId,
      parentId: this.parentId,
      timestamps: new Map(this.timestamps.map((t) => [t.name, t.ns])),
      children: this.children.map((c) => c.finished()),
    };
  }

  /** Triton's JSON objects for this trace and its children's. */
  entries(): object[] {
    const version = Number(this.version);
    const header = {
      id: this.id,
      model_name: this.model,
      model_version: Number.isInteger(version) ? version : -1,
      ...(this.requestId ? { request_id: this.requestId } : {}),
      ...(this.parentId !== undefined ? { parent_id: this.parentId } : {}),
    };
    // Stamped as each layer learns its times (a batcher's after the run): listed in time order.
    const timestamps = [...this.timestamps].sort((a, b) => a.ns - b.ns);
    return [
      header,
      ...(this.recording.timestamps ? [{ id: this.id, timestamps }] : []),
      ...this.tensors.map(({ activity, tensor }) => ({ id: this.id, activity, tensor })),
      ...this.children.flatMap((c) => c.entries()),
    ];
  }
}

/**
 * One trace file: with a log frequency, every that many traces go to `<path>.<n>`
 * (n from 0); without, every trace is kept and the whole array written to `<path>`
 * on flush (when the trace count runs out, and at shutdown). Writes run one at a time.
 */
class TraceFile {
  private pending: object[] = [];
  private pendingTraces = 0;
  private readonly kept: object[] = [];
  private index = 0;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    private readonly path: string,
    private readonly log?: StageLogger,
  ) {}

  collect(trace: Trace, logFrequency: number): void {
    if (logFrequency === 0) {
      this.kept.push(...trace.entries());
      return;
    }
    this.pending.push(...trace.entries());
    this.pendingTraces++;
    if (this.pendingTraces >= logFrequency) this.writePending();
  }

  flush(): Promise<void> {
    this.writePending();
    if (this.kept.length > 0) this.write(this.path, [...this.kept]);
    return this.writing;
  }

  private writePending(): void {
    if (this.pending.length === 0) return;
    this.write(`${this.path}.${this.index++}`, this.pending);
    this.pending = [];
    this.pendingTraces = 0;
  }

  /**
   * Writes the file whole under a temporary name, then renames it into place: whoever
   * watches for `<file>.<n>` (a collector, a test) never reads one half written.
   */
  private write(path: string, entries: object[]): void {
    const text = JSON.stringify(entries);
    const partial = `${path}.partial`;
    this.writing = this.writing.then(
      () =>
        writeFile(partial, text)
          .then(() => rename(partial, path))
          .catch((err: Error) => this.log?.error({ file: path, err: err.message }, "could not write the trace file")),
      () => undefined,
    );
  }
}

/** Where a Tracer keeps recent traces, and who may ask for traces, read them and widen them. */
export interface TraceKeeping {
  recent: RecentTraces;
  /**
   * The trace settings' access rules (--http-restricted-api / --grpc-restricted-protocol "trace"):
   * with any, a request's on-demand ask is honoured only when it carries one rule's key; without, always.
   */
  restrictions?: { header: string; value: string }[];
  /**
   * The recent traces' routes (GET /v2/traces…) answer only the trace key's holders. Only then
   * are sampled requests (other clients' request ids) and tensors kept in memory: on an open
   * port anyone could read them. Without it only on-demand asks are kept, timestamps only.
   */
  readersKeyed?: boolean;
  /**
   * Every port's trace settings answer only the trace key's holders. Only then may a
   * TraceSetting call turn on trace_level TENSORS: it writes every client's tensors out.
   */
  settingsKeyed?: boolean;
}

/** Why an unkeyed client may not turn on TENSORS, and how the operator lets one. */
const tensorsNeedKey =
  "trace_level TENSORS records every client's tensors: it can be set at run time only when the trace settings need a key on every port (--http-restricted-api trace:<header>=<value> and --grpc-restricted-protocol trace:<header>=<value>), or at start (--trace-config level=TENSORS)";

/** The server's TraceControl. */
export class Tracer implements TraceControl {
  private global: TraceValues;
  private readonly globalSampler: Sampler;
  private readonly models = new Map<string, ModelTracing>();
  private readonly files = new Map<string, TraceFile>();
  private lastId = 0;
  private readonly newId = () => ++this.lastId;

  /**
   * @param startup the settings from the command line: a cleared global setting goes back to its value here.
   * @param otel where traces go in opentelemetry mode (required in that mode).
   */
  constructor(
    private readonly startup: TraceValues,
    private readonly log?: StageLogger,
    private readonly otel?: OtelExport,
    /** Recent traces kept in memory (the page's waterfall); without it none are, and asks are ignored. */
    readonly keeping?: TraceKeeping,
  ) {
    if (startup.mode === "triton" && startup.level.length > 0 && !startup.file) throw invalid(noFile);
    if (startup.mode === "opentelemetry" && !otel) throw new Error("trace mode opentelemetry needs an OtelExport");
    if (startup.mode === "opentelemetry" && startup.level.includes("TENSORS")) {
      throw invalid("trace_level TENSORS writes tensors to trace files: it needs trace mode triton");
    }
    this.global = { ...startup, level: [...startup.level] };
    // The command line's bounds apply to the store the server hands in.
    if (startup.recent) keeping?.recent.setBounds(startup.recent);
    this.globalSampler = { seen: 0, remaining: startup.count };
  }

  private effective(model?: string): TraceValues {
    const own = model === undefined ? undefined : this.models.get(model);
    return own ? { ...this.global, ...own.overrides } : this.global;
  }

  /** The settings in force; trace_count is what remains of it, as Triton reports it. */
  settings(model?: string): TraceSettings {
    const sampler = (model === undefined ? undefined : this.models.get(model)) ?? this.globalSampler;
    return traceSettingsOf({ ...this.effective(model), count: sampler.remaining });
  }

  update(model: string | undefined, changes: Record<string, string[]>): TraceSettings {
    // As Triton (src/http_server.cc, src/grpc/grpc_server.cc): a client must not choose where the
    // server writes; naming trace_file at all, even its current value or null, is refused.
    if ("trace_file" in changes) {
      throw new StageError(
        Code.Unimplemented,
        "",
        "trace file location can not be updated through network protocol: it is set when the server starts (--trace-config triton,file=<path>)",
      );
    }
    if (this.global.mode === "opentelemetry") {
      throw new StageError(
        Code.Unimplemented,
        "",
        "trace settings cannot be changed at run time in trace mode opentelemetry (as in Triton): restart with other --trace-config",
      );
    }
    // Everything is checked before anything changes.
    const set: Partial<TraceValues> = {};
    const cleared: (keyof TraceValues)[] = [];
    for (const [setting, values] of Object.entries(changes)) {
      const field = KEYS[setting as SettingName];
      if (values.length === 0) {
        if (!(setting in KEYS)) parseTraceSetting(setting, values);
        if (field) cleared.push(field);
        continue;
      }
      Object.assign(set, parseTraceSetting(setting, values));
    }
    if (set.level?.includes("TENSORS") && !this.keeping?.settingsKeyed) {
      throw new StageError(Code.PermissionDenied, "", tensorsNeedKey);
    }
    const current = this.effective(model);
    if (set.mode !== undefined && set.mode !== current.mode) {
      throw invalid("trace_mode can only be set when the server starts (--trace-config mode=<mode>)");
    }
    delete set.mode;
    const clearedFields = cleared.filter((f) => f !== "file" && f !== "mode");

    let next: TraceValues;
    let overrides: Partial<TraceValues> | undefined;
    if (model === undefined) {
      next = { ...this.global, ...set };
      for (const f of clearedFields) Object.assign(next, { [f]: this.startup[f] });
    } else {
      overrides = { ...this.models.get(model)?.overrides, ...set };
      for (const f of clearedFields) delete overrides[f];
      next = { ...this.global, ...overrides };
    }
    if (next.level.length > 0 && !next.file) throw invalid(noFileUpdate);

    const countChanged = "count" in set || clearedFields.includes("count");
    if (model === undefined) {
      this.global = next;
      if (countChanged) {
        this.globalSampler.remaining = next.count;
        // Models without a count of their own follow the global one.
        for (const m of this.models.values()) if (m.overrides.count === undefined) m.remaining = next.count;
      }
    } else if (overrides && Object.keys(overrides).length === 0) {
      this.models.delete(model);
    } else if (overrides) {
      const existing = this.models.get(model);
      if (existing) {
        existing.overrides = overrides;
        if (countChanged) existing.remaining = next.count;
      } else {
        this.models.set(model, { overrides, seen: 0, remaining: next.count });
      }
    }
    return this.settings(model);
  }

  begin(
    model: string,
    version: string,
    requestId?: string,
    header?: (name: string) => string | undefined,
  ): RequestTrace | undefined {
    const values = this.effective(model);
    const ask = this.keeping && header ? this.askOf(header) : undefined;
    if (ask) return this.onDemand(model, version, requestId, values, ask);
    if (values.level.length === 0) return undefined;
    const recording = { timestamps: values.level.includes("TIMESTAMPS"), tensors: values.level.includes("TENSORS") };
    // Another client's request is kept for reading only where reading needs the key.
    const recent = this.keeping?.readersKeyed ? this.keeping.recent : undefined;
    const trace = (onEnd: (t: Trace) => void) =>
      new Trace(
        this.newId,
        this.newId(),
        model,
        version,
        requestId,
        undefined,
        recording,
        recent
          ? (t) => {
              recent.keep(t.kept(false));
              onEnd(t);
            }
          : onEnd,
        { kept: recent !== undefined, reply: false },
      );
    const otel = this.otel;
    if (values.mode === "opentelemetry" && otel) {
      // As Triton: a request that carries the caller's context is traced whatever the rate and count.
      const caller = header ? otel.contextFrom(header) : undefined;
      if (caller) return trace((t) => otel.export(t.finished(), caller));
    }
    const sampler: Sampler = this.models.get(model) ?? this.globalSampler;
    if (sampler.remaining === 0 || values.rate === 0) return undefined;
    sampler.seen++;
    if (sampler.seen % values.rate !== 0) return undefined;
    if (sampler.remaining > 0) sampler.remaining--;
    if (values.mode === "opentelemetry" && otel) return trace((t) => otel.export(t.finished()));
    const last = sampler.remaining === 0;
    const file = this.fileFor(values.file);
    return trace((t) => {
      file.collect(t, values.logFrequency);
      // The count is spent: what was collected is written now, not only at shutdown.
      if (last) void file.flush();
    });
  }

  /** The request's on-demand ask ("1" or "reply"), when it makes one the access rules let through. */
  private askOf(header: (name: string) => string | undefined): "1" | "reply" | undefined {
    const ask = header(TRACE_ASK_HEADER);
    if (ask !== "1" && ask !== "reply") return undefined;
    const rules = this.keeping?.restrictions ?? [];
    if (rules.length > 0 && !rules.some((r) => header(r.header) === r.value)) return undefined;
    return ask;
  }

  /**
   * A trace the request asked for: timestamps whatever the level (tensors at level TENSORS, when
   * reading traces needs the key), kept among the recent traces only (not the trace file or the
   * collector, not counted in trace_count).
   */
  private onDemand(
    model: string,
    version: string,
    requestId: string | undefined,
    values: TraceValues,
    ask: "1" | "reply",
  ): RequestTrace {
    const recent = this.keeping!.recent;
    const recording = {
      timestamps: true,
      tensors: values.level.includes("TENSORS") && this.keeping?.readersKeyed === true,
    };
    return new Trace(
      this.newId,
      this.newId(),
      model,
      version,
      requestId,
      undefined,
      recording,
      (t) => recent.keep(t.kept(true)),
      { kept: true, reply: ask === "reply" },
    );
  }

  private fileFor(path: string): TraceFile {
    let file = this.files.get(path);
    if (!file) {
      file = new TraceFile(path, this.log);
      this.files.set(path, file);
    }
    return file;
  }

  /** Writes every trace collected and not yet written, and exports the spans still queued (at shutdown). */
  async flush(): Promise<void> {
    await Promise.all([...this.files.values()].map((f) => f.flush()));
    if (!this.otel) return;
    // A collector that is down must not hold the exit up (the exporter retries for seconds).
    let timer: NodeJS.Timeout | undefined;
    const waited = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), OTEL_SHUTDOWN_WAIT_MS);
    });
    const outcome = await Promise.race([
      this.otel.shutdown().then(
        () => "exported" as const,
        (err: Error) => {
          this.log?.error({ err: err.message }, "could not export the last OpenTelemetry spans");
          return "failed" as const;
        },
      ),
      waited,
    ]);
    clearTimeout(timer);
    if (outcome === "timeout") {
      this.log?.warn(
        { waitedMs: OTEL_SHUTDOWN_WAIT_MS },
        "the OpenTelemetry collector did not take the last spans in time: dropped",
      );
    }
  }
}
