/**
 * A decoupled stage (model_transaction_policy { decoupled: true }) as one
 * contract over every transport: served on a real HTTP/2 port, reached with
 * connectStage over gRPC and in memory, its responses come back one by one
 * through inferStream, as they do in-process.
 */

import { connectStage, grpcTransport } from "@trellis/kserve";
import { parseModelConfig } from "@trellis/protocol";
import type { InferResponse, Stage } from "@trellis/stage";
import { Code, defineStage, StageError, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ListeningServer, listenStage } from "../src/grpc/serve.js";
import { inMemoryTransport } from "../src/index.js";

const config = parseModelConfig(`name: "count" backend: "typescript" max_batch_size: 0
  input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
  output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
  model_transaction_policy { decoupled: true }`);

/** Counts 1..N, one response each; N = 13 fails after three. */
const counting = (): Stage =>
  defineStage({
    config,
    async *computeStream(request) {
      const n = Number(request.inputs[0]?.data[0] ?? 0);
      for (let i = 1; i <= n; i++) {
        if (n === 13 && i === 4) throw new StageError(Code.InvalidArgument, "count", "unlucky");
        yield [tensor("I", "INT32", [1], Int32Array.of(i))];
      }
    },
  });

const asking = (n: number) => ({ id: `n${n}`, inputs: [tensor("N", "INT32", [1], Int32Array.of(n))] });
async function counted(stage: Stage, n: number): Promise<number[]> {
  const values: number[] = [];
  for await (const r of stage.inferStream?.(asking(n)) ?? []) {
    values.push(Number((r as InferResponse).outputs[0]?.data[0]));
  }
  return values;
}

let server: ListeningServer;
beforeAll(async () => {
  server = await listenStage(counting());
});
afterAll(async () => {
  await server.close();
});

describe("a decoupled stage, remote", () => {
  it("sends its responses one by one through connectStage's inferStream, over gRPC and in memory", async () => {
    const overGrpc = await connectStage(grpcTransport(server.url), "count");
    const inMemory = await connectStage(inMemoryTransport(counting()), "count");
    for (const stage of [counting(), overGrpc, inMemory]) {
      expect(await counted(stage, 4)).toEqual([1, 2, 3, 4]);
      expect(await counted(stage, 0)).toEqual([]);
    }
    // Requests at once on one remote stage each get their own responses.
    expect(await Promise.all([counted(overGrpc, 2), counted(overGrpc, 3)])).toEqual([
      [1, 2],
      [1, 2, 3],
    ]);
  });

  it("fails a remote request mid-stream with the model's message, after the responses sent before", async () => {
    const remote = await connectStage(grpcTransport(server.url), "count", { remoteLabel: server.url });
    const seen: number[] = [];
    const failed = await rejectionOf(
      (async () => {
        for await (const r of remote.inferStream!(asking(13))) seen.push(Number(r.outputs[0]?.data[0]));
      })(),
      StageError,
    );
    expect(seen).toEqual([1, 2, 3]);
    expect(failed.rawMessage).toBe(`count: remote model count at ${server.url}: count: unlucky`);
  });

  it("stops a model's responses when the client goes away, even one that does not watch its signal", async () => {
    let sent = 0;
    let stopped = false;
    const endless = defineStage({
      config,
      async *computeStream() {
        try {
          for (;;) {
            await new Promise((r) => setTimeout(r, 5));
            sent++;
            yield [tensor("I", "INT32", [1], Int32Array.of(sent))];
          }
        } finally {
          stopped = true;
        }
      },
    });
    const own = await listenStage(endless);
    try {
      const remote = await connectStage(grpcTransport(own.url), "count");
      const controller = new AbortController();
      let read = 0;
      await rejectionOf(
        (async () => {
          for await (const _ of remote.inferStream!(asking(1), { signal: controller.signal })) {
            if (++read === 3) controller.abort();
          }
        })(),
        StageError,
      );
      for (let i = 0; i < 100 && !stopped; i++) await new Promise((r) => setTimeout(r, 10));
      expect(stopped).toBe(true);
      const after = sent;
      await new Promise((r) => setTimeout(r, 50));
      expect(sent).toBe(after);
    } finally {
      await own.close();
    }
  });

  it("refuses the one-answer call remotely as in-process: UNIMPLEMENTED", async () => {
    const remote = await connectStage(grpcTransport(server.url), "count");
    const err = await rejectionOf(remote.infer(asking(2)), StageError);
    expect(err.code).toBe(Code.Unimplemented);
    expect(err.rawMessage).toContain("the model is decoupled (model_transaction_policy)");
  });
});
