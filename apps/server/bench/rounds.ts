/**
 * The A/B benches' rounds: each subject measured in interleaved rounds, then printed: its
 * median and per-round spread, and the per-round ratio.
 */
import { closedLoop, interleavedRounds, median } from "@trellis/testing";

export interface RoundsMeasured {
  label: string;
  rates: number[];
  p50s: number[];
}

/** A subject of the A/B benches: its calls, and what its rounds measured. */
export interface RoundSubject extends RoundsMeasured {
  infer: (photo: Uint8Array) => Promise<unknown>;
}

export interface RoundsOptions {
  rounds: number;
  concurrency: number;
  seconds: number;
  /** The p50 from this many calls one at a time after each round's loop; default: the loop's own latencies. */
  latencyN?: number;
}

/**
 * Per round (the order alternating) and subject: `concurrency` closed-loop callers of `photos`
 * for `seconds` after a 2 s warm-up; its requests/s and p50 are added to the subject's and printed.
 */
export async function measureRounds(
  subjects: RoundSubject[],
  photos: Uint8Array[],
  options: RoundsOptions,
): Promise<void> {
  const { concurrency, seconds, latencyN } = options;
  await interleavedRounds(subjects, options.rounds, async (s, round) => {
    const r = await closedLoop((k) => s.infer(photos[k % photos.length]!), concurrency, seconds, {
      warmupSeconds: 2,
    });
    let latencies = r.latencies;
    if (latencyN !== undefined) {
      latencies = [];
      for (let i = 0; i < latencyN; i++) {
        const t = performance.now();
        await s.infer(photos[i % photos.length]!);
        latencies.push(performance.now() - t);
      }
    }
    s.rates.push(r.calls / r.seconds);
    s.p50s.push(median(latencies));
    console.log(
      `round ${round + 1} ${s.label}: ${(r.calls / r.seconds).toFixed(1)} req/s, p50 ${median(latencies).toFixed(1)} ms`,
    );
  });
}

const spread = (xs: number[]) => `${Math.min(...xs).toFixed(1)}-${Math.max(...xs).toFixed(1)}`;

/** Prints `header`, each subject's throughput and p50 (median, rounds' min-max), and `ratio`'s name, values and median. */
export function printRounds(
  header: string,
  subjects: RoundsMeasured[],
  ratio: { name: string; values: number[] },
): void {
  console.log(`\n${header}`);
  for (const s of subjects) {
    console.log(
      `${s.label}: ${median(s.rates).toFixed(1)} req/s (rounds ${spread(s.rates)}), p50 ${median(s.p50s).toFixed(1)} ms (rounds ${spread(s.p50s)})`,
    );
  }
  console.log(
    `${ratio.name} throughput per round: ${ratio.values.map((r) => r.toFixed(3)).join(", ")}; median ${median(ratio.values).toFixed(3)}`,
  );
}
