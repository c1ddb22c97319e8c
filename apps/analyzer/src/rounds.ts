/**
 * The honest comparison: the finalists (the shipped config, the search's pick and its
 * runner-up) served side by side and measured in interleaved rounds, the order reversed every
 * round (A B C, C B A, …: @trellis/testing's interleavedRounds, as the server's A/B benches),
 * so a slow spell on a shared machine falls on all of them. The winner is chosen from these
 * rounds' medians.
 */
import { interleavedRounds, median } from "@trellis/testing";
import { measureAt, type Subject, type SweepPoint, startSubject, toPoint, type WindowOptions } from "./measure.js";
import type { EnsembleRepository } from "./repository.js";
import type { Trial } from "./search.js";

export interface Finalist {
  trial: Trial;
  /** The concurrency it is measured at: its best point within the budget in the search (else its lowest-p99 one). */
  concurrency: number;
  rounds: SweepPoint[];
  /** Medians over the rounds, and the spread (min–max) between rounds. */
  throughput: { median: number; min: number; max: number };
  p99Ms: { median: number; min: number; max: number };
}

const spread = (xs: number[]) => ({ median: median(xs), min: Math.min(...xs), max: Math.max(...xs) });

/** The search's point a finalist is compared at. */
export function comparisonConcurrency(trial: Trial, budgetMs: number): number {
  const points = trial.sweep.points;
  const within = points.filter((p) => p.p99Ms <= budgetMs).sort((a, b) => b.throughput - a.throughput);
  const lowest = [...points].sort((a, b) => a.p99Ms - b.p99Ms);
  return (within[0] ?? lowest[0])?.concurrency ?? 1;
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
 * The chosen finalist: the highest median throughput among those whose median p99 is within
 * the budget; the baseline when none is (then nothing is changed).
 */
export function chooseWinner(finalists: Finalist[], budgetMs: number): Finalist {
  const within = finalists.filter((f) => f.p99Ms.median <= budgetMs);
  const baseline = finalists.find((f) => f.trial.id === "baseline")!;
  return within.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a), within[0] ?? baseline);
}

export async function measureRounds(
  repo: EnsembleRepository,
  trials: Trial[],
  options: WindowOptions & { rounds: number; budgetMs: number; log?: (line: string) => void },
): Promise<Finalist[]> {
  const subjects: { trial: Trial; subject: Subject; concurrency: number; rounds: SweepPoint[] }[] = [];
  try {
    for (const trial of trials) {
      const subject = await startSubject(repo, trial.candidate);
      subjects.push({ trial, subject, concurrency: comparisonConcurrency(trial, options.budgetMs), rounds: [] });
    }
    await interleavedRounds(subjects, options.rounds, async (s, round) => {
      const point = toPoint(await measureAt(s.subject, options, s.concurrency));
      s.rounds.push(point);
      options.log?.(
        `round ${round + 1} ${s.trial.id} c${s.concurrency}: ${point.throughput.toFixed(1)}/s p99 ${point.p99Ms.toFixed(0)} ms`,
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
