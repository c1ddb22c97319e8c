/**
 * The recent traces a server keeps in memory for the page's waterfall and the trace
 * export (GET /v2/traces…): each traced request's timestamps, for it and every ensemble
 * step (nested ensembles nested), with the batch size each step ran at, and a remote
 * Trellis step's own timestamps stitched in. Bounded both in count and in bytes: the
 * oldest go first. Tensors are kept only at trace level TENSORS.
 */
import type { TraceActivity } from "@trellis/stage/backend";

/** One model's part of a request: a row of the waterfall. Times are µs from the request's first timestamp. */
export interface KeptSpan {
  model: string;
  version: string;
  /** Triton's timestamps that were taken, in µs from the trace's start. */
  times: Partial<Record<TraceActivity, number>>;
  /** Items in the batch its execution ran in. */
  batchSize?: number;
  /** The step began and never finished computing: it failed (or the request was cancelled there). */
  failed: boolean;
  /** Timestamps taken by another Trellis server (a remote step), placed in the middle of its call. */
  remote?: boolean;
  /** Traced tensors (trace level TENSORS): Triton's trace-file form. */
  tensors?: { activity: string; tensor: object }[];
  children: KeptSpan[];
}

/** One request's kept trace. */
export interface KeptTrace {
  id: number;
  requestId?: string;
  /** Wall-clock time of the request's first timestamp (ms since the epoch), for people reading it. */
  startedAt: number;
  /** Traced because the request asked for it (on demand) rather than sampled. */
  onDemand: boolean;
  root: KeptSpan;
}

/** What the page lists: one line per kept trace. */
export interface TraceSummary {
  id: number;
  requestId?: string;
  model: string;
  startedAt: number;
  failed: boolean;
  /** REQUEST_START to REQUEST_END of the request (µs), when both were taken. */
  totalUs?: number;
}

export interface RecentTraceBounds {
  /** Most traces kept. */
  maxCount: number;
  /** Most bytes kept (the traces' JSON). */
  maxBytes: number;
}

export const DEFAULT_RECENT_TRACE_BOUNDS: Readonly<RecentTraceBounds> = { maxCount: 200, maxBytes: 4 * 1024 * 1024 };

function checkedBounds(bounds: RecentTraceBounds): RecentTraceBounds {
  const ok = (n: number) => Number.isSafeInteger(n) && n >= 0;
  if (!ok(bounds.maxCount) || !ok(bounds.maxBytes)) throw new Error("recent trace bounds must be whole numbers >= 0");
  return { maxCount: bounds.maxCount, maxBytes: bounds.maxBytes };
}

interface Entry {
  trace: KeptTrace;
  json: string;
  bytes: number;
}

/** Whether a span or any step under it failed. */
export function anyFailed(span: KeptSpan): boolean {
  return span.failed || span.children.some(anyFailed);
}

/** The newest traces, within their bounds; each kept as the JSON the routes send. */
export class RecentTraces {
  private readonly entries = new Map<number, Entry>();
  private totalBytes = 0;

  private limits: RecentTraceBounds;

  constructor(bounds: RecentTraceBounds = DEFAULT_RECENT_TRACE_BOUNDS) {
    this.limits = checkedBounds(bounds);
  }

  get bounds(): RecentTraceBounds {
    return { ...this.limits };
  }

  /** New bounds; what is kept beyond them goes now, oldest first. */
  setBounds(bounds: RecentTraceBounds): void {
    this.limits = checkedBounds(bounds);
    this.evict();
  }

  get count(): number {
    return this.entries.size;
  }

  /** Bytes of the kept traces' JSON (UTF-8). */
  get bytes(): number {
    return this.totalBytes;
  }

  /** Keeps `trace`, dropping the oldest until both bounds hold; a trace larger than the byte bound alone is not kept. */
  keep(trace: KeptTrace): void {
    const json = JSON.stringify(trace);
    const bytes = Buffer.byteLength(json);
    if (bytes > this.limits.maxBytes || this.limits.maxCount === 0) return;
    this.entries.set(trace.id, { trace, json, bytes });
    this.totalBytes += bytes;
    this.evict();
  }

  private evict(): void {
    for (const [id, oldest] of this.entries) {
      if (this.entries.size <= this.limits.maxCount && this.totalBytes <= this.limits.maxBytes) break;
      this.entries.delete(id);
      this.totalBytes -= oldest.bytes;
    }
  }

  /** The trace as JSON, by its trace id or (the newest with it) its request id. */
  find(key: { id?: number; requestId?: string }): KeptTrace | undefined {
    if (key.id !== undefined) return this.entries.get(key.id)?.trace;
    let found: KeptTrace | undefined;
    for (const { trace } of this.entries.values()) if (trace.requestId === key.requestId) found = trace;
    return found;
  }

  json(id: number): string | undefined {
    return this.entries.get(id)?.json;
  }

  /** Newest first. */
  list(): TraceSummary[] {
    return [...this.entries.values()].reverse().map(({ trace }) => {
      const { REQUEST_START: start, REQUEST_END: end } = trace.root.times;
      return {
        id: trace.id,
        ...(trace.requestId ? { requestId: trace.requestId } : {}),
        model: trace.root.model,
        startedAt: trace.startedAt,
        failed: anyFailed(trace.root),
        ...(start !== undefined && end !== undefined ? { totalUs: end - start } : {}),
      };
    });
  }
}

/** One event of Chrome's trace-event format (the JSON Perfetto UI and chrome://tracing open). */
export interface TraceEvent {
  name: string;
  cat: string;
  ph: "X" | "M";
  ts: number;
  dur: number;
  pid: number;
  tid: number;
  args?: Record<string, unknown>;
}

/**
 * A kept trace as Chrome trace-event JSON: a complete event ("X") for each span's request,
 * queue and compute, one thread per waterfall row (named by a metadata event), the local
 * server as process 1 and remote servers' spans as process 2.
 */
export function chromeTraceOf(trace: KeptTrace): { traceEvents: TraceEvent[]; displayTimeUnit: "ms" } {
  const events: TraceEvent[] = [];
  let row = 0;
  const visit = (span: KeptSpan, depth: number) => {
    const tid = ++row;
    const pid = span.remote ? 2 : 1;
    const label = `${"  ".repeat(depth)}${span.model}${span.remote ? " (remote)" : ""}`;
    events.push({ name: "thread_name", cat: "__metadata", ph: "M", ts: 0, dur: 0, pid, tid, args: { name: label } });
    const args = { model: span.model, version: span.version, failed: span.failed, batch_size: span.batchSize };
    const t = span.times;
    const add = (name: string, cat: string, from?: number, to?: number) => {
      if (from === undefined || to === undefined) return;
      events.push({ name, cat, ph: "X", ts: from, dur: Math.max(0, to - from), pid, tid, args });
    };
    add(span.model, "request", t.REQUEST_START, t.REQUEST_END ?? t.COMPUTE_END);
    add("queue", "queue", t.QUEUE_START, t.COMPUTE_START);
    add("compute", "compute", t.COMPUTE_START, t.COMPUTE_END);
    for (const child of span.children) visit(child, depth + 1);
  };
  visit(trace.root, 0);
  return { traceEvents: events, displayTimeUnit: "ms" };
}

/** Bounds on what a remote step may send back: its reply is another server's, read as untrusted. */
const MAX_REMOTE_REPLY_CHARS = 64 * 1024;
const MAX_REMOTE_SPANS = 64;
const MAX_REMOTE_DEPTH = 8;
const ACTIVITIES = new Set<string>([
  "REQUEST_START",
  "QUEUE_START",
  "COMPUTE_START",
  "COMPUTE_INPUT_END",
  "COMPUTE_OUTPUT_START",
  "COMPUTE_END",
  "REQUEST_END",
  "HTTP_RECV_START",
  "HTTP_RECV_END",
  "HTTP_SEND_START",
  "HTTP_SEND_END",
  "GRPC_WAITREAD_START",
  "GRPC_WAITREAD_END",
  "GRPC_SEND_START",
  "GRPC_SEND_END",
]);

/**
 * A remote step's trace reply (the `trellis_trace` response parameter) as a span, keeping only
 * the fields a span has, within bounds; undefined when it is not one (it is then left out).
 */
export function sanitizeRemoteSpan(reply: string): KeptSpan | undefined {
  if (reply.length > MAX_REMOTE_REPLY_CHARS) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(reply);
  } catch {
    return undefined;
  }
  let spans = 0;
  const read = (value: unknown, depth: number): KeptSpan | undefined => {
    if (typeof value !== "object" || value === null || depth > MAX_REMOTE_DEPTH || ++spans > MAX_REMOTE_SPANS) {
      return undefined;
    }
    const v = value as Record<string, unknown>;
    if (typeof v.model !== "string" || typeof v.times !== "object" || v.times === null) return undefined;
    const times: KeptSpan["times"] = {};
    for (const [name, t] of Object.entries(v.times as Record<string, unknown>)) {
      if (ACTIVITIES.has(name) && typeof t === "number" && Number.isFinite(t)) times[name as TraceActivity] = t;
    }
    const children = Array.isArray(v.children) ? v.children.map((c) => read(c, depth + 1)) : [];
    if (children.some((c) => c === undefined)) return undefined;
    return {
      model: v.model.slice(0, 256),
      version: typeof v.version === "string" ? v.version.slice(0, 32) : "",
      times,
      ...(typeof v.batchSize === "number" && Number.isSafeInteger(v.batchSize) ? { batchSize: v.batchSize } : {}),
      failed: v.failed === true,
      remote: true,
      children: children as KeptSpan[],
    };
  };
  return read(parsed, 0);
}

function shifted(span: KeptSpan, by: number): KeptSpan {
  const times: KeptSpan["times"] = {};
  for (const [name, t] of Object.entries(span.times)) times[name as TraceActivity] = t + by;
  return { ...span, times, remote: true, children: span.children.map((c) => shifted(c, by)) };
}

/**
 * Places a remote step's own span (its times from its own clock's start) within the caller's
 * call to it (`callerTimes`: the caller's compute of that step, or its whole request): the two
 * servers' clocks are not comparable, so the remote's time is centred in the call, and what is
 * left on either side of it is the network (and the two frontends).
 */
export function placeRemoteSpan(remote: KeptSpan, callerTimes: KeptSpan["times"]): KeptSpan {
  const from = callerTimes.COMPUTE_START ?? callerTimes.REQUEST_START ?? 0;
  const to = callerTimes.COMPUTE_END ?? callerTimes.REQUEST_END ?? from;
  const remoteTimes = Object.values(remote.times);
  const remoteStart = remote.times.REQUEST_START ?? Math.min(...remoteTimes, 0);
  const remoteEnd = remote.times.REQUEST_END ?? Math.max(...remoteTimes, remoteStart);
  const network = Math.max(0, to - from - (remoteEnd - remoteStart));
  return shifted(remote, from + network / 2 - remoteStart);
}
