/**
 * Node module-resolution hooks (registered by user-modules.ts; they run in
 * Node's loader thread): a bare `@trellis/*` specifier that Node cannot
 * resolve from the importing file is resolved from the server's install.
 */
import type { InitializeHook, ResolveHook } from "node:module";
import type { UserModulesData } from "./user-modules.js";

let parents: string[] = [];

export const initialize: InitializeHook<UserModulesData> = (data) => {
  parents = data.parents;
};

const notFound = (err: unknown): boolean => (err as { code?: unknown } | null)?.code === "ERR_MODULE_NOT_FOUND";

export const resolve: ResolveHook = async (specifier, context, nextResolve) => {
  if (!specifier.startsWith("@trellis/")) return nextResolve(specifier, context);
  try {
    return await nextResolve(specifier, context);
  } catch (err) {
    if (!notFound(err)) throw err;
    for (const parentURL of parents) {
      try {
        return await nextResolve(specifier, { ...context, parentURL });
      } catch (again) {
        if (!notFound(again)) throw again;
      }
    }
    // Not one of the server's packages either: Node's own error, naming the importing file.
    throw err;
  }
};
