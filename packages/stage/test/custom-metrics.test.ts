import { describe, expect, it } from "vitest";
import { CustomMetrics } from "../src/custom-metrics.js";
import { Code } from "../src/errors.js";

describe("CustomMetrics", () => {
  it("shares a family made again the same way, and refuses one made differently", () => {
    const m = new CustomMetrics();
    m.family("jobs_total", "Jobs", "counter");
    m.family("jobs_total", "Jobs", "counter");
    expect(m.size().families).toBe(1);
    expect(() => m.family("jobs_total", "Jobs", "gauge")).toThrow(/already exists as a counter/);
    expect(() => m.family("nv_inference_x", "no", "gauge")).toThrow(/the server's own/);
    expect(() => m.family("bad name", "no", "gauge")).toThrow(/not a Prometheus metric name/);
  });

  it("counts, sets and observes by kind, refusing what a kind does not do", () => {
    const m = new CustomMetrics();
    m.family("c", "a counter", "counter");
    m.family("g", "a gauge", "gauge");
    m.family("h", "a histogram", "histogram");
    const c = m.metric("c", { a: "1" });
    const g = m.metric("g", {});
    const h = m.metric("h", { a: 'q"x' }, [1, 2]);
    m.update("c", c, "increment", 2);
    expect(() => m.update("c", c, "increment", -1)).toThrow(/not allowed/);
    expect(() => m.update("c", c, "set", 1)).toThrow(/not allowed/);
    m.update("g", g, "set", 7);
    m.update("g", g, "increment", -2);
    m.update("h", h, "observe", 1.5);
    expect([m.value("c", c), m.value("g", g)]).toEqual([2, 5]);
    expect(m.text()).toBe(
      [
        "# HELP c a counter",
        "# TYPE c counter",
        'c{a="1"} 2',
        "# HELP g a gauge",
        "# TYPE g gauge",
        "g 5",
        "# HELP h a histogram",
        "# TYPE h histogram",
        'h_bucket{a="q\\"x",le="1"} 0',
        'h_bucket{a="q\\"x",le="2"} 1',
        'h_bucket{a="q\\"x",le="+Inf"} 1',
        'h_sum{a="q\\"x"} 1.5',
        'h_count{a="q\\"x"} 1',
        "",
      ].join("\n"),
    );
  });

  it("bounds families and label sets with RESOURCE_EXHAUSTED, naming the limit", () => {
    const m = new CustomMetrics({ families: 2, metricsPerFamily: 3 });
    m.family("a", "", "gauge");
    m.family("b", "", "gauge");
    const e = (() => {
      try {
        m.family("c", "", "gauge");
      } catch (x) {
        return x as { code: Code; message: string };
      }
    })();
    expect(e?.code).toBe(Code.ResourceExhausted);
    expect(e?.message).toContain("custom metric family limit");
    for (const i of [1, 2, 3]) m.metric("a", { i: String(i) });
    expect(m.metric("a", { i: "2" })).toBe('[["i","2"]]');
    expect(() => m.metric("a", { i: "4" })).toThrow(/label-set limit/);
    expect(m.size()).toEqual({ families: 2, metrics: 3 });
  });
});
