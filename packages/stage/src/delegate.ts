/**
 * delegateStage: a Stage that passes every member of the Stage contract on to another stage,
 * except those it is given. A wrapper written out by hand drops whatever optional method it
 * forgets (a decoupled model's inferStream, a queue's pendingRequests); this one keeps each
 * optional method the inner stage has, and has none it lacks, so `if (stage.inferStream)`
 * still tells a decoupled stage from another.
 */
import type { Stage } from "./stage.js";

/**
 * Members a wrapper gives itself. A key present with the value `undefined` removes that
 * optional member (a wrapper that cannot pass it on: e.g. one whose queue answers once).
 */
export type StageOverrides = { [K in keyof Stage]?: Stage[K] | undefined };

/**
 * Every member of the contract, and whether it is a plain value or a method. Typed as a record
 * of all of Stage's keys: a member added to Stage does not compile until it is listed here,
 * so no wrapper built on delegateStage can drop it.
 */
const MEMBERS: Record<keyof Stage, "value" | "method"> = {
  name: "value",
  version: "value",
  config: "value",
  isReady: "method",
  metadata: "method",
  infer: "method",
  inferStream: "method",
  statistics: "method",
  pendingRequests: "method",
  maxQueueSize: "method",
  close: "method",
};

/**
 * A Stage whose members are `overrides`' (getters included) where it has them, else `inner`'s.
 * Optional methods the inner stage lacks are absent here too. `inner` may be a function: each
 * call then goes to the stage it returns at that moment (a model reloaded in place), and which
 * optional methods exist is decided by the stage it returns now.
 */
export function delegateStage(inner: Stage | (() => Stage), overrides: StageOverrides = {}): Stage {
  const current: () => Stage = typeof inner === "function" ? inner : () => inner;
  const now = current();
  const stage = {} as Stage;
  for (const key of Object.keys(MEMBERS) as (keyof Stage)[]) {
    const own = Object.getOwnPropertyDescriptor(overrides, key);
    if (own) {
      const value = "value" in own ? own.value : undefined;
      // Present but undefined: the wrapper removes the member.
      if ("value" in own && value === undefined) continue;
      Object.defineProperty(stage, key, { ...own, enumerable: true, configurable: true });
      continue;
    }
    if (MEMBERS[key] === "value") {
      Object.defineProperty(stage, key, { get: () => current()[key], enumerable: true, configurable: true });
      continue;
    }
    if (typeof now[key] !== "function") continue;
    // Called as the inner stage's method (`this` is the inner stage), looked up at each call.
    const method = (...args: unknown[]) => {
      const target = current();
      return (target[key] as (...a: unknown[]) => unknown).apply(target, args);
    };
    Object.defineProperty(stage, key, { value: method, enumerable: true, configurable: true, writable: true });
  }
  return stage;
}
