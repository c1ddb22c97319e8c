// The common path's cost of issue 43/48's JSON changes (nesting to depth 100, Triton's element-count
// check, exact 64-bit integers): a JSON infer body parsed and its input decoded, before and after,
// in interleaved rounds. "Before" is main's json.ts before the change, transpiled to
// dist/http/json-before.js (see the report); "after" is dist/http/json.js.
//   node packages/frontends/bench/json-decode.mjs

import { tensorFromJson as after } from "../dist/http/json.js";
import { tensorFromJson as before } from "../dist/http/json-before.js";

const body = (datatype, values, shape = [1, values.length]) =>
  JSON.stringify({ id: "b", inputs: [{ name: "INPUT0", datatype, shape, data: values }] });
const n = 1000;
const cases = [
  [
    "FP32 [1,1000]",
    body(
      "FP32",
      Array.from({ length: n }, (_, i) => Math.round(Math.sin(i) * 1e4) / 1e4),
    ),
  ],
  [
    "INT32 [1,1000]",
    body(
      "INT32",
      Array.from({ length: n }, (_, i) => i * 7919),
    ),
  ],
  [
    "INT64 [1,1000]",
    body(
      "INT64",
      Array.from({ length: n }, (_, i) => i * 7919),
    ),
  ],
  [
    "FP32 [10,100] nested",
    JSON.stringify({
      inputs: [
        {
          name: "INPUT0",
          datatype: "FP32",
          shape: [10, 100],
          data: Array.from({ length: 10 }, (_, r) => Array.from({ length: 100 }, (_, c) => r + c / 100)),
        },
      ],
    }),
  ],
];

function time(decode, text, reps) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < reps; i++) decode(JSON.parse(text).inputs[0]);
  return Number(process.hrtime.bigint() - start) / reps;
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const [label, text] of cases) {
  const ratios = [];
  const base = [];
  for (let round = 0; round < 21; round++) {
    const a = round % 2 ? time(before, text, 500) : undefined;
    const b = time(after, text, 500);
    const a2 = a ?? time(before, text, 500);
    base.push(a2);
    ratios.push(b / a2);
  }
  console.log(
    `${label}: before ${(median(base) / 1000).toFixed(1)} µs/body; after / before = ${median(ratios).toFixed(3)} (median of 21 interleaved rounds)`,
  );
}
