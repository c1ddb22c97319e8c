/**
 * The response cache as an interceptor: a request whose answer the cache holds is answered from
 * it, before the model's queue (as Triton's: a cached answer is served even while the queue is
 * full); another runs and its answer is kept. Hits and misses are counted in the model's own
 * statistics, as Triton counts them.
 */
import { nowNs } from "@trellis/stage";
import { type ResponseStore, responseCacheKey } from "../response-cache.js";
import type { ModelInterceptor } from "./chain.js";

/** The response cache a model uses, and the scope its keys are made in (model, version, which load). */
export interface ModelCache {
  store: ResponseStore;
  scope: string;
}

export function cacheInterceptor({ store, scope }: ModelCache): ModelInterceptor {
  return {
    name: "cache",
    infer: (next, { recorder }) => {
      return async (request, options) => {
        const started = nowNs();
        const key = responseCacheKey(scope, request);
        const hit = await store.lookup(key, request);
        if (hit) {
          recorder.cacheHit(nowNs() - started);
          return hit;
        }
        const lookupNs = nowNs() - started;
        const response = await next(request, options);
        const inserting = nowNs();
        await store.insert(key, response);
        // Triton's cache-miss time: the lookup plus the insertion, not the execution between them.
        recorder.cacheMiss(lookupNs + (nowNs() - inserting));
        return response;
      };
    },
  };
}
