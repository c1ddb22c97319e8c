/** Issue 46: decode slots go to waiting requests in turn, so one request's many images do not starve others. */
import { readFixtureImage } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { FairLimiter } from "../src/fair-limiter.js";
import { createPreprocess } from "../src/index.js";
import { rawImageRequest } from "./helpers.js";

describe("fair decode slots", () => {
  it("hands freed slots to owners in turn, never more than the limit at once", async () => {
    const limiter = new FairLimiter(2);
    const a = {};
    const b = {};
    const order: string[] = [];
    let running = 0;
    let most = 0;
    const task = (name: string) => async () => {
      running++;
      most = Math.max(most, running);
      await new Promise((r) => setTimeout(r, 5));
      order.push(name);
      running--;
    };
    await Promise.all([
      ...["a1", "a2", "a3", "a4", "a5", "a6"].map((n) => limiter.run(a, task(n))),
      ...["b1", "b2"].map((n) => limiter.run(b, task(n))),
    ]);
    expect(most).toBe(2);
    // a1, a2 take the slots; then b and a alternate while both wait.
    expect(order).toEqual(["a1", "a2", "a3", "b1", "a4", "b2", "a5", "a6"]);
  });

  it("answers a one-image request sent after an eight-image one before it, with one decode slot", async () => {
    const stage = createPreprocess({ name: "p", concurrency: 1 });
    const photo = readFixtureImage("chelsea.jpg");
    const answered: string[] = [];
    const many = stage
      .infer(rawImageRequest(Array.from({ length: 8 }, () => photo)))
      .then(() => answered.push("eight"));
    const one = stage.infer(rawImageRequest([photo])).then(() => answered.push("one"));
    await Promise.all([many, one]);
    expect(answered).toEqual(["one", "eight"]);
  });
});
