/**
 * Calling other models from inside a stage: what Triton's business logic scripting
 * (BLS, `pb_utils.InferenceRequest(...).exec()` in a Python model) does, for a
 * TypeScript stage. A server hands one to each stage factory (`options.models`);
 * a call runs the model as any client's request does (its own statistics,
 * batching, cache), on the caller's trace as a child when the request is traced.
 */

import type { InferOptions, ModelCaller, ModelCallOptions, Stage } from "@trellis/stage";
import { answersOf } from "@trellis/stage/backend";

// The interface is the contract's (stage.ts, which hands a ModelCaller to factories); made here.

/** A ModelCaller over `resolve` (a model name and optional version → its stage; throws NOT_FOUND / UNAVAILABLE). */
export function createModelCaller(resolve: (model: string, version?: string) => Stage | Promise<Stage>): ModelCaller {
  const optionsFor = (stage: Stage, options: ModelCallOptions | undefined): InferOptions => {
    const { version: _, trace, ...rest } = options ?? {};
    return trace ? { ...rest, trace: trace.child(stage.name, stage.version) } : rest;
  };
  return {
    async infer(model, request, options) {
      const stage = await resolve(model, options?.version);
      return stage.infer(request, optionsFor(stage, options));
    },
    async *inferStream(model, request, options) {
      const stage = await resolve(model, options?.version);
      yield* answersOf(stage, request, optionsFor(stage, options));
    },
    async isReady(model, version) {
      try {
        return await (await resolve(model, version)).isReady();
      } catch {
        return false;
      }
    },
  };
}
