import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { StageError, toConnectError } from "../src/errors.js";

class StepError extends StageError {}

describe("StageError", () => {
  it("is a ConnectError to Connect, subclasses included, so its code is what goes on the wire", () => {
    const err = new StepError(Code.InvalidArgument, "model", "bad input");
    expect(err).toBeInstanceOf(ConnectError);
    expect(toConnectError(err)).toBe(err);
    expect(ConnectError.from(err).code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe("model: bad input");
  });

  it("answers instanceof by class: a StepError is a StageError, a plain StageError is no StepError", () => {
    expect(new StepError(Code.Internal, "", "x")).toBeInstanceOf(StageError);
    expect(new StageError(Code.Internal, "", "x")).not.toBeInstanceOf(StepError);
    expect(new ConnectError("x", Code.Internal)).not.toBeInstanceOf(StageError);
  });

  it("refuses a subclass that renames itself, which Connect would send as INTERNAL", () => {
    class Renamed extends StageError {
      override name = "Renamed";
    }
    expect(() => new Renamed(Code.InvalidArgument, "", "x")).toThrow(TypeError);
  });
});
