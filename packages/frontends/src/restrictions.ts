/**
 * Triton's restricted APIs (--http-restricted-api, --grpc-restricted-protocol):
 * each group of endpoints can require a header with a set value, so an
 * operator can keep, say, model loading and log settings to those who hold a
 * key while inference stays open.
 */
import type { Interceptor } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";

export const API_CATEGORIES = [
  "health",
  "metadata",
  "inference",
  "shared-memory",
  "model-config",
  "model-repository",
  "statistics",
  "trace",
  "logging",
] as const;
export type ApiCategory = (typeof API_CATEGORIES)[number];

/** Per category, the header a request must carry (lower case) and its value. */
export type ApiRestrictions = Partial<Record<ApiCategory, { header: string; value: string }>>;

/** Which flag a restriction came from: its name in Triton's messages, and what it restricts. */
export interface RestrictionFlag {
  /** The flag without its dashes, "http-restricted-api" or "grpc-restricted-protocol". */
  option: string;
  /** What each category names: an "api" (HTTP) or a "protocol" (gRPC). */
  feature: "api" | "protocol";
}

const HTTP_RESTRICTION: RestrictionFlag = { option: "http-restricted-api", feature: "api" };

/**
 * Adds one restriction in Triton's syntax, "<category>[,<category>...]:<header>=<value>",
 * to `into`; throws an Error saying what is wrong with `spec`, in tritonserver's words
 * (its command-line parser's ParseRestrictedFeatureOption).
 */
export function parseRestriction(
  spec: string,
  into: ApiRestrictions = {},
  flag: RestrictionFlag = HTTP_RESTRICTION,
): ApiRestrictions {
  const colon = spec.indexOf(":");
  const equals = spec.indexOf("=", colon + 1);
  if (colon <= 0 || equals <= colon + 1 || equals === spec.length - 1) {
    throw new Error(`--${flag.option} option format is '<config name>:<setting>=<value>'. Got ${spec}`);
  }
  const header = spec
    .slice(colon + 1, equals)
    .trim()
    .toLowerCase();
  const value = spec.slice(equals + 1);
  for (const name of spec.slice(0, colon).split(",")) {
    const category = name.trim() as ApiCategory;
    if (!API_CATEGORIES.includes(category)) throw new Error(`unknown restricted ${flag.feature} '${name}'`);
    if (into[category]) {
      throw new Error(`restricted ${flag.feature} '${name}' can not be specified in multiple config groups`);
    }
    into[category] = { header, value };
  }
  return into;
}

const GRPC_CATEGORIES: Record<string, ApiCategory> = {
  ServerLive: "health",
  ServerReady: "health",
  ModelReady: "health",
  ServerMetadata: "metadata",
  ModelMetadata: "metadata",
  ModelInfer: "inference",
  ModelStreamInfer: "inference",
  ModelConfig: "model-config",
  ModelStatistics: "statistics",
  RepositoryIndex: "model-repository",
  RepositoryModelLoad: "model-repository",
  RepositoryModelUnload: "model-repository",
  SystemSharedMemoryStatus: "shared-memory",
  SystemSharedMemoryRegister: "shared-memory",
  SystemSharedMemoryUnregister: "shared-memory",
  CudaSharedMemoryStatus: "shared-memory",
  CudaSharedMemoryRegister: "shared-memory",
  CudaSharedMemoryUnregister: "shared-memory",
  TraceSetting: "trace",
  LogSettings: "logging",
};

/** The category of a gRPC method ("inference.GRPCInferenceService", "ModelInfer"); grpc.health.v1 is health. */
export function grpcMethodCategory(service: string, method: string): ApiCategory | undefined {
  if (service === "grpc.health.v1.Health") return "health";
  return service === "inference.GRPCInferenceService" ? GRPC_CATEGORIES[method] : undefined;
}

/**
 * Why a request to `category` is refused, naming the header it lacks, or undefined when it may
 * go on. `header(name)` reads the request's header (name in lower case). As Triton words and
 * codes it: over HTTP/REST, PERMISSION_DENIED (403) "This API is restricted, ..."
 * (src/http_server.cc RespondIfRestricted); a gRPC method, UNAVAILABLE "This protocol is
 * restricted, ..." (src/grpc/grpc_server.cc).
 */
export function restrictionError(
  restrictions: ApiRestrictions | undefined,
  category: ApiCategory | undefined,
  header: (name: string) => string | null | undefined,
  protocol: "http" | "grpc" = "http",
): ConnectError | undefined {
  const rule = category && restrictions?.[category];
  if (!rule || header(rule.header) === rule.value) return undefined;
  const what = `expecting header '${rule.header}' (the ${category} endpoints)`;
  return protocol === "grpc"
    ? new ConnectError(`This protocol is restricted, ${what}`, Code.Unavailable)
    : new ConnectError(`This API is restricted, ${what}`, Code.PermissionDenied);
}

/** A Connect server interceptor enforcing `restrictions` on every call it sees (gRPC, gRPC-Web, Connect: refused as gRPC). */
export function restrictionInterceptor(restrictions: ApiRestrictions): Interceptor {
  return (next) => async (req) => {
    const refused = restrictionError(
      restrictions,
      grpcMethodCategory(req.service.typeName, req.method.name),
      (h) => req.header.get(h),
      "grpc",
    );
    if (refused) throw refused;
    return next(req);
  };
}
