/**
 * Issue 46's loads, re-measured on the server process (seed repository, resnet50_preprocess over gRPC):
 *  1. good callers alone vs beside two attackers sending a progressive JPEG of 1,000 scan markers;
 *  2. good callers alone vs beside eight callers sending a 6300x6300 lossless WebP;
 *     rounds interleaved (alone, scans, webp, ...) so the shared machine's drift falls on all three;
 *  3. the server's RSS with six connections that never read (flow-control window 0) asking for
 *     preprocess answers (602 KB each), before, at peak and after they are gone, and how many
 *     were reset (GOAWAY ENHANCE_YOUR_CALM) by --grpc-max-unread-answer-bytes.
 * Run: node apps/server/dist/bench/decode-bounds.js (after pnpm build). DECODE_BOUNDS_ROUND_MS
 * (default 4000), DECODE_BOUNDS_ROUNDS (2), DECODE_BOUNDS_GOOD (4 callers).
 */
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { makeSeedRepository, percentile, readFixtureImage, removeDir, startServerProcess } from "@trellis/testing";
import sharp from "sharp";

const ROUND_MS = Number(process.env.DECODE_BOUNDS_ROUND_MS ?? 4000);
const ROUNDS = Number(process.env.DECODE_BOUNDS_ROUNDS ?? 2);
const GOOD = Number(process.env.DECODE_BOUNDS_GOOD ?? 4);
const MODEL = "resnet50_preprocess";

const rssOf = (pid: number) => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
};

/** A progressive JPEG whose last scan is repeated `copies` times: `copies` more scan markers. */
async function manyScans(copies: number): Promise<Uint8Array> {
  const b = new Uint8Array(
    await sharp({ create: { width: 6000, height: 6000, channels: 3, background: { r: 30, g: 120, b: 200 } } })
      .jpeg({ progressive: true })
      .toBuffer(),
  );
  let last = -1;
  for (let i = b.indexOf(0xff); i >= 0 && i + 1 < b.length; i = b.indexOf(0xff, i + 1)) if (b[i + 1] === 0xda) last = i;
  const scan = b.subarray(last, b.length - 2);
  const parts = [b.subarray(0, b.length - 2), ...Array.from({ length: copies }, () => scan), Uint8Array.of(0xff, 0xd9)];
  return new Uint8Array(Buffer.concat(parts));
}

const envelopes = new WeakMap<object, Buffer>();
/** `request` as one gRPC message on the wire, encoded once. */
function envelopeOf(request: ReturnType<typeof requestOf>): Buffer {
  let out = envelopes.get(request);
  if (!out) {
    const bytes = toBinary(ModelInferRequestSchema, request);
    out = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), bytes]);
    out.writeUInt32BE(bytes.length, 1);
    envelopes.set(request, out);
  }
  return out;
}

const CALL_HEADERS = {
  ":method": "POST",
  ":path": "/inference.GRPCInferenceService/ModelInfer",
  "content-type": "application/grpc",
  te: "trailers",
};

/** One ModelInfer call on `session`, read to its end: "answered" or the grpc-message. */
function rawCall(session: http2.ClientHttp2Session, envelope: Buffer): Promise<string> {
  return new Promise((resolve) => {
    const stream = session.request(CALL_HEADERS);
    stream.on("error", (err) => resolve(`client: ${err.message}`));
    stream.on("data", () => undefined);
    stream.on("trailers", (t) => {
      const status = String(t["grpc-status"]);
      resolve(
        status === "0"
          ? "answered"
          : decodeURIComponent(String(t["grpc-message"] ?? status)).replace(/\d+ bytes/, "N bytes"),
      );
    });
    stream.end(envelope);
  });
}

const requestOf = (image: Uint8Array) =>
  create(ModelInferRequestSchema, {
    modelName: MODEL,
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
    rawInputContents: [frameBytes([image])],
  });

async function main(): Promise<void> {
  const repo = await makeSeedRepository();
  const server = await startServerProcess(["--model-repository", repo]);
  try {
    const pid = server.proc.pid as number;
    const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.grpc }));
    const good = requestOf(readFixtureImage("chelsea.jpg"));
    const scans = requestOf(await manyScans(1_000));
    const webp = requestOf(
      new Uint8Array(
        await sharp({ create: { width: 6300, height: 6300, channels: 3, background: { r: 90, g: 20, b: 160 } } })
          .webp({ lossless: true })
          .toBuffer(),
      ),
    );
    await client.modelInfer(good);
    const refusals = new Map<string, number>();
    /** Good callers for ROUND_MS, `attackers` callers sending `attack` meanwhile. */
    const round = async (attack: typeof good | undefined, attackers: number) => {
      const times: number[] = [];
      let stop = false;
      const t0 = performance.now();
      const goodLoop = async () => {
        while (!stop) {
          const s = performance.now();
          await client.modelInfer(good);
          times.push(performance.now() - s);
        }
      };
      // Each attacker on its own connection, its request encoded once (the client's work is not the server's).
      const attackLoop = async () => {
        if (!attack) return;
        const session = http2.connect(server.grpc);
        session.on("error", () => undefined);
        while (!stop) {
          const e = await rawCall(session, envelopeOf(attack));
          refusals.set(e, (refusals.get(e) ?? 0) + 1);
        }
        session.close();
      };
      const timer = setTimeout(() => {
        stop = true;
      }, ROUND_MS);
      await Promise.all([...Array.from({ length: GOOD }, goodLoop), ...Array.from({ length: attackers }, attackLoop)]);
      clearTimeout(timer);
      return { n: times.length, s: (performance.now() - t0) / 1000, times };
    };
    const kinds = { alone: [] as number[], scans: [] as number[], webp: [] as number[] };
    const rates = { alone: { n: 0, s: 0 }, scans: { n: 0, s: 0 }, webp: { n: 0, s: 0 } };
    for (let r = 0; r < ROUNDS; r++) {
      for (const [kind, attack, attackers] of [
        ["alone", undefined, 0],
        ["scans", scans, 2],
        ["webp", webp, 8],
      ] as const) {
        const res = await round(attack, attackers);
        kinds[kind].push(...res.times);
        rates[kind].n += res.n;
        rates[kind].s += res.s;
      }
    }
    console.log(
      `good traffic: ${GOOD} callers of chelsea.jpg (451x300), ${ROUNDS} interleaved rounds of ${ROUND_MS} ms`,
    );
    for (const kind of ["alone", "scans", "webp"] as const) {
      const t = kinds[kind];
      console.log(
        `  ${kind.padEnd(6)} ${(rates[kind].n / rates[kind].s).toFixed(1).padStart(7)} good/s  p50 ${percentile(t, 50).toFixed(1)} ms  p99 ${percentile(t, 99).toFixed(1)} ms`,
      );
    }
    for (const [message, n] of refusals) console.log(`  attack answers: ${n} x ${message}`);

    // 3. Six connections that never read.
    const rssBefore = rssOf(pid);
    let rssPeak = rssBefore;
    const sampler = setInterval(() => {
      rssPeak = Math.max(rssPeak, rssOf(pid));
    }, 50);
    const envelope = envelopeOf(good);
    let resets = 0;
    const sessions = Array.from({ length: 6 }, () => {
      const session = http2.connect(server.grpc, { settings: { initialWindowSize: 0 } });
      session.on("error", () => undefined);
      session.on("goaway", (code: number) => {
        if (code === http2.constants.NGHTTP2_ENHANCE_YOUR_CALM) resets++;
      });
      return session;
    });
    // In waves of ten calls a connection a second, so the model's queue (128) takes them all.
    for (let wave = 0; wave < 10; wave++) {
      for (const session of sessions) {
        for (let i = 0; i < 10 && !session.closed && !session.destroyed; i++) {
          const stream = session.request(CALL_HEADERS);
          stream.on("error", () => undefined);
          stream.end(envelope);
        }
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
    await new Promise((r) => setTimeout(r, 5_000));
    for (const s of sessions) s.destroy();
    await new Promise((r) => setTimeout(r, 3_000));
    clearInterval(sampler);
    const rssAfter = rssOf(pid);
    await client.modelInfer(good);
    console.log(
      `six non-reading connections x 100 calls (602 KB answers): RSS ${rssBefore.toFixed(0)} MB before, ${rssPeak.toFixed(0)} MB peak, ${rssAfter.toFixed(0)} MB 3 s after; ${resets} connections reset (ENHANCE_YOUR_CALM); a good call answered after`,
    );
  } finally {
    await server.stop();
    await removeDir(repo);
  }
}

await main();
