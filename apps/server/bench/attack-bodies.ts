/**
 * The requests of attack-ab.ts, shared with its attacking clients (attack-worker.ts), which run
 * in threads of their own so that reading their answers does not stall the good clients' loop.
 */
import { GATHER_WIDTH } from "@trellis/testing";

/** The large-answer attack's answer size (MiB). */
export const ANSWER_MIB = Number(process.env.ATTACK_AB_ANSWER_MIB ?? 32);

export type Target = "gather" | "twice" | "constant";

export interface Attack {
  name: string;
  good: Target;
  /** The n-th attacking request's body and the model it goes to. */
  attack: (n: number) => { model: Target; body: string };
}

export const gatherBody = (seed: number, index: number): string =>
  JSON.stringify({
    inputs: [
      {
        name: "x",
        datatype: "FP32",
        shape: [1, GATHER_WIDTH],
        data: Array.from({ length: GATHER_WIDTH }, (_, i) => ((seed * 7 + i) % 17) / 8 - 1),
      },
      { name: "idx", datatype: "INT64", shape: [1, 1], data: [index] },
    ],
  });
/** A request to `twice`; its answer comes back as binary data, so the attack costs the Python path, not JSON. */
export const twiceBody = (first: number, seed: number): string =>
  JSON.stringify({
    inputs: [{ name: "X", datatype: "FP32", shape: [1, 4], data: [first, seed % 1000, 1, 2] }],
    outputs: [{ name: "Y", parameters: { binary_data: true } }],
  });
export const goodBody = (target: Target, n: number) =>
  target === "gather" ? gatherBody(n, n % GATHER_WIDTH) : twiceBody(100 + (n % 50), n);

export const ATTACKS: Attack[] = [
  { name: "python-large-answer", good: "gather", attack: () => ({ model: "twice", body: twiceBody(77, ANSWER_MIB) }) },
  // The transport's share of the large-answer attack: a TypeScript model answering one 32 MiB
  // array it made once (no backend, no copy, no allocation), so what is left is the answer's way out.
  {
    name: "constant-large-answer",
    good: "gather",
    attack: () => ({ model: "constant", body: twiceBody(77, ANSWER_MIB) }),
  },
  { name: "python-crash", good: "twice", attack: () => ({ model: "twice", body: twiceBody(66, 0) }) },
  { name: "python-hang", good: "twice", attack: () => ({ model: "twice", body: twiceBody(13, 0) }) },
  {
    name: "onnx-bad-constant",
    good: "gather",
    attack: (n) => ({ model: "gather", body: gatherBody(0, 1000 + (n % 2)) }),
  },
  { name: "onnx-bad-changing", good: "gather", attack: (n) => ({ model: "gather", body: gatherBody(n, 1000) }) },
];
