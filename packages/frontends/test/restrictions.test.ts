import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { grpcMethodCategory, parseRestriction, restrictionError } from "../src/restrictions.js";

describe("restricted APIs", () => {
  it("parses Triton's <categories>:<header>=<value>, header names in lower case, values as given", () => {
    const r = parseRestriction("model-repository,logging:Admin-Key=S3cret=x");
    parseRestriction("inference:infer-key=abc", r);
    expect(r).toEqual({
      "model-repository": { header: "admin-key", value: "S3cret=x" },
      logging: { header: "admin-key", value: "S3cret=x" },
      inference: { header: "infer-key", value: "abc" },
    });
  });

  it("says what is wrong with a bad spec, in tritonserver's words", () => {
    expect(() => parseRestriction("model-repository")).toThrow(
      "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got model-repository",
    );
    expect(() => parseRestriction("inference:k=")).toThrow(
      "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:k=",
    );
    expect(() => parseRestriction("models:k=v")).toThrow("unknown restricted api 'models'");
    expect(() => parseRestriction("inference:k=v", parseRestriction("inference:j=w"))).toThrow(
      "restricted api 'inference' can not be specified in multiple config groups",
    );
    const grpc = { option: "grpc-restricted-protocol", feature: "protocol" } as const;
    expect(() => parseRestriction("models:k=v", {}, grpc)).toThrow("unknown restricted protocol 'models'");
    expect(() => parseRestriction("health", {}, grpc)).toThrow(
      "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health",
    );
  });

  it("maps every gRPC method to its category and refuses a call without the header", () => {
    expect(grpcMethodCategory("inference.GRPCInferenceService", "RepositoryModelLoad")).toBe("model-repository");
    expect(grpcMethodCategory("inference.GRPCInferenceService", "ModelStreamInfer")).toBe("inference");
    expect(grpcMethodCategory("grpc.health.v1.Health", "Check")).toBe("health");
    const r = parseRestriction("model-repository:admin-key=secret");
    const headers = (h: Record<string, string>) => (name: string) => h[name];
    expect(restrictionError(r, "inference", headers({}))).toBeUndefined();
    expect(restrictionError(r, "model-repository", headers({ "admin-key": "secret" }))).toBeUndefined();
    const refused = restrictionError(r, "model-repository", headers({ "admin-key": "guess" }));
    expect(refused?.code).toBe(Code.PermissionDenied);
    expect(refused?.rawMessage).toBe(
      "This API is restricted, expecting header 'admin-key' (the model-repository endpoints)",
    );
    // A gRPC method: Triton's UNAVAILABLE "This protocol is restricted" (server src/grpc/grpc_server.cc).
    const overGrpc = restrictionError(r, "model-repository", headers({}), "grpc");
    expect([overGrpc?.code, overGrpc?.rawMessage]).toEqual([
      Code.Unavailable,
      "This protocol is restricted, expecting header 'admin-key' (the model-repository endpoints)",
    ]);
  });
});
