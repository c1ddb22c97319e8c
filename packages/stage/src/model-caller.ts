/**
 * Calling other models from inside a stage: what Triton's business logic scripting
 * (BLS, `pb_utils.InferenceRequest(...).exec()` in a Python model) does, for a
 * TypeScript stage. A server hands one to each stage factory (`options.models`);
 * a call runs the model as any client's request does (its own statistics,
 * batching, cache), on the caller's trace as a child when the request is traced.
 */
import { answersOf, type InferOptions, type InferRequest, type InferResponse, type Stage } from "./stage.js";

export interface ModelCallOptions extends InferOptions {
  /** The version to run; default: the latest ready one. */
  version?: string;
}

export interface ModelCaller {
  /** `model`'s answer to `request` (a decoupled model refuses: use inferStream). */
  infer(model: string, request: InferRequest, options?: ModelCallOptions): Promise<InferResponse>;
  /** `model`'s responses to `request` as they come: any number for a decoupled model, else its one answer. */
  inferStream(model: string, request: InferRequest, options?: ModelCallOptions): AsyncIterable<InferResponse>;
  /** Whether `model` (that version, if given) is loaded and ready (`pb_utils.is_model_ready`). */
  isReady(model: string, version?: string): Promise<boolean>;
}

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
