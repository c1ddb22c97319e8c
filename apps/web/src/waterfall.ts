/**
 * One request's waterfall, from the trace the server kept of it (GET /v2/traces/<id>): a row
 * per step (nested ensembles' steps and a remote Trellis step's own span indented under theirs),
 * bars for its queue and compute on one time axis, its batch size, a failed step in red, and
 * a link to the same trace as Chrome trace-event JSON (Perfetto UI opens it).
 */
import { el } from "./dom.js";

/** A step as the server keeps it (apps/server recent-traces.ts): times in µs from the request's first timestamp. */
export interface TraceSpan {
  model: string;
  version: string;
  times: Partial<Record<string, number>>;
  batchSize?: number;
  failed: boolean;
  remote?: boolean;
  children: TraceSpan[];
}

export interface KeptTrace {
  id: number;
  requestId?: string;
  root: TraceSpan;
}

/** One row of the waterfall, with its segments in µs. */
export interface WaterfallRow {
  model: string;
  depth: number;
  remote: boolean;
  failed: boolean;
  batchSize?: number;
  /** REQUEST_START to REQUEST_END (a remote call's whole time, from the caller's side). */
  request?: [number, number];
  queue?: [number, number];
  compute?: [number, number];
}

const span = (t: TraceSpan["times"], from: string, to: string): [number, number] | undefined => {
  const a = t[from];
  const b = t[to];
  return a !== undefined && b !== undefined && b >= a ? [a, b] : undefined;
};

/** The trace's rows, depth first, as the waterfall draws them. */
export function waterfallRows(root: TraceSpan): WaterfallRow[] {
  const rows: WaterfallRow[] = [];
  const visit = (s: TraceSpan, depth: number) => {
    const request = span(s.times, "REQUEST_START", "REQUEST_END");
    const queue = span(s.times, "QUEUE_START", "COMPUTE_START");
    const compute = span(s.times, "COMPUTE_START", "COMPUTE_END");
    rows.push({
      model: s.model,
      depth,
      remote: s.remote === true,
      failed: s.failed,
      ...(s.batchSize !== undefined ? { batchSize: s.batchSize } : {}),
      ...(request ? { request } : {}),
      ...(queue ? { queue } : {}),
      ...(compute ? { compute } : {}),
    });
    for (const c of s.children) visit(c, depth + 1);
  };
  visit(root, 0);
  return rows;
}

/** The kept trace of the request with `requestId`; the server keeps it as the answer goes out, so a few tries. */
export async function fetchTrace(requestId: string): Promise<KeptTrace | undefined> {
  for (let attempt = 0; attempt < 10; attempt++) {
    const list = await fetch(`/v2/traces?request_id=${encodeURIComponent(requestId)}`);
    if (!list.ok) throw new Error(`the server keeps no traces here (HTTP ${list.status})`);
    const found = ((await list.json()) as { traces: { id: number }[] }).traces[0];
    if (found) {
      const res = await fetch(`/v2/traces/${found.id}`);
      if (res.ok) return (await res.json()) as KeptTrace;
    }
    await new Promise((r) => setTimeout(r, 100 * (attempt + 1)));
  }
  return undefined;
}

const ms = (us: number) => `${(us / 1000).toFixed(2)} ms`;

/** The waterfall of `trace` as a figure: a row per step, bars on one axis, and the export link. */
export function renderWaterfall(trace: KeptTrace): HTMLElement {
  const rows = waterfallRows(trace.root);
  const ends = rows.flatMap((r) => [r.request, r.queue, r.compute].flatMap((s) => (s ? [s[0], s[1]] : [])));
  const start = Math.min(...ends, 0);
  const width = Math.max(1, Math.max(...ends, 1) - start);
  const bar = (cls: string, s: [number, number] | undefined, title: string) => {
    if (!s) return [];
    const b = el("span", { class: `seg ${cls}`, title: `${title}: ${ms(s[1] - s[0])}`, "data-segment": cls });
    b.style.left = `${((s[0] - start) / width) * 100}%`;
    b.style.width = `${Math.max(0.3, ((s[1] - s[0]) / width) * 100)}%`;
    return [b];
  };
  const table = el(
    "table",
    { class: "waterfall", "data-trace": String(trace.id) },
    el("caption", {}, `This request, step by step (trace ${trace.id}; total ${ms(width)})`),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "Step"),
        el("th", { scope: "col" }, "Batch"),
        el("th", { scope: "col" }, "Queue"),
        el("th", { scope: "col" }, "Compute"),
        el("th", { scope: "col", class: "axis" }, `0 – ${ms(width)}`),
      ),
    ),
    el(
      "tbody",
      {},
      ...rows.map((r) => {
        const label = `${r.model}${r.remote ? " (remote)" : ""}`;
        // Line-break chances after underscores: model names are long and the axis needs the width.
        const parts = label.split(/(?<=_)/).flatMap((p, i) => (i === 0 ? [p] : [document.createElement("wbr"), p]));
        const name = el("th", { scope: "row" }, ...parts);
        name.style.paddingLeft = `${0.3 + r.depth * 0.9}rem`;
        const dur = (s?: [number, number]) => (s ? String(s[1] - s[0]) : undefined);
        return el(
          "tr",
          {
            "data-step": r.model,
            "data-depth": String(r.depth),
            "data-failed": String(r.failed),
            "data-remote": String(r.remote),
            "data-request-us": dur(r.request),
            "data-queue-us": dur(r.queue),
            "data-compute-us": dur(r.compute),
            class: r.failed ? "failed" : undefined,
          },
          name,
          el("td", { "data-field": "batch" }, r.batchSize !== undefined ? String(r.batchSize) : "–"),
          el("td", { "data-field": "queue" }, r.queue ? ms(r.queue[1] - r.queue[0]) : "–"),
          el("td", { "data-field": "compute" }, r.compute ? ms(r.compute[1] - r.compute[0]) : "–"),
          el(
            "td",
            { class: "track" },
            ...bar("request", r.request, r.remote ? "remote request" : "request"),
            ...bar("queue", r.queue, "queue"),
            ...bar("compute", r.compute, "compute"),
          ),
        );
      }),
    ),
  );
  const download = el(
    "a",
    { href: `/v2/traces/${trace.id}/chrome`, download: `trellis-trace-${trace.id}.json`, class: "export" },
    "Download for Perfetto (Chrome trace JSON)",
  );
  return el(
    "figure",
    { class: "waterfall-figure" },
    el("div", { class: "scroll" }, table),
    el(
      "figcaption",
      {},
      el("span", { class: "key queue" }, "queue"),
      " ",
      el("span", { class: "key compute" }, "compute"),
      " ",
      el("span", { class: "key request" }, "request (a remote step: the whole call)"),
      " · ",
      download,
    ),
  );
}
