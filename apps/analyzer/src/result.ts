/** What an analysis found: every candidate's sweep, the final rounds, the winner and where it went. */
import type { Finalist } from "./rounds.js";
import type { Trial } from "./search.js";
import type { Candidate } from "./space.js";

export interface AnalyzeResult {
  ensemble: string;
  budgetMs: number;
  shipped: Candidate;
  trials: Trial[];
  finalists: Finalist[];
  winner: Finalist;
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
