/** What the A/B benches print: each subject's median and per-round spread, then the per-round ratio. */
import { median } from "@trellis/testing";

export interface RoundsMeasured {
  label: string;
  rates: number[];
  p50s: number[];
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
