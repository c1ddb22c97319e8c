/** How the page reads a classifier's answer: the seed's top-5 JSON and Triton's classification strings. */
import { describe, expect, it } from "vitest";
import { bytesElements, labelsOf } from "../src/outputs.js";

describe("labelsOf", () => {
  it("reads the seed's JSON string, labels with their probabilities in order", () => {
    const json = JSON.stringify({
      top5_indices: [285, 281],
      top5_labels: ["Egyptian cat", "tabby"],
      top5_probs: [0.757, 0.13],
    });
    expect(labelsOf([json])).toEqual([
      { label: "Egyptian cat", prob: 0.757 },
      { label: "tabby", prob: 0.13 },
    ]);
  });

  it("refuses JSON that holds no top-5", () => {
    expect(() => labelsOf(['{"labels": []}'])).toThrow("the output is JSON without top5_labels and top5_probs");
  });

  it("reads Triton's classification strings: score:index:label, a label with colons, no label", () => {
    expect(labelsOf(["14.253942:285:Egyptian cat", "9.5:999:a:b", "-1.25:3"])).toEqual([
      { label: "Egyptian cat", prob: 14.253942 },
      { label: "a:b", prob: 9.5 },
      { label: "3", prob: -1.25 },
    ]);
  });
});

describe("bytesElements", () => {
  it("splits a BYTES tensor's length-prefixed elements, from a view into a larger buffer", () => {
    const enc = new TextEncoder();
    const parts = ["0.5:1:a", "", "é"].map((s) => enc.encode(s));
    const body = new Uint8Array(3 + parts.reduce((n, p) => n + 4 + p.length, 0));
    const view = new DataView(body.buffer);
    let at = 3;
    for (const p of parts) {
      view.setUint32(at, p.length, true);
      body.set(p, at + 4);
      at += 4 + p.length;
    }
    expect(bytesElements(body.subarray(3))).toEqual(["0.5:1:a", "", "é"]);
  });
});
