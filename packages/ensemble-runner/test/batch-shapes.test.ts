import { describe, expect, it } from "vitest";
import { shapeFor } from "../src/batch-shapes.js";

// Triton's EnsembleContext::ReshapeTensorDims (core src/ensemble_scheduler/ensemble_scheduler.cc).
describe("a tensor's shape between models that batch and models that do not", () => {
  it("to a model that batches, from one that does not: a batch of 1 in front when the shape is its dims", () => {
    expect(shapeFor([-1], true, 0, [0])).toEqual([1, 0]);
    expect(shapeFor([-1], true, 0, [3])).toEqual([1, 3]);
    expect(shapeFor([5], true, 0, [5])).toEqual([1, 5]);
    // Not its dims: taken to be batched already.
    expect(shapeFor([-1], true, 0, [2, 3])).toEqual([2, 3]);
    expect(shapeFor([-1], true, 0, [0, 0])).toEqual([0, 0]);
  });

  it("to a model that does not batch, from one that does: a batch of 1 dropped when the shape is not its dims", () => {
    expect(shapeFor([-1], false, 1, [1, 0])).toEqual([0]);
    expect(shapeFor([-1], false, 1, [1, 3])).toEqual([3]);
    expect(shapeFor([-1, -1], false, 1, [1, 3])).toEqual([1, 3]);
    expect(shapeFor([-1], false, 2, [2, 3])).toEqual([2, 3]);
  });

  it("between two that batch, or two that do not: as it is", () => {
    expect(shapeFor([-1], true, 4, [4, 3])).toEqual([4, 3]);
    expect(shapeFor([-1, -1], false, 0, [2, 2])).toEqual([2, 2]);
  });
});
