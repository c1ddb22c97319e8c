/**
 * The search: coordinate descent from the shipped config. Step by step, dimension by dimension
 * (instances, batch, queue delay, ONNX threads), each other value of that one dimension is
 * served and swept; the best beats the incumbent only by a clear margin, and then becomes it.
 * Every sweep is pruned against the incumbent's score (see `sweep`), so a branch stops as soon
 * as it cannot win.
 */
import { type Subject, type Sweep, startSubject, sweep, type WindowOptions } from "./measure.js";
import type { EnsembleRepository } from "./repository.js";
import { type Candidate, DIMENSIONS, describeChange, type SearchSpace, valuesOf } from "./space.js";

export interface Trial {
  /** "baseline" for the shipped config, else c1, c2, … in the order measured. */
  id: string;
  candidate: Candidate;
  /** What differs from the shipped config ("" for the baseline). */
  change: string;
  sweep: Sweep;
  /** Why its server did not start or load it (then its sweep is empty, ended "failed"). */
  failed?: string;
}

export interface SearchOptions extends WindowOptions {
  concurrencies: number[];
  budgetMs: number;
  space: SearchSpace;
  /** A candidate replaces the incumbent only when its score is higher by this fraction (the noise between windows). */
  minGain: number;
  /** Stop starting new candidates after this long (the search keeps what it has). */
  deadlineMs?: number;
  log?: (line: string) => void;
}

export interface SearchResult {
  trials: Trial[];
  /** The incumbent at the end: the search's pick before the final rounds. */
  best: Trial;
}

async function trial(
  repo: EnsembleRepository,
  id: string,
  candidate: Candidate,
  options: SearchOptions,
  incumbent: number,
): Promise<Trial> {
  const change = describeChange(repo.shipped, candidate);
  let subject: Subject;
  try {
    subject = await startSubject(repo, candidate);
  } catch (err) {
    // A candidate the server cannot load (too many instances for the machine, say) is a result too.
    const failed = err instanceof Error ? err.message : String(err);
    if (id === "baseline") throw new Error(`the shipped config does not start: ${failed}`);
    return { id, candidate, change, sweep: { points: [], end: "failed", score: 0 }, failed };
  }
  try {
    const measured = await sweep(subject, { ...options, incumbent });
    return { id, candidate, change, sweep: measured };
  } finally {
    await subject.stop();
  }
}

function describeTrial(t: Trial): string {
  if (t.failed) return `${t.id} [${t.change}] failed to start: ${t.failed}`;
  const points = t.sweep.points
    .map((p) => `c${p.concurrency} ${p.throughput.toFixed(1)}/s p99 ${p.p99Ms.toFixed(0)} ms`)
    .join(", ");
  return `${t.id} [${t.change || "shipped"}] ${points} -> ${t.sweep.end}, score ${t.sweep.score.toFixed(1)}/s`;
}

/** Candidates one dimension away from `incumbent`: each other value of `dimension` in `step`. */
function neighbours(
  repo: EnsembleRepository,
  incumbent: Candidate,
  step: string,
  dimension: keyof Candidate[string],
  space: SearchSpace,
) {
  const config = repo.steps.find((s) => s.name === step)?.config;
  const current = incumbent[step];
  if (!config || !current) return [];
  // Threads 0 means the backend's default, cores / instances: trying that number again is no change.
  const effective =
    dimension === "threads"
      ? current.threads || Math.max(1, Math.floor(space.cores / current.count))
      : current[dimension];
  return valuesOf(dimension, space, config, current)
    .filter((v) => v !== effective)
    .map((v): Candidate => ({ ...incumbent, [step]: { ...current, [dimension]: v } }));
}

/**
 * The steps in the order searched: where the baseline's requests spent the most time first (its
 * highest concurrency measured, from the server's statistics), so a search cut short by its
 * deadline has tuned the bottleneck.
 */
export function stepsByTime(repo: EnsembleRepository, baseline: Trial): string[] {
  const last = baseline.sweep.points.at(-1);
  const time = (step: string) => last?.modelMs[step] ?? 0;
  return repo.steps.map((s) => s.name).sort((a, b) => time(b) - time(a));
}

export async function search(repo: EnsembleRepository, options: SearchOptions): Promise<SearchResult> {
  const log = options.log ?? (() => {});
  const started = performance.now();
  const trials: Trial[] = [];
  let best = await trial(repo, "baseline", repo.shipped, options, 0);
  trials.push(best);
  log(describeTrial(best));
  for (const step of stepsByTime(repo, best)) {
    for (const dimension of DIMENSIONS) {
      let bestHere = best;
      for (const candidate of neighbours(repo, best.candidate, step, dimension, options.space)) {
        if (options.deadlineMs !== undefined && performance.now() - started > options.deadlineMs) {
          log(`deadline reached after ${trials.length} candidates: keeping the best so far`);
          return { trials, best };
        }
        // Pruned against the better of the incumbent and this dimension's best so far, plus the margin.
        const bar = Math.max(best.sweep.score * (1 + options.minGain), bestHere.sweep.score);
        const t = await trial(repo, `c${trials.length}`, candidate, options, bar);
        trials.push(t);
        log(describeTrial(t));
        if (t.sweep.score > bar) bestHere = t;
      }
      best = bestHere;
    }
  }
  return { trials, best };
}
