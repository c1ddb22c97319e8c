/**
 * What crosses to an instance thread: a buffer the sender owns moves (detached here once
 * sent), a view into a larger buffer is copied alone; requests are copied unless the
 * caller lets them move; answers come back in buffers of their own size.
 */
import { MessageChannel } from "node:worker_threads";
import type { Tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorkerInstances } from "../dist/index.js";
import { portableTensor } from "../dist/instances/protocol.js";
import { stageModule, workerConfig } from "./worker-helpers.js";

/** Posts `value` over a MessageChannel with `transfer` and resolves with what arrives. */
async function send<T>(value: T, transfer: ArrayBuffer[]): Promise<T> {
  const { port1, port2 } = new MessageChannel();
  const arrived = new Promise<T>((resolve) => port2.once("message", resolve));
  port1.postMessage(value, transfer);
  const got = await arrived;
  port1.close();
  return got;
}

const fp32 = (data: Float32Array): Tensor => ({ name: "IN", datatype: "FP32", shape: [data.length], data });

describe("portableTensor", () => {
  it("moves a buffer the tensor owns: detached on the sender's side once sent", async () => {
    const data = Float32Array.of(1, 2, 3);
    const transfer: ArrayBuffer[] = [];
    const t = portableTensor(fp32(data), transfer, true);
    expect(t.data).toBe(data);
    expect(transfer).toEqual([data.buffer]);
    const got = await send(t, transfer);
    expect(data.buffer.byteLength).toBe(0);
    expect(Array.from(got.data as Float32Array)).toEqual([1, 2, 3]);
  });

  it("copies a view into a larger buffer it does not own, alone: the larger buffer stays", async () => {
    const whole = new Float32Array(1024).fill(7);
    const view = whole.subarray(10, 13);
    view.set([1, 2, 3]);
    const transfer: ArrayBuffer[] = [];
    const t = portableTensor(fp32(view), transfer, true);
    expect(t.data).not.toBe(view);
    const got = await send(t, transfer);
    expect(whole.buffer.byteLength).toBe(4096);
    expect(Array.from(view)).toEqual([1, 2, 3]);
    const data = got.data as Float32Array;
    expect(Array.from(data)).toEqual([1, 2, 3]);
    expect(data.buffer.byteLength).toBe(12);
  });

  it("copies an owned buffer too when not asked to move it", async () => {
    const data = Float32Array.of(4, 5);
    const transfer: ArrayBuffer[] = [];
    await send(portableTensor(fp32(data), transfer, false), transfer);
    expect(Array.from(data)).toEqual([4, 5]);
  });

  it("packs BYTES elements that are views into one buffer of their own", async () => {
    const body = new TextEncoder().encode("xxhelloworldxx");
    const items = [body.subarray(2, 7), body.subarray(7, 12)];
    const transfer: ArrayBuffer[] = [];
    const t = portableTensor({ name: "S", datatype: "BYTES", shape: [2], data: items }, transfer, true);
    const got = await send(t, transfer);
    expect(body.byteLength).toBe(14);
    const elements = got.data as Uint8Array[];
    expect(elements.map((e) => new TextDecoder().decode(e))).toEqual(["hello", "world"]);
    expect(elements[0]?.buffer.byteLength).toBe(10);
  });

  it("packs a large BYTES tensor of owned elements into one buffer, in one pass (1,000,000 elements)", async () => {
    const items = Array.from({ length: 1_000_000 }, (_, i) => Uint8Array.of(i % 251));
    const transfer: ArrayBuffer[] = [new ArrayBuffer(8)];
    const t = portableTensor({ name: "S", datatype: "BYTES", shape: [items.length], data: items }, transfer, true);
    // One packed buffer added to the list, not a million: the caller's elements stay usable.
    expect(transfer).toHaveLength(2);
    expect(items[999_999]?.byteLength).toBe(1);
    const elements = t.data as Uint8Array[];
    expect(elements[0]?.buffer).toBe(transfer[1]);
    expect(elements[999_999]?.[0]).toBe(999_999 % 251);
  });

  it("moves a few owned BYTES elements as they are, one buffer each", () => {
    const items = [Uint8Array.of(1), Uint8Array.of(2, 3)];
    const transfer: ArrayBuffer[] = [];
    const t = portableTensor({ name: "S", datatype: "BYTES", shape: [2], data: items }, transfer, true);
    expect(t.data).toBe(items);
    expect(transfer).toEqual(items.map((b) => b.buffer));
  });
});

describe("requests and answers through instance threads", () => {
  let module: Awaited<ReturnType<typeof stageModule>>;
  beforeAll(async () => {
    module = await stageModule();
  });
  afterAll(() => module.remove());

  const start = (moveRequests: boolean) =>
    startWorkerInstances({
      specifier: module.specifier,
      factoryOptions: { config: workerConfig("echo"), modelDir: module.dir, version: "1", versionDir: module.dir },
      instances: 1,
      moveRequests,
    });

  it("with moveRequests, an owned input moves (detached here) and a view is copied; answers arrive whole", async () => {
    const stage = await start(true);
    try {
      const owned = Float32Array.of(1, 2, 3);
      const answer = await stage.infer({ inputs: [fp32(owned)] });
      expect(owned.buffer.byteLength).toBe(0);
      const out = answer.outputs.find((t) => t.name === "OUT")?.data as Float32Array;
      expect(Array.from(out)).toEqual([1, 2, 3]);
      expect(out.buffer.byteLength).toBe(12);

      const whole = new Float32Array(256);
      const view = whole.subarray(4, 6);
      view.set([8, 9]);
      const again = await stage.infer({ inputs: [fp32(view)] });
      expect(whole.buffer.byteLength).toBe(1024);
      expect(Array.from(again.outputs[0]?.data as Float32Array)).toEqual([8, 9]);
    } finally {
      await stage.close();
    }
  });

  it("by default, the caller's input buffers stay its own", async () => {
    const stage = await start(false);
    try {
      const owned = Float32Array.of(5, 6);
      const answer = await stage.infer({ inputs: [fp32(owned)] });
      expect(Array.from(owned)).toEqual([5, 6]);
      expect(Array.from(answer.outputs[0]?.data as Float32Array)).toEqual([5, 6]);
    } finally {
      await stage.close();
    }
  });
});
