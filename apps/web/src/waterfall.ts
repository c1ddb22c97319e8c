/**
 * One request's waterfall, from the trace the server kept of it (GET /v2/traces/<id>): a row
 * per step (nested ensembles' steps and a remote Trellis step's own span indented under theirs),
 * bars for its queue and compute on one time axis, its batch size, a failed step in red, and
 * a link to the same trace as Chrome trace-event JSON (Perfetto UI opens it).
 */

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

function node<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | undefined>,
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

/** The waterfall of `trace` as a figure: a row per step, bars on one axis, and the export link. */
export function renderWaterfall(trace: KeptTrace): HTMLElement {
  const rows = waterfallRows(trace.root);
  const ends = rows.flatMap((r) => [r.request, r.queue, r.compute].flatMap((s) => (s ? [s[0], s[1]] : [])));
  const start = Math.min(...ends, 0);
  const width = Math.max(1, Math.max(...ends, 1) - start);
  const bar = (cls: string, s: [number, number] | undefined, title: string) => {
    if (!s) return [];
    const b = node("span", { class: `seg ${cls}`, title: `${title}: ${ms(s[1] - s[0])}`, "data-segment": cls });
    b.style.left = `${((s[0] - start) / width) * 100}%`;
    b.style.width = `${Math.max(0.3, ((s[1] - s[0]) / width) * 100)}%`;
    return [b];
  };
  const table = node(
    "table",
    { class: "waterfall", "data-trace": String(trace.id) },
    node("caption", {}, `This request, step by step (trace ${trace.id}; total ${ms(width)})`),
    node(
      "thead",
      {},
      node(
        "tr",
        {},
        node("th", { scope: "col" }, "Step"),
        node("th", { scope: "col" }, "Batch"),
        node("th", { scope: "col" }, "Queue"),
        node("th", { scope: "col" }, "Compute"),
        node("th", { scope: "col", class: "axis" }, `0 – ${ms(width)}`),
      ),
    ),
    node(
      "tbody",
      {},
      ...rows.map((r) => {
        const label = `${r.model}${r.remote ? " (remote)" : ""}`;
        // Line-break chances after underscores: model names are long and the axis needs the width.
        const parts = label.split(/(?<=_)/).flatMap((p, i) => (i === 0 ? [p] : [document.createElement("wbr"), p]));
        const name = node("th", { scope: "row" }, ...parts);
        name.style.paddingLeft = `${0.3 + r.depth * 0.9}rem`;
        const dur = (s?: [number, number]) => (s ? String(s[1] - s[0]) : undefined);
        return node(
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
          node("td", { "data-field": "batch" }, r.batchSize !== undefined ? String(r.batchSize) : "–"),
          node("td", { "data-field": "queue" }, r.queue ? ms(r.queue[1] - r.queue[0]) : "–"),
          node("td", { "data-field": "compute" }, r.compute ? ms(r.compute[1] - r.compute[0]) : "–"),
          node(
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
  const download = node(
    "a",
    { href: `/v2/traces/${trace.id}/chrome`, download: `trellis-trace-${trace.id}.json`, class: "export" },
    "Download for Perfetto (Chrome trace JSON)",
  );
  return node(
    "figure",
    { class: "waterfall-figure" },
    node("div", { class: "scroll" }, table),
    node(
      "figcaption",
      {},
      node("span", { class: "key queue" }, "queue"),
      " ",
      node("span", { class: "key compute" }, "compute"),
      " ",
      node("span", { class: "key request" }, "request (a remote step: the whole call)"),
      " · ",
      download,
    ),
  );
}
