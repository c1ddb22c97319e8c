/**
 * The report: one self-contained HTML page (no script, no external file: an inline SVG chart
 * and inline styles) with throughput against p99, one curve per candidate swept, the budget
 * line and the winner marked, then the tables behind it: the final rounds and every sweep.
 */
import type { AnalyzeResult } from "./result.js";
import type { Finalist } from "./rounds.js";
import { describeSettings } from "./space.js";

const escapeHtml = (s: string) =>
  s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);

const PALETTE = [
  "#1f77b4",
  "#ff7f0e",
  "#2ca02c",
  "#d62728",
  "#9467bd",
  "#8c564b",
  "#e377c2",
  "#7f7f7f",
  "#bcbd22",
  "#17becf",
];

/** "Nice" axis ticks from 0 to at least `max`. */
function ticks(max: number): number[] {
  const raw = Math.max(max, 1e-9) / 5;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) ?? raw;
  return Array.from({ length: Math.ceil(max / step) + 1 }, (_, i) => i * step);
}

/** The chart: x = p99 latency (ms), y = throughput (inferences/s). */
function chart(result: AnalyzeResult): string {
  const [width, height, left, bottom, top, right] = [860, 420, 64, 48, 16, 200];
  const points = result.trials.flatMap((t) => t.sweep.points);
  const roundPoints = result.finalists.flatMap((f) => f.rounds);
  const xTicks = ticks(
    Math.max(result.budgetMs * 1.15, ...points.map((p) => p.p99Ms), ...roundPoints.map((r) => r.p99Ms)),
  );
  const yTicks = ticks(Math.max(...points.map((p) => p.throughput), ...roundPoints.map((r) => r.throughput)));
  const [xMax, yMax] = [xTicks.at(-1)!, yTicks.at(-1)!];
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const x = (ms: number) => left + (ms / xMax) * plotW;
  const y = (v: number) => top + plotH - (v / yMax) * plotH;
  const parts: string[] = [];
  for (const t of xTicks) {
    parts.push(`<line x1="${x(t)}" y1="${top}" x2="${x(t)}" y2="${top + plotH}" stroke="#eee"/>`);
    parts.push(`<text x="${x(t)}" y="${top + plotH + 16}" text-anchor="middle">${+t.toFixed(3)}</text>`);
  }
  for (const t of yTicks) {
    parts.push(`<line x1="${left}" y1="${y(t)}" x2="${left + plotW}" y2="${y(t)}" stroke="#eee"/>`);
    parts.push(`<text x="${left - 6}" y="${y(t) + 4}" text-anchor="end">${+t.toFixed(3)}</text>`);
  }
  parts.push(
    `<rect x="${left}" y="${top}" width="${plotW}" height="${plotH}" fill="none" stroke="#999"/>`,
    `<text x="${left + plotW / 2}" y="${height - 8}" text-anchor="middle">p99 latency (ms)</text>`,
    `<text transform="translate(14 ${top + plotH / 2}) rotate(-90)" text-anchor="middle">throughput (inferences/s)</text>`,
    `<line x1="${x(result.budgetMs)}" y1="${top}" x2="${x(result.budgetMs)}" y2="${top + plotH}" stroke="#c00" stroke-dasharray="6 4" stroke-width="2"/>`,
    `<text x="${x(result.budgetMs) + 4}" y="${top + 12}" fill="#c00">budget ${result.budgetMs} ms</text>`,
  );
  result.trials.forEach((trial, i) => {
    const color = PALETTE[i % PALETTE.length]!;
    const isWinner = trial === result.winner.trial;
    const coords = trial.sweep.points.map((p) => `${x(p.p99Ms).toFixed(1)},${y(p.throughput).toFixed(1)}`);
    const strokeWidth = isWinner ? 3.5 : trial.id === "baseline" ? 2.5 : 1.2;
    const dash = trial.id === "baseline" ? ' stroke-dasharray="8 3"' : "";
    parts.push(
      `<polyline points="${coords.join(" ")}" fill="none" stroke="${color}" stroke-width="${strokeWidth}"${dash}/>`,
    );
    for (const p of trial.sweep.points) {
      parts.push(
        `<circle cx="${x(p.p99Ms)}" cy="${y(p.throughput)}" r="${isWinner ? 4 : 2.5}" fill="${color}"><title>${trial.id} c${p.concurrency}: ${p.throughput.toFixed(1)}/s, p99 ${p.p99Ms.toFixed(1)} ms</title></circle>`,
      );
    }
    const legendY = top + 14 + i * 16;
    if (legendY < height - 20) {
      const label = `${trial.id}${isWinner ? " ★ winner" : ""}${trial.id === "baseline" ? " (shipped)" : ""}`;
      parts.push(
        `<line x1="${left + plotW + 12}" y1="${legendY - 4}" x2="${left + plotW + 32}" y2="${legendY - 4}" stroke="${color}" stroke-width="${strokeWidth}"${dash}/>`,
      );
      parts.push(`<text x="${left + plotW + 38}" y="${legendY}">${escapeHtml(label)}</text>`);
    }
  });
  // The finalists' round measurements: hollow squares in their curve's colour.
  for (const f of result.finalists) {
    const color = PALETTE[result.trials.indexOf(f.trial) % PALETTE.length]!;
    for (const [k, r] of f.rounds.entries()) {
      parts.push(
        `<rect x="${x(r.p99Ms) - 4}" y="${y(r.throughput) - 4}" width="8" height="8" fill="#fff" stroke="${color}" stroke-width="1.5"><title>${f.trial.id} round ${k + 1}: ${r.throughput.toFixed(1)}/s, p99 ${r.p99Ms.toFixed(1)} ms</title></rect>`,
      );
    }
  }
  const w = result.winner;
  parts.push(
    `<text x="${x(w.p99Ms.median)}" y="${y(w.throughput.median) + 7}" text-anchor="middle" font-size="22" fill="#000" stroke="#fff" stroke-width="0.8">★</text>`,
  );
  return `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" font-family="sans-serif" font-size="11">${parts.join("")}</svg>`;
}

const num = (v: number, digits = 1) => v.toFixed(digits);
const range = (s: { median: number; min: number; max: number }) =>
  `${num(s.median)} <small>(${num(s.min)}–${num(s.max)})</small>`;

function roundsTable(result: AnalyzeResult): string {
  const rows = result.finalists.map((f: Finalist) => {
    const cells = f.rounds.map((r) => `<td>${num(r.throughput)}/s<br><small>p99 ${num(r.p99Ms)} ms</small></td>`);
    const mark = f === result.winner ? " ★" : "";
    return `<tr${f === result.winner ? ' class="win"' : ""}><th>${escapeHtml(f.trial.id)}${mark}</th><td>${escapeHtml(f.trial.change || "shipped config")}</td><td>${f.concurrency}</td>${cells.join("")}<td>${range(f.throughput)}</td><td>${range(f.p99Ms)}</td></tr>`;
  });
  const heads = result.finalists[0]?.rounds.map((_, i) => `<th>round ${i + 1}</th>`).join("") ?? "";
  return `<table><tr><th>finalist</th><th>change from shipped</th><th>concurrency</th>${heads}<th>throughput median (spread)</th><th>p99 ms median (spread)</th></tr>${rows.join("")}</table>`;
}

function trialsTable(result: AnalyzeResult): string {
  const rows = result.trials.map((t) => {
    const points = t.sweep.points
      .map((p) => `c${p.concurrency}: ${num(p.throughput)}/s, p99 ${num(p.p99Ms)} ms`)
      .join("<br>");
    const measured = t.failed ? `failed to start: ${escapeHtml(t.failed)}` : points;
    return `<tr${t === result.winner.trial ? ' class="win"' : ""}><th>${escapeHtml(t.id)}</th><td>${escapeHtml(t.change || "shipped config")}</td><td>${measured}</td><td>${t.sweep.end}</td><td>${num(t.sweep.score)}</td></tr>`;
  });
  return `<table><tr><th>candidate</th><th>change from shipped</th><th>sweep (throughput, p99)</th><th>sweep ended</th><th>best within budget (/s)</th></tr>${rows.join("")}</table>`;
}

function settingsList(result: AnalyzeResult): string {
  const items = Object.entries(result.winner.trial.candidate).map(
    ([step, s]) =>
      `<li><b>${escapeHtml(step)}</b>: ${escapeHtml(describeSettings(s))} <small>(shipped: ${escapeHtml(describeSettings(result.shipped[step]!))})</small></li>`,
  );
  return `<ul>${items.join("")}</ul>`;
}

/** The verdict as one sentence, with its figures (medians over the final rounds). */
export function verdictLine(result: AnalyzeResult): string {
  const v = result.verdict;
  const f = (id: string) => result.finalists.find((x) => x.trial.id === id)!;
  const figures = (x: Finalist) => `${num(x.throughput.median)}/s at p99 ${num(x.p99Ms.median)} ms`;
  const baseline = f("baseline");
  const rounds = `medians of ${result.settings.rounds} interleaved rounds`;
  if (v.kind === "nothing met the budget") {
    return `Nothing met the p99 budget of ${result.budgetMs} ms, the shipped config included (${figures(baseline)}); the best finalist, ${v.best} (${figures(f(v.best))}), meets a budget of ${v.smallestBudgetMs} ms. Nothing changed.`;
  }
  if (v.kind === "no significant difference") {
    const best =
      v.best === "baseline"
        ? "No candidate did better than the shipped config"
        : `The best finalist, ${v.best} (${figures(f(v.best))}), is ${v.ratio.toFixed(2)}× the shipped config (${figures(baseline)}), within the spread between rounds (${(v.spread * 100).toFixed(0)}%)`;
    return `No significant difference within the p99 budget of ${result.budgetMs} ms: ${best}; ${rounds}. Nothing changed.`;
  }
  const w = f(v.finalist);
  const shipped = v.baselineWithinBudget
    ? `the shipped config's ${figures(baseline)}`
    : `the shipped config, over the budget at ${figures(baseline)}`;
  return `Winner ${v.finalist}: ${figures(w)}, ${v.ratio.toFixed(2)}× ${shipped}, within the p99 budget of ${result.budgetMs} ms; ${rounds}.`;
}

export function renderReport(result: AnalyzeResult): string {
  const s = result.settings;
  const m = result.machine;
  const verdict = escapeHtml(verdictLine(result));
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>trellis analyze: ${escapeHtml(result.ensemble)}</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 24px;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
tr.win{background:#fff6d5}small{color:#666}code{background:#f3f3f3;padding:1px 4px}
</style></head><body>
<h1>Model analysis: <code>${escapeHtml(result.ensemble)}</code></h1>
<p><b>${verdict}</b></p>
<p>Measured on ${escapeHtml(m.cpu)}, ${m.cores} cores, ${m.vnni ? "with" : "without"} AVX-512 VNNI (int8 speed depends on it). Reproduce: <code>${escapeHtml(result.command)}</code></p>
<p>p99 budget ${result.budgetMs} ms; ${s.cores} cores; concurrencies ${s.concurrencies.join(", ")}; search windows ${s.windowMs} ms, rounds ${s.roundWindowMs} ms, each after ${s.warmupMs} ms warm-up; ${s.quick ? "quick mode" : "full search"}. Tuned copy of the repository: <code>${escapeHtml(result.output)}</code> (rewritten: ${escapeHtml(result.rewritten.join(", ") || "none")}).</p>
<h2>Chosen settings</h2>${settingsList(result)}
<h2>Throughput against p99, per candidate</h2>
<p><small>One curve per candidate (points: concurrencies, in order); dashed red: the budget; hollow squares: the finalists' final rounds; the thick curve and ★ (its medians over the rounds): the winner; dashed: the shipped config.</small></p>
${chart(result)}
<h2>Final rounds (interleaved, order reversed each round; each round the highest throughput within the budget of a short concurrency sweep)</h2>${roundsTable(result)}
<h2>Every candidate's sweep</h2>${trialsTable(result)}
</body></html>
`;
}
