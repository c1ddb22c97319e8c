/** What an analysis found: every candidate's sweep, the final rounds, the winner and where it went. */
import type { Finalist, Verdict } from "./rounds.js";
import type { Trial } from "./search.js";
import type { Candidate } from "./space.js";

export interface Machine {
  cpu: string;
  cores: number;
  /** AVX-512 VNNI (fast int8 kernels) present. */
  vnni: boolean;
}

export interface AnalyzeResult {
  ensemble: string;
  budgetMs: number;
  shipped: Candidate;
  trials: Trial[];
  finalists: Finalist[];
  /** The finalist whose settings were written: the verdict's winner, else the shipped config. */
  winner: Finalist;
  verdict: Verdict;
  /** Where it was measured: the figures hold for this kind of CPU. */
  machine: Machine;
  /** The command that reproduces the analysis. */
  command: string;
  /** The steps whose config.pbtxt the copy rewrote. */
  rewritten: string[];
  output: string;
  reportPath: string;
  settings: {
    concurrencies: number[];
    windowMs: number;
    roundWindowMs: number;
    warmupMs: number;
    rounds: number;
    cores: number;
    quick: boolean;
  };
}
