/** The client side of the benchmarks: closed-loop callers, timed. */

export interface ClosedLoopResult {
  /** Calls answered inside the measured window. */
  calls: number;
  /** The measured window, seconds. */
  seconds: number;
  /** Latency of each call counted, milliseconds, in completion order. */
  latencies: number[];
}

export interface ClosedLoopOptions {
  /**
   * Seconds of calls before the measured window opens, not counted: a
   * pipeline (decode, then a batch) fills up first, as it is under a
   * sustained load. Default 0.
   */
  warmupSeconds?: number;
}

/**
 * `concurrency` callers, each calling `call` again as soon as its previous call
 * answers; `call` gets a running index (to pick its request). Steady state:
 * only calls that answer inside the measured window (`seconds` long, after
 * the warm-up) count, so neither the start, when every caller begins at
 * once, nor the calls still running when the window closes skew the rate.
 * Those last calls are still awaited before this returns.
 */
export async function closedLoop(
  call: (i: number) => Promise<unknown>,
  concurrency: number,
  seconds: number,
  options: ClosedLoopOptions = {},
): Promise<ClosedLoopResult> {
  const latencies: number[] = [];
  let next = 0;
  const from = performance.now() + (options.warmupSeconds ?? 0) * 1000;
  const end = from + seconds * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await call(next++);
        const answered = performance.now();
        if (answered >= from && answered <= end) latencies.push(answered - t);
      }
    }),
  );
  return { calls: latencies.length, seconds, latencies };
}

/**
 * Interleaved rounds, as the A/B benches and the analyzer compare: `rounds` times, `each` on
 * every subject in turn, in order on even rounds and reversed on odd ones (A B, B A, …), so a
 * slow spell on a shared machine falls on all of them.
 */
export async function interleavedRounds<S>(
  subjects: readonly S[],
  rounds: number,
  each: (subject: S, round: number) => Promise<void>,
): Promise<void> {
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? subjects : [...subjects].reverse();
    for (const s of order) await each(s, round);
  }
}

/** The median of `xs` (the mean of the middle two for an even count); NaN when empty. */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  if (s.length === 0) return Number.NaN;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** The p-th percentile of `xs` by nearest rank (p in 0..100); NaN when empty. */
export function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
}
