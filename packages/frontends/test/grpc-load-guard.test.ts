import { create, toBinary } from "@bufbuild/protobuf";
import { RepositoryModelLoadRequestSchema } from "@trellis/protocol";
import { describe, expect, it } from "vitest";
import { scanLoadRequest } from "../src/grpc/load-guard.js";

const request = (files: number) => {
  const parameters: Record<string, { parameterChoice: { case: "bytesParam"; value: Uint8Array } }> = {};
  for (let i = 0; i < files; i++)
    parameters[`file:1/f${i}`] = { parameterChoice: { case: "bytesParam", value: new Uint8Array(i % 3) } };
  return toBinary(
    RepositoryModelLoadRequestSchema,
    create(RepositoryModelLoadRequestSchema, { repositoryName: "r", modelName: "m\u00e9", parameters }),
  );
};

describe("scanLoadRequest", () => {
  it("counts a load's parameters from the wire and reads its model name, stopping past the limit", () => {
    expect(scanLoadRequest(request(0), 10)).toEqual({ parameters: 0, modelName: "m\u00e9" });
    expect(scanLoadRequest(request(7), 10)).toEqual({ parameters: 7, modelName: "m\u00e9" });
    // Counting stops one past the limit: a million entries cost no more than the limit.
    expect(scanLoadRequest(request(5000), 10).parameters).toBe(11);
  });

  it("reads a truncated or malformed message as far as it goes", () => {
    const whole = request(3);
    expect(scanLoadRequest(whole.subarray(0, whole.length - 2), 10).parameters).toBeLessThanOrEqual(3);
    expect(scanLoadRequest(new Uint8Array([0xff, 0xff, 0xff]), 10)).toEqual({ parameters: 0, modelName: "" });
  });
});
