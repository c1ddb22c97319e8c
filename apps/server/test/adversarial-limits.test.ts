/**
 * Adversarial: request size limits on every transport (issue 18 item 4). A
 * compressed message is held to the size cap once decompressed, the
 * decompression stops at the cap (a 512 MiB gzip bomb of 512 KB does not
 * grow the server by its size), a declared length over the cap is refused as
 * soon as the 5-byte prefix (or the Content-Length) arrives, and each refusal
 * names the limit and the flag that raises it. After each, a good request
 * still answers correctly. Black-box: the real server with its default caps.
 */
import { readFileSync } from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import { brotliCompressSync, constants, deflateSync, gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { compressedFlag, encodeEnvelope } from "@connectrpc/connect/protocol";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, echoInferMessage, makeRepository, rawPost } from "./helpers.js";

const MiB = 1024 * 1024;
/** The default cap of both ports: Triton's --http-max-input-size default, 64 MiB. */
const CAP = 64 * MiB;
/** How long an answer may take: a refusal that waits for a body that never comes never answers. */
const ANSWER_BOUND_MS = 20_000;

const GRPC_LIMIT = (limit: number) =>
  `exceeds the maximum allowed value of ${limit} bytes; use --grpc-max-input-size to increase the limit`;
const HTTP_LIMIT = (limit: number) =>
  `exceeds the maximum allowed value of ${limit} bytes; use --http-max-input-size to increase the limit`;

/** The REST frontend's words for a body over the limit: Triton's (http_server.cc EVBufferToJson). */
const HTTP_BODY_LIMIT = (limit: number) =>
  `exceeds the maximum allowed input size of ${limit} bytes. Use --http-max-input-size to increase the limit.`;

const MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer";

/** A ModelInfer of the echo model: [1, 2, 3, 4] in, the same out. */
const goodMessage = () => echoInferMessage();

/**
 * A valid ModelInferRequest of `size` bytes of zeros in raw_input_contents, as gzip:
 * the header in one member, then 1 MiB members of zeros (about 1 KB each), so a
 * 512 MiB message is about 512 KB on the wire and cheap to build.
 */
function gzipBomb(size: number): Buffer {
  const head = toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: "echo",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, BigInt(size / 4)] }],
    }),
  );
  const length: number[] = [];
  for (let n = size; ; n = Math.floor(n / 128)) {
    if (n < 128) {
      length.push(n);
      break;
    }
    length.push((n % 128) | 0x80);
  }
  // Field 7 (raw_input_contents), length-delimited.
  const members = [gzipSync(Buffer.concat([head, Buffer.from([(7 << 3) | 2, ...length])]))];
  const zeros = gzipSync(Buffer.alloc(MiB), { level: 9 });
  for (let i = 0; i < size / MiB; i++) members.push(zeros);
  return Buffer.concat(members);
}

/** `size` bytes of zeros compressed with `coding` (fast settings: zeros compress well at any level). */
function zeros(coding: "gzip" | "deflate" | "br", size: number): Buffer {
  const plain = Buffer.alloc(size);
  if (coding === "gzip") return gzipSync(plain, { level: 1 });
  if (coding === "deflate") return deflateSync(plain, { level: 1 });
  return brotliCompressSync(plain, { params: { [constants.BROTLI_PARAM_QUALITY]: 1 } });
}

interface GrpcAnswer {
  grpcStatus?: string;
  grpcMessage?: string;
  body: Buffer;
  error?: Error;
}

/**
 * A gRPC call as raw HTTP/2 frames: `headers` added to a ModelInfer's, `body` written and the
 * stream ended unless `keepOpen` (then the client never sends the rest). Resolves with the
 * status trailers, or rejects when none come within ANSWER_BOUND_MS.
 */
function rawCall(
  session: http2.ClientHttp2Session,
  body: Uint8Array,
  headers: http2.OutgoingHttpHeaders = {},
  keepOpen = false,
): Promise<GrpcAnswer> {
  const stream = session.request({
    ":method": "POST",
    ":path": MODEL_INFER,
    "content-type": "application/grpc",
    te: "trailers",
    ...headers,
  });
  if (keepOpen) stream.write(body);
  else stream.end(body);
  const chunks: Buffer[] = [];
  stream.on("data", (c: Buffer) => chunks.push(c));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      stream.close();
      reject(new Error(`no answer within ${ANSWER_BOUND_MS} ms`));
    }, ANSWER_BOUND_MS);
    const answer: GrpcAnswer = { body: Buffer.alloc(0) };
    const done = () => {
      clearTimeout(timer);
      answer.body = Buffer.concat(chunks);
      resolve(answer);
    };
    stream.on("response", (h) => {
      // A trailers-only answer carries the status in its headers.
      if (h["grpc-status"] !== undefined) {
        answer.grpcStatus = String(h["grpc-status"]);
        answer.grpcMessage = decodeURIComponent(String(h["grpc-message"] ?? ""));
        if (keepOpen) done();
      }
    });
    stream.on("trailers", (t) => {
      answer.grpcStatus = String(t["grpc-status"]);
      answer.grpcMessage = decodeURIComponent(String(t["grpc-message"] ?? ""));
      if (keepOpen) done();
    });
    stream.on("error", (error) => {
      answer.error = error;
    });
    stream.on("close", done);
  });
}

/** The echo model answers [1, 2, 3, 4] on `session` (the direct path: uncompressed). */
async function expectGoodCall(session: http2.ClientHttp2Session): Promise<void> {
  const answer = await rawCall(session, encodeEnvelope(0, goodMessage()));
  expect(answer.grpcStatus).toBe("0");
  // Envelope (5) + the response; its last 16 bytes are the raw output [1, 2, 3, 4].
  const out = answer.body.subarray(answer.body.length - 16);
  expect([...new Float32Array(Uint8Array.from(out).buffer)]).toEqual([1, 2, 3, 4]);
}

/** The echo model answers over REST. */
async function expectGoodRest(server: ServerProcess): Promise<void> {
  const res = await fetch(`${server.http}/v2/models/echo/infer`, {
    method: "POST",
    body: JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
  });
  expect(res.status).toBe(200);
  expect(((await res.json()) as { outputs: { data: number[] }[] }).outputs[0]?.data).toEqual([1, 2, 3, 4]);
}

/** An 80 MiB message gzipped by Connect's client is refused naming the limit; a good one then answers. */
async function expectBombRefusedThenGood(
  client: ReturnType<typeof createClient<typeof GRPCInferenceService>>,
  limit: string,
): Promise<void> {
  const infer = (bytes: Uint8Array) =>
    client.modelInfer({
      modelName: "echo",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, BigInt(bytes.byteLength / 4)] }],
      rawInputContents: [bytes],
    });
  const err = await infer(new Uint8Array(80 * MiB)).then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );
  expect(err?.code).toBe(Code.ResourceExhausted);
  expect(err?.rawMessage).toBe(`gzip-decompressed request message of more than ${CAP} bytes ${limit}`);
  const ok = await infer(new Uint8Array(new Float32Array([1, 2, 3, 4]).buffer));
  expect([...new Float32Array(Uint8Array.from(ok.rawOutputContents[0] ?? []).buffer)]).toEqual([1, 2, 3, 4]);
}

/** The server process's peak resident set so far (VmHWM), in bytes. */
function peakRss(server: ServerProcess): number {
  const status = readFileSync(`/proc/${server.proc.pid}/status`, "utf8");
  const kb = /^VmHWM:\s+(\d+) kB$/m.exec(status)?.[1];
  if (!kb) throw new Error("no VmHWM in /proc/<pid>/status");
  return Number(kb) * 1024;
}

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  await server?.stop();
  await removeDir(repo);
});

describe("gRPC port, default cap", () => {
  it("refuses a 512 MiB gzip bomb ModelInfer (raw HTTP/2) RESOURCE_EXHAUSTED naming the cap and flag, without inflating it, then answers", async () => {
    const session = http2.connect(server.grpc);
    try {
      await expectGoodCall(session);
      const bomb = gzipBomb(512 * MiB);
      expect(bomb.byteLength).toBeLessThan(MiB);
      const before = peakRss(server);
      const answer = await rawCall(session, encodeEnvelope(compressedFlag, bomb), { "grpc-encoding": "gzip" });
      const growth = peakRss(server) - before;
      expect(answer.grpcStatus).toBe(String(Code.ResourceExhausted));
      expect(answer.grpcMessage).toBe(`gzip-decompressed request message of more than ${CAP} bytes ${GRPC_LIMIT(CAP)}`);
      // Inflating all of it took more than the whole message (512 MiB); the cap leaves 64 MiB at most.
      expect(growth).toBeLessThan(256 * MiB);
      await expectGoodCall(session);
    } finally {
      session.close();
    }
  });

  it("refuses deflate and br bombs the same way", async () => {
    const session = http2.connect(server.grpc);
    try {
      for (const coding of ["deflate", "br"] as const) {
        const answer = await rawCall(session, encodeEnvelope(compressedFlag, zeros(coding, 80 * MiB)), {
          "grpc-encoding": coding,
        });
        expect(answer.grpcStatus, coding).toBe(String(Code.ResourceExhausted));
        expect(answer.grpcMessage, coding).toBe(
          `${coding}-decompressed request message of more than ${CAP} bytes ${GRPC_LIMIT(CAP)}`,
        );
        await expectGoodCall(session);
      }
    } finally {
      session.close();
    }
  });

  it("refuses a gzip bomb sent by Connect's gRPC client RESOURCE_EXHAUSTED naming the cap and flag, then answers", async () => {
    const client = createClient(
      GRPCInferenceService,
      createGrpcTransport({ baseUrl: server.grpc, sendCompression: compressionGzip, compressMinBytes: 0 }),
    );
    await expectBombRefusedThenGood(client, GRPC_LIMIT(CAP));
  });

  it("refuses an envelope declaring 300 MB as soon as its prefix arrives, the body never sent (direct and compressed paths)", async () => {
    const session = http2.connect(server.grpc);
    try {
      const declared = 300_000_000;
      for (const [flag, headers] of [
        [0, {}],
        [compressedFlag, { "grpc-encoding": "gzip" }],
      ] as const) {
        const prefix = Buffer.alloc(5);
        prefix[0] = flag;
        prefix.writeUInt32BE(declared, 1);
        // The stream stays open and nothing follows the prefix: only a refusal on the prefix answers.
        const answer = await rawCall(session, prefix, headers, true);
        expect(answer.grpcStatus, `flag ${flag}`).toBe(String(Code.ResourceExhausted));
        expect(answer.grpcMessage, `flag ${flag}`).toBe(`request message of ${declared} bytes ${GRPC_LIMIT(CAP)}`);
        await expectGoodCall(session);
      }
    } finally {
      session.close();
    }
  });
});

/** The server process's resident set now (VmRSS), in bytes. */
function rss(server: ServerProcess): number {
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${server.proc.pid}/status`, "utf8"))?.[1];
  if (!kb) throw new Error("no VmRSS in /proc/<pid>/status");
  return Number(kb) * 1024;
}

const BUDGET_WORDS = (limit: number) =>
  `decompressed request messages in flight would exceed the server's budget of ${limit} bytes: try again later; use --max-inflight-decompressed-bytes to raise it`;

describe("gRPC port, bombs in parallel (--max-inflight-decompressed-bytes, default 256 MiB)", () => {
  let fresh: ServerProcess;
  beforeAll(async () => {
    fresh = await startServerProcess(["--model-repository", repo]);
  });
  afterAll(() => fresh?.stop());

  it("refuses 32 concurrent 1 MB -> 1 GiB gzip bombs on one connection, growing by at most 512 MB, then answers", async () => {
    const session = http2.connect(fresh.grpc);
    try {
      await expectGoodCall(session);
      const bomb = encodeEnvelope(compressedFlag, gzipBomb(1024 * MiB));
      expect(bomb.byteLength).toBeLessThan(1.5 * MiB);
      const before = rss(fresh);
      const answers = await Promise.all(
        Array.from({ length: 32 }, () => rawCall(session, bomb, { "grpc-encoding": "gzip" })),
      );
      const growth = peakRss(fresh) - before;
      const codes = answers.map((a) => a.grpcStatus);
      expect(codes).toEqual(answers.map(() => String(Code.ResourceExhausted)));
      // Each bomb stops at the per-message cap or where the budget runs out, whichever comes first.
      for (const a of answers) {
        expect([
          `gzip-decompressed request message of more than ${CAP} bytes ${GRPC_LIMIT(CAP)}`,
          BUDGET_WORDS(256 * MiB),
        ]).toContain(a.grpcMessage);
      }
      console.log(
        `32 gzip bombs: peak RSS growth ${(growth / MiB).toFixed(0)} MiB; ${answers.filter((a) => a.grpcMessage?.includes("budget")).length} refused by the budget`,
      );
      expect(growth).toBeLessThan(512 * 1000 * 1000);
      await expectGoodCall(session);
    } finally {
      session.close();
    }
  });
});

describe("--max-inflight-decompressed-bytes", () => {
  const BUDGET = 1024 * 1024;
  let small: ServerProcess;
  beforeAll(async () => {
    small = await startServerProcess(["--model-repository", repo, "--max-inflight-decompressed-bytes", String(BUDGET)]);
  });
  afterAll(() => small?.stop());

  /** A ModelInfer of the echo model carrying `pad` bytes of padding in a second raw input, gzipped. */
  const compressedCall = (pad: number) => {
    const message = echoInferMessage({ pad: " ".repeat(pad) });
    return encodeEnvelope(compressedFlag, gzipSync(message));
  };

  it("refuses a message that would pass the budget RESOURCE_EXHAUSTED naming the flag, and gives back what each call held", async () => {
    const session = http2.connect(small.grpc);
    try {
      const over = await rawCall(session, compressedCall(2 * BUDGET), { "grpc-encoding": "gzip" });
      expect(over.grpcStatus).toBe(String(Code.ResourceExhausted));
      expect(over.grpcMessage).toBe(BUDGET_WORDS(BUDGET));
      // Each of these takes 60% of the budget while it is served: had any call kept its share, the next would be refused.
      for (let i = 0; i < 5; i++) {
        const ok = await rawCall(session, compressedCall(0.6 * BUDGET), { "grpc-encoding": "gzip" });
        expect(ok.grpcStatus, ok.grpcMessage).toBe("0");
      }
      await expectGoodCall(session);
    } finally {
      session.close();
    }
  });

  it("refuses a REST body that would pass the budget 429 naming the flag, then answers", async () => {
    const json = Buffer.alloc(2 * BUDGET, " ");
    json.write('{"inputs":[]', 0);
    json.write("}", json.length - 1);
    const res = await rawPost(`${small.http}/v2/models/echo/infer`, gzipSync(json), {
      "content-type": "application/json",
      "content-encoding": "gzip",
    });
    expect(res.status).toBe(429);
    expect(JSON.parse(res.body.toString()).error).toBe(BUDGET_WORDS(BUDGET));
    await expectGoodRest(small);
  });
});

describe("gRPC port, --grpc-max-input-size", () => {
  let small: ServerProcess;
  beforeAll(async () => {
    small = await startServerProcess(["--model-repository", repo, "--grpc-max-input-size", "4096"]);
  });
  afterAll(() => small?.stop());

  it("lowers the cap for plain and compressed messages, naming the new limit", async () => {
    const session = http2.connect(small.grpc);
    try {
      const plain = await rawCall(session, encodeEnvelope(0, new Uint8Array(8192)));
      expect(plain.grpcStatus).toBe(String(Code.ResourceExhausted));
      expect(plain.grpcMessage).toBe(`request message of 8192 bytes ${GRPC_LIMIT(4096)}`);
      const packed = await rawCall(session, encodeEnvelope(compressedFlag, gzipSync(new Uint8Array(8192))), {
        "grpc-encoding": "gzip",
      });
      expect(packed.grpcStatus).toBe(String(Code.ResourceExhausted));
      expect(packed.grpcMessage).toBe(`gzip-decompressed request message of more than 4096 bytes ${GRPC_LIMIT(4096)}`);
      await expectGoodCall(session);
    } finally {
      session.close();
    }
  });
});

describe("HTTP port, default cap", () => {
  it("refuses a REST gzip bomb with 400 naming the cap and flag, then answers", async () => {
    // A JSON body of 80 MiB (mostly spaces) in under 1 MB.
    const json = Buffer.alloc(80 * MiB, " ");
    json.write('{"inputs":[]', 0);
    json.write("}", json.length - 1);
    const body = gzipSync(json, { level: 1 });
    expect(body.byteLength).toBeLessThan(MiB);
    const res = await fetch(`${server.http}/v2/models/echo/infer`, {
      method: "POST",
      body,
      headers: { "content-encoding": "gzip" },
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: string }).error).toBe(
      // Triton's text (src/data_compressor.h DecompressData).
      `Decompressed data size exceeds the maximum allowed value of ${CAP} bytes. Use --http-max-input-size to increase the limit.`,
    );
    await expectGoodRest(server);
  });

  it("refuses a Content-Length over the cap before the body is sent", async () => {
    const port = new URL(server.http).port;
    const answer = await new Promise<{ status?: number; body: string }>((resolve, reject) => {
      const req = http.request({
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/v2/models/echo/infer",
        headers: { "content-length": String(300_000_000), "content-type": "application/json" },
      });
      const timer = setTimeout(() => {
        req.destroy();
        reject(new Error(`no answer within ${ANSWER_BOUND_MS} ms`));
      }, ANSWER_BOUND_MS);
      req.on("response", (res) => {
        let body = "";
        res.on("data", (c) => {
          body += String(c);
        });
        res.on("end", () => {
          clearTimeout(timer);
          req.destroy();
          resolve({ status: res.statusCode, body });
        });
      });
      req.on("error", () => {});
      // Headers only: the body never comes.
      req.flushHeaders();
    });
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.body).error).toBe(`request JSON size of 300000000 bytes ${HTTP_BODY_LIMIT(CAP)}`);
    await expectGoodRest(server);
  });

  it("refuses a gzip bomb over Connect on the HTTP port naming --http-max-input-size, then answers", async () => {
    const client = createClient(
      GRPCInferenceService,
      createConnectTransport({
        baseUrl: server.http,
        httpVersion: "1.1",
        sendCompression: compressionGzip,
        compressMinBytes: 0,
      }),
    );
    await expectBombRefusedThenGood(client, HTTP_LIMIT(CAP));
  });
});
