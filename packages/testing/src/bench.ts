/** The client side of the benchmarks: closed-loop callers, timed. */

export interface ClosedLoopResult {
  /** Calls completed. */
  calls: number;
  /** Wall-clock seconds from the first call to the last answer. */
  seconds: number;
  /** Each call's latency, milliseconds, in completion order. */
  latencies: number[];
}

/**
 * `concurrency` callers, each calling `call` again as soon as its previous call
 * answers, until `seconds` have passed; `call` gets a running index (to pick
 * its request).
 */
export async function closedLoop(
  call: (i: number) => Promise<unknown>,
  concurrency: number,
  seconds: number,
): Promise<ClosedLoopResult> {
  const latencies: number[] = [];
  let next = 0;
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await call(next++);
        latencies.push(performance.now() - t);
      }
    }),
  );
  return { calls: latencies.length, seconds: (performance.now() - start) / 1000, latencies };
}
