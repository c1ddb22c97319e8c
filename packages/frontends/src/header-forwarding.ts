/**
 * Triton's header forwarding (--http-header-forward-pattern, --grpc-header-forward-pattern):
 * a request's headers whose names match a pattern become string parameters of the
 * inference request, for the model to read (a tenant, a caller id). As in Triton the
 * match ignores case, unless the pattern starts with "(?-i)".
 */
import type { Parameters } from "@trellis/stage";

/** The pattern as a RegExp; throws a SyntaxError naming what is wrong with it. */
export function headerForwardPattern(pattern: string): RegExp {
  const caseSensitive = pattern.startsWith("(?-i)");
  return new RegExp(caseSensitive ? pattern.slice("(?-i)".length) : pattern, caseSensitive ? "" : "i");
}

/**
 * The parameters `headers` give under `pattern` (undefined when none match, or no pattern).
 * A name matches when the pattern is found in it (anchor it with ^ and $ for the whole name);
 * HTTP/2 pseudo-headers (":path") are not headers a client sets, and never forwarded.
 * Repeated headers are joined with ", ", as HTTP folds them.
 */
export function forwardedHeaders(
  pattern: RegExp | undefined,
  headers: Iterable<[string, string | string[] | undefined]>,
): Parameters | undefined {
  if (!pattern) return undefined;
  let forwarded: Parameters | undefined;
  for (const [name, value] of headers) {
    if (value === undefined || name.startsWith(":") || !pattern.test(name)) continue;
    forwarded ??= {};
    forwarded[name] = Array.isArray(value) ? value.join(", ") : value;
  }
  return forwarded;
}

/** `parameters` with the forwarded headers added; a parameter the request sets itself is kept. */
export function withForwardedHeaders(
  parameters: Parameters | undefined,
  forwarded: Parameters | undefined,
): Parameters | undefined {
  return forwarded ? { ...forwarded, ...parameters } : parameters;
}
