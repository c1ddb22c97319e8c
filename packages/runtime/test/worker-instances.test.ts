/**
 * Instance threads: one call per thread at a time, the rest queued; a crashed thread fails
 * its call INTERNAL and is replaced; errors keep their code; a factory that throws fails the
 * load naming the model; close fails what is in flight UNAVAILABLE; the threads' logs reach
 * the main logger, and they are not given `models`.
 */
import { Code, StageError, type StageLogger } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorkerInstances } from "../dist/index.js";
import { stageModule, workerConfig } from "./worker-helpers.js";

let module: Awaited<ReturnType<typeof stageModule>>;
beforeAll(async () => {
  module = await stageModule();
});
afterAll(() => module.remove());

const start = (instances: number, options: { extra?: string; logger?: StageLogger } = {}) =>
  startWorkerInstances({
    specifier: module.specifier,
    factoryOptions: {
      config: workerConfig("echo", options.extra),
      modelDir: module.dir,
      version: "1",
      versionDir: module.dir,
    },
    instances,
    ...(options.logger ? { logger: options.logger } : {}),
  });

const request = (v: number) => ({
  inputs: [{ name: "IN", datatype: "FP32" as const, shape: [1], data: Float32Array.of(v) }],
});
const threadOf = async (p: ReturnType<Awaited<ReturnType<typeof start>>["infer"]>) =>
  ((await p).outputs.find((t) => t.name === "THREAD")?.data as Int32Array | undefined)?.[0];
const failure = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (err: unknown) => err as StageError,
  );

describe("startWorkerInstances", () => {
  it("replaces a thread that crashes; its call fails INTERNAL naming the model", async () => {
    const logs: unknown[] = [];
    const logger: StageLogger = { info: (o) => logs.push(o), warn: (o) => logs.push(o), error: (o) => logs.push(o) };
    const stage = await start(1, { logger });
    try {
      const before = await threadOf(stage.infer(request(1)));
      const err = await failure(stage.infer(request(-1)));
      expect(err).toBeInstanceOf(StageError);
      expect(err?.code).toBe(Code.Internal);
      expect(err?.message).toContain("echo");
      expect(err?.message).toContain("worker blew up");
      const after = await threadOf(stage.infer(request(2)));
      expect(after).toBeGreaterThan(0);
      expect(after).not.toBe(before);
      expect(stage.isReady()).toBe(true);
      // Each thread's factory logged through the main logger, without being given `models`.
      const loaded = logs.filter((l) => typeof l === "object" && l !== null && "given" in l);
      expect(loaded).toEqual([
        { threadId: before, given: false, instance: 0 },
        { threadId: after, given: false, instance: 0 },
      ]);
    } finally {
      await stage.close();
    }
  });

  it("runs one call per thread, queues the rest, and keeps a StageError's code across threads", async () => {
    const stage = await start(2);
    try {
      expect(stage.instances).toBe(2);
      // Two calls that never answer hold both threads: a third waits.
      const hung = [stage.infer(request(-3)), stage.infer(request(-3))].map(failure);
      const third = failure(stage.infer(request(-2)));
      await new Promise((r) => setTimeout(r, 50));
      expect(stage.pendingRequests?.()).toBe(1);
      await stage.close();
      const errors = await Promise.all([...hung, third]);
      expect(errors.map((e) => e?.code)).toEqual([Code.Unavailable, Code.Unavailable, Code.Unavailable]);
      expect(errors[0]?.message).toContain("echo");
    } finally {
      await stage.close();
    }
    const other = await start(1);
    try {
      const err = await failure(other.infer(request(-2)));
      expect([err?.code, err?.message]).toEqual([Code.FailedPrecondition, "[failed_precondition] echo: not now"]);
      expect(err?.stage).toBe("echo");
    } finally {
      await other.close();
    }
  });

  it("streams a decoupled stage's responses from its thread, in order", async () => {
    const stage = await start(1, { extra: "model_transaction_policy { decoupled: true }" });
    try {
      const got: number[] = [];
      for await (const r of stage.inferStream?.(request(3)) ?? [])
        got.push((r.outputs[0]?.data as Float32Array | undefined)?.[0] ?? 0);
      expect(got).toEqual([3, 2, 1]);
      // A consumer that stops early leaves the thread free for the next call.
      for await (const _ of stage.inferStream?.(request(5)) ?? []) break;
      const again: number[] = [];
      for await (const r of stage.inferStream?.(request(2)) ?? [])
        again.push((r.outputs[0]?.data as Float32Array | undefined)?.[0] ?? 0);
      expect(again).toEqual([2, 1]);
    } finally {
      await stage.close();
    }
  });

  it("fails the load when a thread's factory throws, with its error naming the model", async () => {
    const err = await failure(start(2, { extra: `parameters { key: "fail_factory" value: { string_value: "1" } }` }));
    expect(err).toBeInstanceOf(StageError);
    expect([err?.code, err?.rawMessage]).toEqual([Code.InvalidArgument, "echo: factory refused"]);
  });

  it("fails the load when the module cannot be imported, without the worker's own path", async () => {
    const err = await failure(
      startWorkerInstances({
        specifier: `${module.specifier.replace("model.mjs", "absent.mjs")}`,
        label: "model.mjs",
        factoryOptions: { config: workerConfig("absent"), modelDir: module.dir, version: "1", versionDir: module.dir },
      }),
    );
    expect(err?.code).toBe(Code.NotFound);
    expect(err?.rawMessage).toMatch(/^absent: cannot import model\.mjs: /);
    expect(err?.rawMessage).not.toContain("instance-worker");
  });
});
