/**
 * The trace summary's arithmetic on a hand-made file, in the form Triton writes
 * (one timestamp per object) as well as ours (a trace's timestamps together).
 */
import { describe, expect, it } from "vitest";
import { summarizeTraces } from "../tools/summarize.js";

const us = (n: number) => n * 1000;

/** An ensemble request over gRPC at `t0` (µs) with two steps, as Triton splits it: one timestamp per object. */
function ensembleTrace(id: number, t0: number, extra: number): object[] {
  const stamps = (traceId: number, at: Record<string, number>) =>
    Object.entries(at).map(([name, t]) => ({ id: traceId, timestamps: [{ name, ns: us(t0 + t) }] }));
  return [
    { id, model_name: "ens", model_version: 1 },
    ...stamps(id, {
      GRPC_WAITREAD_START: 0,
      GRPC_WAITREAD_END: 10,
      REQUEST_START: 20,
      QUEUE_START: 20,
      COMPUTE_START: 20,
      COMPUTE_INPUT_END: 20,
      COMPUTE_OUTPUT_START: 220 + extra,
      COMPUTE_END: 220 + extra,
      REQUEST_END: 230 + extra,
      GRPC_SEND_START: 240 + extra,
      GRPC_SEND_END: 250 + extra,
    }),
    { id: id + 1, model_name: "second", model_version: 1, parent_id: id },
    // Listed before the first step: steps are ordered by when they start, not by the file.
    ...stamps(id + 1, {
      REQUEST_START: 130 + extra,
      QUEUE_START: 130 + extra,
      COMPUTE_START: 140 + extra,
      COMPUTE_INPUT_END: 150 + extra,
      COMPUTE_OUTPUT_START: 200 + extra,
      COMPUTE_END: 210 + extra,
      REQUEST_END: 210 + extra,
    }),
    { id: id + 2, model_name: "first", model_version: 1, parent_id: id },
    {
      id: id + 2,
      timestamps: Object.entries({
        REQUEST_START: 30,
        QUEUE_START: 30,
        COMPUTE_START: 30,
        COMPUTE_INPUT_END: 30,
        COMPUTE_OUTPUT_START: 120 + extra,
        COMPUTE_END: 120 + extra,
        REQUEST_END: 120 + extra,
      }).map(([name, t]) => ({ name, ns: us(t0 + t) })),
    },
  ];
}

describe("summarizeTraces", () => {
  it("gives each span's median and mean, the steps in the order they run, and the ensemble's own time", () => {
    // Two requests: the second's first step 30 µs longer.
    const text = summarizeTraces([...ensembleTrace(1, 0, 0), ...ensembleTrace(10, 1000, 30)]);
    const figures = (label: string) => {
      const line = text.split("\n").find((l) => l.trim().startsWith(label));
      return line?.trim().split(/\s+/).slice(-2).map(Number);
    };
    expect(text.split("\n")[0]).toMatch(/^ens, gRPC: 2 traces/);
    expect(figures("request (received to sent)")).toEqual([265, 265]);
    expect(figures("wait/read")).toEqual([10, 10]);
    expect(figures("handler")).toEqual([225, 225]);
    expect(figures("send")).toEqual([10, 10]);
    expect(figures("step first")).toEqual([105, 105]);
    expect(figures("step second")).toEqual([80, 80]);
    expect(text.indexOf("step first")).toBeLessThan(text.indexOf("step second"));
    // Compute 200 (230) µs, of which the steps cover 90 (120) + 80: 30 µs the ensemble's own.
    expect(figures("the ensemble's own")).toEqual([30, 30]);
  });
});
