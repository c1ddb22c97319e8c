/**
 * A summary of a trace file (ours, or Triton's: the same JSON), as Triton's
 * trace_summary.py gives, with medians beside the means: per model and protocol,
 * where a request's time went (receive, handler, queue, compute, send), and for
 * an ensemble, each step's part and the time between and around the steps.
 */

interface Stamped {
  id: number;
  model: string;
  parentId?: number;
  at: Map<string, number>;
}

/** Traces by id from the file's objects (headers and timestamp lists, in any order, split or not). */
export function readTraces(entries: unknown[]): Stamped[] {
  const byId = new Map<number, Stamped>();
  const of = (id: number) => {
    let t = byId.get(id);
    if (!t) {
      t = { id, model: "", at: new Map() };
      byId.set(id, t);
    }
    return t;
  };
  for (const e of entries as Record<string, unknown>[]) {
    if (typeof e?.id !== "number") continue;
    const t = of(e.id);
    if (typeof e.model_name === "string") t.model = e.model_name;
    if (typeof e.parent_id === "number") t.parentId = e.parent_id;
    if (Array.isArray(e.timestamps)) {
      for (const s of e.timestamps as { name: string; ns: number }[]) t.at.set(s.name, s.ns);
    }
  }
  return [...byId.values()];
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
};
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** The span from `from` to `to` in µs, when both were stamped. */
const span = (t: Stamped, from: string, to: string): number | undefined => {
  const a = t.at.get(from);
  const b = t.at.get(to);
  return a === undefined || b === undefined ? undefined : (b - a) / 1000;
};

/** Total length (µs) of the union of [start, end] intervals (ns). */
function covered(intervals: [number, number][]): number {
  const sorted = [...intervals].sort((a, b) => a[0] - b[0]);
  let total = 0;
  let [curStart, curEnd] = sorted[0] ?? [0, 0];
  for (const [s, e] of sorted.slice(1)) {
    if (s > curEnd) {
      total += curEnd - curStart;
      [curStart, curEnd] = [s, e];
    } else curEnd = Math.max(curEnd, e);
  }
  return (total + curEnd - curStart) / 1000;
}

const PROTOCOLS = [
  { name: "HTTP", start: "HTTP_RECV_START", read: "HTTP_RECV_END", send: "HTTP_SEND_START", end: "HTTP_SEND_END" },
  {
    name: "gRPC",
    start: "GRPC_WAITREAD_START",
    read: "GRPC_WAITREAD_END",
    send: "GRPC_SEND_START",
    end: "GRPC_SEND_END",
  },
] as const;

/** A stage's execution spans: indent, label, from, to. */
const EXECUTION: [number, string, string, string][] = [
  [0, "queue", "QUEUE_START", "COMPUTE_START"],
  [0, "compute", "COMPUTE_START", "COMPUTE_END"],
  [1, "input", "COMPUTE_START", "COMPUTE_INPUT_END"],
  [1, "infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"],
  [1, "output", "COMPUTE_OUTPUT_START", "COMPUTE_END"],
];

/** The summary as text, one group (model, protocol) after another. */
export function summarizeTraces(entries: unknown[]): string {
  const traces = readTraces(entries);
  const children = new Map<number, Stamped[]>();
  for (const t of traces) {
    if (t.parentId !== undefined) children.set(t.parentId, [...(children.get(t.parentId) ?? []), t]);
  }
  const groups = new Map<string, Stamped[]>();
  for (const t of traces) {
    if (t.parentId !== undefined) continue;
    const protocol = PROTOCOLS.find((p) => t.at.has(p.start))?.name ?? "no frontend timestamps";
    const key = `${t.model}, ${protocol}`;
    groups.set(key, [...(groups.get(key) ?? []), t]);
  }

  const lines: string[] = [];
  const row = (depth: number, label: string, values: (number | undefined)[]) => {
    const xs = values.filter((v): v is number => v !== undefined);
    if (xs.length === 0) return;
    const figures = `${median(xs).toFixed(0).padStart(8)} ${mean(xs).toFixed(0).padStart(8)}`;
    const name = `${"  ".repeat(depth)}${label}`;
    lines.push(`${name.padEnd(52)}${figures}`);
  };
  const spanRow = (depth: number, label: string, ts: Stamped[], from: string, to: string) =>
    row(
      depth,
      label,
      ts.map((t) => span(t, from, to)),
    );
  const execution = (depth: number, ts: Stamped[]) => {
    for (const [indent, label, from, to] of EXECUTION) spanRow(depth + indent, label, ts, from, to);
  };

  for (const [key, ts] of groups) {
    const protocol = PROTOCOLS.find((p) => ts[0]!.at.has(p.start));
    const title = `${key}: ${ts.length} traces`;
    lines.push(`${title.padEnd(52)}  median     mean (µs)`);
    if (protocol) {
      spanRow(1, "request (received to sent)", ts, protocol.start, protocol.end);
      spanRow(2, protocol.name === "HTTP" ? "receive" : "wait/read", ts, protocol.start, protocol.read);
      spanRow(2, "frontend, before the handler", ts, protocol.read, "REQUEST_START");
    }
    spanRow(2, "handler", ts, "REQUEST_START", "REQUEST_END");
    spanRow(3, "before the queue", ts, "REQUEST_START", "QUEUE_START");
    execution(3, ts);
    const steps = ts.map((t) => children.get(t.id) ?? []);
    if (steps.some((s) => s.length > 0)) {
      // Steps in the order they start (their median start within the ensemble).
      const models = [...new Set(steps.flat().map((c) => c.model))];
      const startOf = (model: string) =>
        median(
          ts.flatMap((t, i) => {
            const c = steps[i]!.find((x) => x.model === model);
            const a = c?.at.get("REQUEST_START");
            const b = t.at.get("REQUEST_START");
            return a === undefined || b === undefined ? [] : [a - b];
          }),
        );
      models.sort((a, b) => startOf(a) - startOf(b));
      for (const model of models) {
        const own = steps.flatMap((s) => s.filter((c) => c.model === model));
        spanRow(4, `step ${model}`, own, "REQUEST_START", "REQUEST_END");
        execution(5, own);
      }
      row(
        4,
        "the ensemble's own (outside steps)",
        ts.map((t, i) => {
          const compute = span(t, "COMPUTE_START", "COMPUTE_END");
          const spans = steps[i]!.flatMap((c) => {
            const a = c.at.get("REQUEST_START");
            const b = c.at.get("REQUEST_END");
            return a === undefined || b === undefined ? [] : [[a, b] as [number, number]];
          });
          return compute === undefined || spans.length === 0 ? undefined : compute - covered(spans);
        }),
      );
    }
    spanRow(3, "after the response", ts, "COMPUTE_END", "REQUEST_END");
    if (protocol) {
      spanRow(2, "frontend, after the handler", ts, "REQUEST_END", protocol.send);
      spanRow(2, "send", ts, protocol.send, protocol.end);
    }
    lines.push("");
  }
  return lines.join("\n");
}
