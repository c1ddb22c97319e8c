/**
 * The page: pick, drop or paste images; each is sent to the chosen model and
 * shown with its top-5 and what each step took (from the server's per-model
 * statistics before and after its request); beside it, the models live.
 */
import "./style.css";
import { el } from "./dom.js";
import {
  type Classifier,
  classifiers,
  classify,
  type IndexRow,
  repositoryIndex,
  type Stats,
  statistics,
  stepTimes,
} from "./server.js";
import { fetchTrace, renderWaterfall } from "./waterfall.js";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const modelSelect = $<HTMLSelectElement>("model");
const fileInput = $<HTMLInputElement>("files");
const drop = $<HTMLDivElement>("drop");
const results = $<HTMLUListElement>("results");
const status = $<HTMLParagraphElement>("status");
const modelsBody = $<HTMLTableElement>("models").tBodies[0]!;

let models: Classifier[] = [];
/** The ready models whose configs were read (a new one appearing reads them again). */
let seen = new Set<string>();
const chosen = () => models.find((m) => m.name === modelSelect.value);

async function loadModels(): Promise<void> {
  const index = await repositoryIndex();
  seen = new Set(index.filter((r) => r.state === "READY").map((r) => r.name));
  models = await classifiers([...seen]);
  const before = modelSelect.value;
  modelSelect.replaceChildren(...models.map((m) => el("option", { value: m.name }, m.name)));
  if (models.some((m) => m.name === before)) modelSelect.value = before;
  status.textContent = models.length > 0 ? "" : "No ready model takes an encoded image (one BYTES input).";
}

// ---- results: one card per image, answered one after another so each step's statistics delta is its own

let queue: Promise<void> = Promise.resolve();

function addFiles(files: Iterable<File>): void {
  for (const file of files) {
    const model = chosen();
    const url = URL.createObjectURL(file);
    const card = el(
      "li",
      { class: "card", "data-file": file.name, "data-state": "pending", "aria-busy": "true" },
      el("img", { src: url, alt: file.name }),
    );
    // A file the browser cannot show still goes to the server (which says what is wrong with it).
    card.querySelector("img")?.addEventListener("error", (e) => {
      (e.target as HTMLElement).replaceWith(el("div", { class: "noimg" }, "no preview"));
    });
    const body = el("div", {}, el("h3", {}, file.name), el("p", { class: "pending" }, "Waiting…"));
    card.append(body);
    results.prepend(card);
    queue = queue.then(() => run(model, file, card, body)).catch(() => {});
  }
}

async function run(model: Classifier | undefined, file: File, card: HTMLElement, body: HTMLElement): Promise<void> {
  const finish = (state: string, ...content: Node[]) => {
    body.replaceChildren(body.firstChild!, ...content);
    card.setAttribute("data-state", state);
    card.removeAttribute("aria-busy");
  };
  if (!model) return finish("error", el("p", { class: "error", role: "alert" }, "No model to send it to."));
  const bytes = new Uint8Array(await file.arrayBuffer());
  let before: Stats;
  try {
    before = await statistics();
  } catch {
    before = new Map();
  }
  const answer = await classify(model, bytes);
  if ("error" in answer) {
    return finish(
      "error",
      el("p", { class: "error", role: "alert", "data-code": answer.code }, answer.error),
      waterfallToggle(answer.requestId, card),
    );
  }
  const after = await statistics().catch(() => new Map() as Stats);
  const probabilities = answer.labels.every(({ prob }) => prob >= 0 && prob <= 1);
  const top = Math.max(...answer.labels.map(({ prob }) => prob));
  const top5 = el(
    "ol",
    { class: "top5", "aria-label": `Top ${answer.labels.length} for ${file.name}` },
    ...answer.labels.map(({ label, prob }) => {
      // Probabilities as percentages; other scores (a classification of raw logits) as they are, bars relative.
      const pct = probabilities ? `${(prob * 100).toFixed(1)}%` : prob.toFixed(2);
      const share = probabilities ? prob : top > 0 ? prob / top : 0;
      const bar = el("span", { class: "bar", "aria-hidden": "true" });
      bar.style.width = `${Math.max(0, Math.min(100, share * 100))}%`;
      return el("li", {}, bar, el("span", { class: "label" }, label), el("span", { class: "prob" }, pct));
    }),
  );
  const times = stepTimes(model.steps, before, after);
  const shared = Math.max(...times.map((t) => t.requests));
  const ms = (x: number) => `${x.toFixed(1)} ms`;
  const steps = el(
    "table",
    { class: "steps" },
    el(
      "caption",
      {},
      shared > 1
        ? `Time per step (server statistics; ${shared} requests ran meanwhile: averages)`
        : "Time per step (server statistics)",
    ),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "Step"),
        el("th", { scope: "col" }, "Total"),
        el("th", { scope: "col" }, "Queue"),
        el("th", { scope: "col" }, "Compute"),
      ),
    ),
    el(
      "tbody",
      {},
      ...times.map((t) =>
        el(
          "tr",
          { "data-step": t.model },
          el("th", { scope: "row" }, t.model),
          el("td", { "data-field": "total" }, t.requests > 0 ? ms(t.totalMs) : "–"),
          el("td", { "data-field": "queue" }, t.requests > 0 ? ms(t.queueMs) : "–"),
          el("td", { "data-field": "compute" }, t.requests > 0 ? ms(t.computeMs) : "–"),
        ),
      ),
    ),
  );
  finish("done", top5, steps, waterfallToggle(answer.requestId, card));
}

/**
 * A button that opens (and closes) the request's waterfall, fetched from the server's recent
 * traces, across the whole width of its card.
 */
function waterfallToggle(requestId: string, card: HTMLElement): HTMLElement {
  const button = el("button", { type: "button", class: "open-waterfall", "aria-expanded": "false" }, "Waterfall");
  const panel = el("div", { class: "waterfall-panel", hidden: "" });
  button.addEventListener("click", async () => {
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", String(open));
    panel.hidden = !open;
    if (!open || panel.childElementCount > 0) return;
    panel.append(el("p", { class: "pending" }, "Loading the trace…"));
    try {
      const trace = await fetchTrace(requestId);
      panel.replaceChildren(
        trace
          ? renderWaterfall(trace)
          : el("p", { class: "error" }, "The server no longer keeps this request's trace."),
      );
    } catch (err) {
      panel.replaceChildren(el("p", { class: "error" }, (err as Error).message));
    }
  });
  card.append(panel);
  return el("div", { class: "waterfall-block" }, button);
}

$<HTMLButtonElement>("pick").addEventListener("click", () => fileInput.click());
fileInput.addEventListener("change", () => {
  if (fileInput.files) addFiles(fileInput.files);
  fileInput.value = "";
});
drop.addEventListener("dragover", (e) => {
  e.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer?.files) addFiles(e.dataTransfer.files);
});
document.addEventListener("paste", (e) => {
  const files = e.clipboardData?.files;
  if (files && files.length > 0) {
    e.preventDefault();
    addFiles(files);
  }
});

// ---- the live panel

let last: { at: number; stats: Stats } | undefined;

/** A model name with line-break chances after its underscores (narrow screens). */
const breakable = (name: string): (Node | string)[] =>
  name.split(/(?<=_)/).flatMap((part, i) => (i === 0 ? [part] : [document.createElement("wbr"), part]));

function renderLive(index: IndexRow[], stats: Stats): void {
  const now = performance.now();
  const names = [...new Set([...index.map((r) => r.name), ...stats.keys()])].sort();
  modelsBody.replaceChildren(
    ...names.map((name) => {
      const rows = index.filter((r) => r.name === name);
      const s = stats.get(name);
      const p = last?.stats.get(name);
      const requests = s ? s.success + s.fail : 0;
      const dt = last ? (now - last.at) / 1000 : 0;
      const newRequests = p && s ? requests - (p.success + p.fail) : 0;
      const newSuccess = p && s ? s.success - p.success : 0;
      const latency =
        newSuccess > 0 && s && p
          ? (s.successNs - p.successNs) / newSuccess / 1e6
          : s && s.success > 0
            ? s.successNs / s.success / 1e6
            : undefined;
      const state = rows.map((r) => r.state).join(", ") || "–";
      const reason = rows.map((r) => r.reason).find((r) => r) ?? "";
      return el(
        "tr",
        { "data-model": name },
        el("th", { scope: "row" }, ...breakable(name)),
        el("td", { "data-field": "version" }, s?.version || rows.map((r) => r.version).join(", ") || "–"),
        el("td", { "data-field": "state", title: reason }, state),
        el("td", { "data-field": "requests" }, String(requests)),
        el("td", { "data-field": "rate" }, dt > 0 ? (newRequests / dt).toFixed(1) : "–"),
        el("td", { "data-field": "latency" }, latency === undefined ? "–" : `${latency.toFixed(1)} ms`),
      );
    }),
  );
  last = { at: now, stats };
}

async function refresh(): Promise<void> {
  try {
    const [index, stats] = await Promise.all([repositoryIndex(), statistics()]);
    renderLive(index, stats);
    const ready = index.filter((r) => r.state === "READY").map((r) => r.name);
    if (ready.length !== seen.size || ready.some((n) => !seen.has(n))) await loadModels();
    $<HTMLParagraphElement>("server").textContent = `${location.host}`;
  } catch (err) {
    $<HTMLParagraphElement>("server").textContent = `${location.host}: not answering (${(err as Error).message})`;
  }
}

let timer: number | undefined;
function poll(): void {
  window.clearTimeout(timer);
  if (document.hidden) return;
  refresh().finally(() => {
    timer = window.setTimeout(poll, 1000);
  });
}
document.addEventListener("visibilitychange", poll);
poll();

// The last `pnpm analyze` report, when the served repository has one (the server serves only that fixed file).
fetch("./analysis.html", { method: "HEAD" }).then(
  (res) => {
    $<HTMLAnchorElement>("analysis").hidden = !res.ok;
  },
  () => {},
);
