/**
 * User models import the server's own packages by name, as Triton supplies
 * `triton_python_backend_utils` to every Python model: a repository's
 * `model.mjs` may `import { defineStage } from "@trellis/stage"` with no
 * node_modules beside it. A resolve hook (user-modules-hooks.ts, run by Node's
 * loader thread) takes a bare `@trellis/*` specifier that Node cannot resolve
 * from the importing file and resolves it from the server's install instead.
 * Only `@trellis/*`, and only where Node found nothing: a copy the user
 * installed beside the repository still wins, and no other package is lent.
 */
import { register } from "node:module";
import { isMainThread } from "node:worker_threads";

/** What the hooks module gets: the files whose dependencies user models may borrow, in order. */
export interface UserModulesData {
  /** file: URLs to resolve from: this package's, which depends on every backend and the contract. */
  parents: string[];
}

let registered = false;

/** Registers the resolve hook in this thread (once). Node ≥ 20.6. */
function registerHooks(): void {
  if (registered) return;
  registered = true;
  const parents = [import.meta.url];
  register<UserModulesData>("./user-modules-hooks.js", { parentURL: import.meta.url, data: { parents } });
}

/**
 * Lends the server's `@trellis/*` packages to user models, in this thread and, through
 * `instanceThreads` (`importInInstanceThreads` of @trellis/runtime), in worker-thread
 * instances: Node 20 does not pass hooks on to worker threads, so each imports this module,
 * which registers them there. Call before any model loads.
 */
export function lendOwnPackages(instanceThreads?: (moduleUrl: string) => void): void {
  registerHooks();
  instanceThreads?.(import.meta.url);
}

// Imported by an instance thread (see above): the hooks for that thread.
if (!isMainThread) registerHooks();
