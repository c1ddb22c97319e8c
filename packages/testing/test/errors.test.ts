import { describe, expect, it } from "vitest";
import { rejectionOf } from "../src/errors.js";

class QueueFull extends Error {
  override name = "QueueFull";
}

describe("rejectionOf", () => {
  it("returns the error a promise rejects with, typed", async () => {
    const err = await rejectionOf(Promise.reject(new QueueFull("3 queued")), QueueFull);
    expect(err).toBeInstanceOf(QueueFull);
    expect(err.message).toBe("3 queued");
  });

  it("fails when the promise resolves", async () => {
    await expect(rejectionOf(Promise.resolve(1), QueueFull)).rejects.toThrow(
      "expected a rejection with QueueFull, but it resolved",
    );
  });

  it("fails when the promise rejects with another kind of error, naming it", async () => {
    await expect(rejectionOf(Promise.reject(new TypeError("x is undefined")), QueueFull)).rejects.toThrow(
      "expected a rejection with QueueFull, got TypeError: x is undefined",
    );
  });
});
