/**
 * grpcTransport under tensor-sized concurrent load: many requests of 10 MB and more, started a few
 * milliseconds apart on one HTTP/2 connection, each answered (node's 10 MB default session memory
 * made the client refuse answers once more than that waited to be sent). And a stream the server
 * refuses before processing it (RST_STREAM REFUSED_STREAM or ENHANCE_YOUR_CALM, no answer) is
 * resent, a bounded number of times, and reported as never run when refused every time.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { connectStage, grpcTransport, neverSent, REFUSED_STREAM_RESENDS } from "@trellis/kserve";
import { HTTP2_SETTINGS } from "@trellis/kserve/wire";
import { DataType, ModelConfigSchema, ModelInputSchema, ModelOutputSchema } from "@trellis/protocol";
import {
  Code,
  defineStage,
  type InferRequest,
  type InferResponse,
  type Stage,
  StageError,
  type Tensor,
} from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ListeningServer, listenStage, serveStage } from "../src/grpc/serve.js";

/** A stage that reduces its FP32 input X to [sum, element count] (FP64), counting its runs. */
function sumStage(): Stage & { runs: number } {
  const config = create(ModelConfigSchema, {
    name: "sum",
    backend: "typescript",
    maxBatchSize: 0,
    input: [create(ModelInputSchema, { name: "X", dataType: DataType.TYPE_FP32, dims: [-1n] })],
    output: [create(ModelOutputSchema, { name: "SUM", dataType: DataType.TYPE_FP64, dims: [2n] })],
  });
  const stage = defineStage({
    config,
    compute(req: InferRequest) {
      counted.runs++;
      const x = req.inputs[0]?.data as Float32Array;
      let sum = 0;
      for (let i = 0; i < x.length; i++) sum += x[i] as number;
      return [{ name: "SUM", datatype: "FP64", shape: [2], data: new Float64Array([sum, x.length]) } as Tensor];
    },
  });
  const counted = Object.assign(stage, { runs: 0 });
  return counted;
}

/** Request `i` of `elements` FP32 values, each i + 1 (so its answer names it: sum (i + 1) × elements). */
function filled(i: number, elements: number): InferRequest {
  return { inputs: [{ name: "X", datatype: "FP32", shape: [elements], data: new Float32Array(elements).fill(i + 1) }] };
}

/** The [sum, count] a sumStage answered. */
const answer = (res: InferResponse) => Array.from((res.outputs[0]?.data ?? []) as Float64Array);

/** One image of 3×224×224 FP32, as the ResNet-50 ensemble sends (602,112 bytes). */
const IMAGE = 3 * 224 * 224;

/**
 * Starts requests of `sizes` (FP32 elements each) one after another, `gapMs` apart, all on `remote`,
 * and resolves with what each one settled to: its [sum, count], or its error's message.
 */
async function staggered(remote: Stage, sizes: number[], gapMs: number): Promise<string[]> {
  const calls: Promise<string>[] = [];
  for (const [i, n] of sizes.entries()) {
    calls.push(
      remote.infer(filled(i, n)).then(
        (res) => `${i}: ${answer(res).join(" ")}`,
        (err: unknown) => `${i}: ${err instanceof Error ? err.message : String(err)}`,
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, gapMs));
  }
  return Promise.all(calls);
}

const expected = (sizes: number[]) => sizes.map((n, i) => `${i}: ${(i + 1) * n} ${n}`);

describe("grpcTransport with staggered concurrent requests of 10 MB and more", () => {
  let stage: ReturnType<typeof sumStage>;
  let server: ListeningServer;
  beforeAll(async () => {
    stage = sumStage();
    server = await listenStage(stage);
  });
  afterAll(async () => {
    await server.close();
  });

  it("answers 8 requests of 12 MB each, started 3 ms apart on one connection", async () => {
    const transport = grpcTransport(server.url);
    try {
      const remote = await connectStage(transport, "sum");
      const sizes = Array.from({ length: 8 }, () => 3_000_000);
      const before = stage.runs;
      expect(await staggered(remote, sizes, 3)).toEqual(expected(sizes));
      expect(stage.runs - before).toBe(sizes.length);
    } finally {
      transport.close();
    }
  });

  it("answers a mix of batches (2 × 64, 4 × 16 and 16 × 8 images of 3×224×224), interleaved", async () => {
    const transport = grpcTransport(server.url);
    try {
      const remote = await connectStage(transport, "sum");
      const sizes: number[] = [];
      for (let round = 0; round < 2; round++) {
        sizes.push(64 * IMAGE, 16 * IMAGE, 16 * IMAGE);
        for (let k = 0; k < 8; k++) sizes.push(8 * IMAGE);
      }
      const before = stage.runs;
      expect(await staggered(remote, sizes, 2)).toEqual(expected(sizes));
      expect(stage.runs - before).toBe(sizes.length);
    } finally {
      transport.close();
    }
  });
});

/**
 * A real HTTP/2 gRPC server serving `stage` that resets the first `refusals` ModelInfer streams
 * with `rstCode` as soon as their headers arrive, before reading or running anything (with
 * `afterAnswerHeaders`, once it has sent its answer's headers: it may have run the request).
 */
async function refusingServer(stage: Stage, rstCode: number, refusals: number, afterAnswerHeaders = false) {
  const adapter = connectNodeAdapter({ routes: serveStage(stage) });
  const seen = { inferStreams: 0, refused: 0 };
  const policy = { refusals };
  const server = http2.createServer({ settings: HTTP2_SETTINGS }, (req, res) => {
    if (req.url.endsWith("/ModelInfer")) {
      seen.inferStreams++;
      if (seen.refused < policy.refusals) {
        seen.refused++;
        if (!afterAnswerHeaders) {
          req.stream.close(rstCode);
          return;
        }
        // The answer's headers and the start of a message (a gRPC envelope's prefix), then the reset.
        req.stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        req.stream.write(Buffer.from([0, 0, 0, 0, 100]), () => req.stream.close(rstCode));
        return;
      }
    }
    adapter(req, res);
  });
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    policy,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sessions) s.close();
      }),
  };
}

describe("a stream the server refuses before processing it", () => {
  const { NGHTTP2_REFUSED_STREAM, NGHTTP2_ENHANCE_YOUR_CALM } = http2.constants;

  for (const [codeName, rstCode] of [
    ["REFUSED_STREAM", NGHTTP2_REFUSED_STREAM],
    ["ENHANCE_YOUR_CALM", NGHTTP2_ENHANCE_YOUR_CALM],
  ] as const) {
    it(`is resent after a ${codeName} reset and answered, the model run once`, async () => {
      const stage = sumStage();
      const server = await refusingServer(stage, rstCode, 1);
      const transport = grpcTransport(server.url);
      try {
        const remote = await connectStage(transport, "sum");
        const res = await remote.infer(filled(4, 1000));
        expect(answer(res)).toEqual([5000, 1000]);
        expect(server.seen).toEqual({ inferStreams: 2, refused: 1 });
        expect(stage.runs).toBe(1);
      } finally {
        transport.close();
        await server.close();
      }
    });
  }

  it("refused every time: UNAVAILABLE saying it never ran, after a bounded number of resends", async () => {
    const stage = sumStage();
    const server = await refusingServer(stage, NGHTTP2_REFUSED_STREAM, Number.POSITIVE_INFINITY);
    const transport = grpcTransport(server.url);
    try {
      const remote = await connectStage(transport, "sum");
      const err = await rejectionOf(remote.infer(filled(0, 1000)), StageError);
      expect(err.code).toBe(Code.Unavailable);
      expect(err.message).toMatch(
        /remote model sum: refused by its server before processing \(not run; sent 3 times\): /,
      );
      expect(err.message).not.toMatch(/connection lost|may have reached the server/);
      expect(neverSent(err)).toBe(true);
      expect(server.seen.inferStreams).toBe(1 + REFUSED_STREAM_RESENDS);
      expect(stage.runs).toBe(0);
      // The connection still serves: the next request (once the server stops refusing) is answered.
      server.policy.refusals = 0;
      const res = await remote.infer(filled(1, 10));
      expect(answer(res)).toEqual([20, 10]);
      expect(stage.runs).toBe(1);
    } finally {
      transport.close();
      await server.close();
    }
  });

  it("an ENHANCE_YOUR_CALM reset after the answer began is not resent: it may have run", async () => {
    const stage = sumStage();
    const server = await refusingServer(stage, NGHTTP2_ENHANCE_YOUR_CALM, 1, true);
    const transport = grpcTransport(server.url);
    try {
      const remote = await connectStage(transport, "sum");
      const err = await rejectionOf(remote.infer(filled(0, 1000)), StageError);

      expect(err.code).toBe(Code.Unavailable);
      expect(err.message).toMatch(/not resent: it may have reached the server/);
      expect(neverSent(err)).toBe(false);
      expect(server.seen).toEqual({ inferStreams: 1, refused: 1 });
    } finally {
      transport.close();
      await server.close();
    }
  });
});
