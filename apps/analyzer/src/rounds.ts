/**
 * The honest comparison: the finalists (the shipped config, the search's pick and its
 * runner-up) served side by side and measured in interleaved rounds, the order reversed every
 * round (A B C, C B A, …: @trellis/testing's interleavedRounds, as the server's A/B benches),
 * so a slow spell on a shared machine falls on all of them. In each round a finalist gets a
 * short concurrency sweep around its search point, and scores the highest throughput whose p99
 * is within the budget: what the user asked, compared at equal latency, not at one fixed
 * concurrency. The verdict declares a winner only when it beats the shipped config by more than
 * the rounds' own spread.
 */
import { interleavedRounds, median } from "@trellis/testing";
import { measureAt, type Subject, type SweepPoint, startSubject, toPoint, type WindowOptions } from "./measure.js";
import type { EnsembleRepository } from "./repository.js";
import type { Trial } from "./search.js";

export interface Finalist {
  trial: Trial;
  /** Its search point: the concurrency the rounds' short sweeps are centred on. */
  concurrency: number;
  /** Per round, the point it scored: the highest throughput within the budget (else its lowest p99). */
  rounds: SweepPoint[];
  /** Medians over the rounds, and the spread (min–max) between rounds. */
  throughput: { median: number; min: number; max: number };
  p99Ms: { median: number; min: number; max: number };
}

/** What the analysis concludes, in one of three ways. */
export type Verdict =
  | { kind: "winner"; finalist: string; ratio: number; baselineWithinBudget: boolean }
  | { kind: "no significant difference"; best: string; ratio: number; spread: number }
  | { kind: "nothing met the budget"; best: string; smallestBudgetMs: number };

const spread = (xs: number[]) => ({ median: median(xs), min: Math.min(...xs), max: Math.max(...xs) });

/** The search's point a finalist's rounds are centred on. */
export function comparisonConcurrency(trial: Trial, budgetMs: number): number {
  const points = trial.sweep.points;
  const within = points.filter((p) => p.p99Ms <= budgetMs).sort((a, b) => b.throughput - a.throughput);
  const lowest = [...points].sort((a, b) => a.p99Ms - b.p99Ms);
  return (within[0] ?? lowest[0])?.concurrency ?? 1;
}

/** The concurrencies a round measures for a finalist: its own, and its neighbours in the list. */
export function aroundConcurrency(concurrency: number, list: readonly number[]): number[] {
  const sorted = [...new Set([...list, concurrency])].sort((a, b) => a - b);
  const at = sorted.indexOf(concurrency);
  return sorted.slice(Math.max(0, at - 1), at + 2);
}

/**
 * The concurrency a finals sweep tries after `concurrency` once the list's planned points are
 * measured and all were within the budget: another step of the list's last gap past its highest
 * value (quick 1,2,4: then 6, 8), up to twice that value; undefined when there is none. Without
 * it a config still within the budget at the list's top would be scored below its real best.
 */
export function beyondList(concurrency: number, list: readonly number[]): number | undefined {
  const sorted = [...new Set(list)].sort((a, b) => a - b);
  const top = sorted.at(-1) ?? 1;
  if (concurrency < top) return undefined;
  const step = sorted.length > 1 ? top - (sorted.at(-2) as number) : 1;
  const next = concurrency + step;
  return next <= 2 * top ? next : undefined;
}

/** The point a round scores: the highest throughput within the budget, else the lowest p99. */
export function roundScore(points: readonly SweepPoint[], budgetMs: number): SweepPoint {
  const within = points.filter((p) => p.p99Ms <= budgetMs).sort((a, b) => b.throughput - a.throughput);
  return within[0] ?? [...points].sort((a, b) => a.p99Ms - b.p99Ms)[0]!;
}

/** The baseline, the search's best, and the runner-up among the other trials (distinct, when they exist). */
export function pickFinalists(trials: Trial[], best: Trial): Trial[] {
  const baseline = trials.find((t) => t.id === "baseline")!;
  const others = trials
    .filter((t) => t !== baseline && t !== best && t.sweep.score > 0)
    .sort((a, b) => b.sweep.score - a.sweep.score);
  return [...new Set([baseline, best, ...others.slice(0, 1)])];
}

/**
 * The verdict from the rounds. Within the budget (median p99), the finalist with the highest
 * median throughput wins only when it is not the shipped config and either the shipped config
 * is over the budget or the gain exceeds the larger of the two finalists' spreads between
 * rounds; otherwise there is no significant difference. When no finalist is within the budget,
 * the verdict says which budget the best of them does meet.
 */
export function judge(finalists: Finalist[], budgetMs: number): Verdict {
  const baseline = finalists.find((f) => f.trial.id === "baseline")!;
  const within = finalists.filter((f) => f.p99Ms.median <= budgetMs);
  if (within.length === 0) {
    const best = finalists.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a));
    return { kind: "nothing met the budget", best: best.trial.id, smallestBudgetMs: Math.ceil(best.p99Ms.median) };
  }
  const best = within.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a));
  const ratio = best.throughput.median / baseline.throughput.median;
  const baselineWithinBudget = within.includes(baseline);
  if (best !== baseline && !baselineWithinBudget) {
    return { kind: "winner", finalist: best.trial.id, ratio, baselineWithinBudget };
  }
  const noise = Math.max(best.throughput.max - best.throughput.min, baseline.throughput.max - baseline.throughput.min);
  const gain = best.throughput.median - baseline.throughput.median;
  if (best !== baseline && gain > noise)
    return { kind: "winner", finalist: best.trial.id, ratio, baselineWithinBudget };
  return { kind: "no significant difference", best: best.trial.id, ratio, spread: noise / baseline.throughput.median };
}

/** The finalist whose settings are written: the verdict's winner, else the shipped config (nothing changes). */
export function chooseWinner(finalists: Finalist[], budgetMs: number): Finalist {
  const verdict = judge(finalists, budgetMs);
  const id = verdict.kind === "winner" ? verdict.finalist : "baseline";
  return finalists.find((f) => f.trial.id === id)!;
}

export async function measureRounds(
  repo: EnsembleRepository,
  trials: Trial[],
  options: WindowOptions & {
    rounds: number;
    budgetMs: number;
    concurrencies: readonly number[];
    log?: (line: string) => void;
  },
): Promise<Finalist[]> {
  const subjects: { trial: Trial; subject: Subject; concurrency: number; rounds: SweepPoint[] }[] = [];
  try {
    for (const trial of trials) {
      const subject = await startSubject(repo, trial.candidate);
      subjects.push({ trial, subject, concurrency: comparisonConcurrency(trial, options.budgetMs), rounds: [] });
    }
    await interleavedRounds(subjects, options.rounds, async (s, round) => {
      const points: SweepPoint[] = [];
      const planned = aroundConcurrency(s.concurrency, options.concurrencies);
      for (let i = 0, c = planned[0]; c !== undefined; c = planned[++i] ?? beyondList(c, options.concurrencies)) {
        const point = toPoint(await measureAt(s.subject, options, c));
        points.push(point);
        // More requests in flight only queue more: the rest of the sweep cannot be within the budget.
        if (point.p99Ms > options.budgetMs) break;
      }
      const scored = roundScore(points, options.budgetMs);
      s.rounds.push(scored);
      options.log?.(
        `round ${round + 1} ${s.trial.id} c${scored.concurrency}: ${scored.throughput.toFixed(1)}/s p99 ${scored.p99Ms.toFixed(0)} ms`,
      );
    });
  } finally {
    for (const s of subjects) await s.subject.stop();
  }
  return subjects.map((s) => ({
    trial: s.trial,
    concurrency: s.concurrency,
    rounds: s.rounds,
    throughput: spread(s.rounds.map((r) => r.throughput)),
    p99Ms: spread(s.rounds.map((r) => r.p99Ms)),
  }));
}
