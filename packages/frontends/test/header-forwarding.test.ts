import { describe, expect, it } from "vitest";
import { forwardedHeaders, headerForwardPattern, withForwardedHeaders } from "../src/header-forwarding.js";

const headers: [string, string | string[] | undefined][] = [
  [":path", "/inference.GRPCInferenceService/ModelInfer"],
  ["content-type", "application/grpc"],
  ["prefix_tenant", "acme"],
  ["x-prefix_caller", "batch-job"],
  ["prefix_tags", ["a", "b"]],
];

describe("header forwarding", () => {
  it("matches names ignoring case, unless the pattern starts with (?-i)", () => {
    expect(forwardedHeaders(headerForwardPattern("PREFIX_.*"), headers)).toEqual({
      prefix_tenant: "acme",
      "x-prefix_caller": "batch-job",
      prefix_tags: "a, b",
    });
    expect(forwardedHeaders(headerForwardPattern("(?-i)PREFIX_.*"), headers)).toBeUndefined();
    expect(forwardedHeaders(headerForwardPattern("(?-i)^prefix_t"), headers)).toEqual({
      prefix_tenant: "acme",
      prefix_tags: "a, b",
    });
  });

  it("never forwards HTTP/2 pseudo-headers, and nothing without a pattern", () => {
    expect(Object.keys(forwardedHeaders(headerForwardPattern(".*"), headers) ?? {})).not.toContain(":path");
    expect(forwardedHeaders(undefined, headers)).toBeUndefined();
  });

  it("keeps a parameter the request sets itself", () => {
    expect(withForwardedHeaders({ prefix_tenant: "mine", n: 1 }, { prefix_tenant: "acme", prefix_x: "y" })).toEqual({
      prefix_tenant: "mine",
      prefix_x: "y",
      n: 1,
    });
    expect(withForwardedHeaders(undefined, undefined)).toBeUndefined();
  });

  it("refuses a pattern that is not a regular expression, saying why", () => {
    expect(() => headerForwardPattern("PREFIX_(")).toThrow(/Invalid regular expression/);
  });
});
