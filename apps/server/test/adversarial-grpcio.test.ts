/**
 * One caller's cancelled calls must not break its neighbours on the same HTTP/2 connection
 * (issue 18 item 6). tritonclient.grpc (grpcio, gRPC C-core) shares one connection among all
 * of a client's callers; a caller with short deadlines resets its streams, and two things
 * that follow killed the whole connection, and with it every other caller's calls:
 *
 * - node:http2 counts a response queued behind the client's flow-control window against the
 *   session's memory (maxSessionMemory, 10 MB by default) and never gives the count back when
 *   the client resets that stream. After about 10 MB of such responses every new stream is
 *   refused with RST_STREAM ENHANCE_YOUR_CALM (grpcio: RESOURCE_EXHAUSTED "Received RST_STREAM
 *   with error code 11"), and after 100 refusals the session is torn down (GOAWAY, "Socket closed").
 * - grpcio sometimes resets a stream it never opened (RST_STREAM for a stream id whose HEADERS it
 *   had not sent yet, cancelled at its deadline). HTTP/2 makes that a connection error
 *   (PROTOCOL_ERROR); nghttp2 sends GOAWAY and node destroys the session. gRPC C-core servers,
 *   Triton's among them, ignore such a reset.
 *
 * Each is reproduced frame by frame with node:http2 (deterministic), then the way it was found:
 * grpcio callers sharing one channel with a caller whose deadlines are 5 ms.
 */
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http2 from "node:http2";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ModelInferRequestSchema, ModelInferResponseSchema } from "@trellis/protocol";
import {
  findPythonGrpc,
  pythonGrpcRequired,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, makeRepository } from "./helpers.js";

const MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer";

/** A ModelInfer request for the echo model: `count` FP32 values, answered with the same values. */
function echoRequest(count: number, fill = 1.5): Uint8Array {
  const values = new Float32Array(count).fill(fill);
  return toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: "echo",
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, BigInt(count)] }],
      rawInputContents: [new Uint8Array(values.buffer)],
    }),
  );
}

/** One gRPC message in its length-prefixed envelope. */
function envelope(message: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + message.length);
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

interface RawCall {
  /** grpc-status from the trailers, or undefined when none came. */
  status?: string;
  /** The stream's RST_STREAM code (0 when it ended cleanly). */
  rstCode?: number;
  /** The response message, when one came. */
  body: Buffer;
}

/** A unary ModelInfer on `session`; with `cancelOnHeaders`, the client resets the stream once the response headers arrive. */
function rawCall(session: http2.ClientHttp2Session, message: Uint8Array, cancelOnHeaders = false): Promise<RawCall> {
  return new Promise((resolve) => {
    const stream = session.request({
      ":method": "POST",
      ":path": MODEL_INFER,
      "content-type": "application/grpc",
      te: "trailers",
    });
    const chunks: Buffer[] = [];
    const call: RawCall = { body: Buffer.alloc(0) };
    stream.on("response", () => {
      if (cancelOnHeaders) stream.close(http2.constants.NGHTTP2_CANCEL);
    });
    stream.on("data", (d: Buffer) => chunks.push(d));
    stream.on("trailers", (t) => {
      call.status = t["grpc-status"] as string | undefined;
    });
    stream.on("error", () => {});
    stream.on("close", () => {
      call.rstCode = stream.rstCode;
      const all = Buffer.concat(chunks);
      call.body = all.length >= 5 ? all.subarray(5, 5 + all.readUInt32BE(1)) : all;
      resolve(call);
    });
    stream.end(envelope(message));
  });
}

/** The FP32 values of an echo response. */
function echoed(body: Buffer): number[] {
  const res = fromBinary(ModelInferResponseSchema, body);
  const raw = res.rawOutputContents[0] as Uint8Array;
  return Array.from(new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)));
}

function connect(url: string, settings: http2.Settings = {}): Promise<http2.ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url, { settings });
    session.once("connect", () => resolve(session));
    session.once("error", reject);
  });
}

const settingsAcknowledged = (session: http2.ClientHttp2Session, settings: http2.Settings) =>
  new Promise<void>((resolve, reject) => session.settings(settings, (err) => (err ? reject(err) : resolve())));

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo", { dims: [-1] }) } });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

describe("a client resetting its own streams on a shared connection", () => {
  it("resets of calls whose answers wait on the client's flow-control window leave the connection taking new calls", async () => {
    // The client's stream window is 0: every answer (1 MiB, the request echoed) waits queued in
    // the server, and the client resets the call when the answer's headers arrive. Each reset
    // left 1 MiB counted against the session's 10 MB: from the 11th call on, every new stream
    // was refused with ENHANCE_YOUR_CALM (11).
    const session = await connect(server.grpc, { initialWindowSize: 0 });
    try {
      const big = echoRequest(256 * 1024);
      const resets: RawCall[] = [];
      for (let i = 0; i < 24; i++) resets.push(await rawCall(session, big, true));
      // Every one reached the server and was answered (headers), then reset by the client (CANCEL),
      // none refused by the server.
      expect(resets.map((c) => c.rstCode)).toEqual(resets.map(() => http2.constants.NGHTTP2_CANCEL));

      // The client opens its window again: the same connection answers a good call in full.
      await settingsAcknowledged(session, { initialWindowSize: 2 ** 20 });
      const good = await rawCall(session, echoRequest(4, 2.5));
      expect({ status: good.status, rstCode: good.rstCode }).toEqual({ status: "0", rstCode: 0 });
      expect(echoed(good.body)).toEqual([2.5, 2.5, 2.5, 2.5]);
      expect(session.closed || session.destroyed).toBe(false);
    } finally {
      session.destroy();
    }
  });

  it("a RST_STREAM for a stream the client never opened (as grpcio sends) is ignored, not a connection error", async () => {
    // A proxy in front of the server adds, right after the client's first SETTINGS, the frame
    // grpcio was seen sending: RST_STREAM (CANCEL) for stream 5 before the HEADERS of stream 1
    // (a call cancelled at its deadline after it was given a stream id, before its headers went
    // out). The stream is idle to the server: nghttp2 answered with GOAWAY (PROTOCOL_ERROR) and
    // the calls on the connection failed. The proxy also announces grpcio's own setting
    // (0xfe03, grpc_allow_true_binary_metadata) in the client's SETTINGS, as C-core does: the
    // server filters the connections of C-core clients only.
    const upstreamPort = server.grpcPort;
    const injected: number[] = [];
    const proxy = net.createServer((client) => {
      const upstream = net.connect(upstreamPort, "127.0.0.1");
      upstream.on("error", () => client.destroy());
      client.on("error", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
      client.on("close", () => upstream.destroy());
      upstream.pipe(client);
      let head = Buffer.alloc(0);
      let done = false;
      client.on("data", (chunk: Buffer) => {
        if (done) {
          upstream.write(chunk);
          return;
        }
        head = Buffer.concat([head, chunk]);
        // The 24-byte preface, then the client's SETTINGS frame (9-byte header + payload).
        if (head.length < 24 + 9) return;
        const settingsEnd = 24 + 9 + head.readUIntBE(24, 3);
        if (head.length < settingsEnd) return;
        const reset = Buffer.alloc(13);
        reset.writeUIntBE(4, 0, 3); // length
        reset[3] = 0x3; // RST_STREAM
        reset.writeUInt32BE(5, 5); // stream 5: idle
        reset.writeUInt32BE(http2.constants.NGHTTP2_CANCEL, 9);
        injected.push(5);
        const coreSetting = Buffer.from([0xfe, 0x03, 0, 0, 0, 1]);
        const settings = Buffer.concat([head.subarray(24, settingsEnd), coreSetting]);
        settings.writeUIntBE(settingsEnd - 24 - 9 + coreSetting.length, 0, 3);
        upstream.write(Buffer.concat([head.subarray(0, 24), settings, reset, head.subarray(settingsEnd)]));
        done = true;
      });
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    const port = (proxy.address() as net.AddressInfo).port;
    const session = await connect(`http://127.0.0.1:${port}`);
    try {
      let goaway: number | undefined;
      session.on("goaway", (code) => {
        goaway = code;
      });
      const calls: RawCall[] = [];
      for (let i = 0; i < 4; i++) calls.push(await rawCall(session, echoRequest(4, i)));
      expect(injected).toEqual([5]);
      expect(goaway).toBeUndefined();
      expect(calls.map((c) => [c.status, c.rstCode])).toEqual(calls.map(() => ["0", 0]));
      expect(calls.map((c) => echoed(c.body)[0])).toEqual([0, 1, 2, 3]);
      expect(session.closed || session.destroyed).toBe(false);
    } finally {
      session.destroy();
      await new Promise<void>((resolve) => proxy.close(() => resolve()));
    }
  });
});

/**
 * N threads making calls on one grpcio channel while another thread on it makes calls with
 * 5 ms deadlines; prints {"good": {code: count}, "errors": [[code, details]...], "bad": {...}}.
 */
const STORM = `
import json, sys, threading, time, grpc
address, good_path, bad_path, threads, per_thread, bad_timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
good_req, bad_req = open(good_path, "rb").read(), open(bad_path, "rb").read()
channel = grpc.insecure_channel(address)
call = channel.unary_unary("${MODEL_INFER}")
lock = threading.Lock()
good, bad, errors = {}, {}, []
finished = threading.Event()
deadline = time.time() + 60
def count(table, key):
    with lock:
        table[key] = table.get(key, 0) + 1
def good_caller():
    for _ in range(per_thread):
        if time.time() > deadline:
            return
        try:
            response = call(good_req, timeout=30)
            count(good, "OK" if len(response) > 0 else "EMPTY")
        except grpc.RpcError as err:
            count(good, err.code().name)
            with lock:
                errors.append([err.code().name, err.details()])
def bad_caller():
    while not finished.is_set() and time.time() < deadline:
        try:
            call(bad_req, timeout=bad_timeout)
            count(bad, "OK")
        except grpc.RpcError as err:
            count(bad, err.code().name)
callers = [threading.Thread(target=good_caller) for _ in range(threads)]
short = threading.Thread(target=bad_caller)
for t in callers: t.start()
short.start()
for t in callers: t.join()
finished.set()
short.join()
channel.close()
json.dump({"good": good, "bad": bad, "errors": errors[:10]}, sys.stdout)
`;

interface StormResult {
  good: Record<string, number>;
  bad: Record<string, number>;
  errors: [string, string][];
}

async function storm(
  address: string,
  good: Uint8Array,
  bad: Uint8Array,
  threads: number,
  perThread: number,
): Promise<StormResult> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-grpcio-storm-"));
  try {
    const script = join(dir, "storm.py");
    await writeFile(script, STORM);
    await writeFile(join(dir, "good.bin"), good);
    await writeFile(join(dir, "bad.bin"), bad);
    const python = findPythonGrpc().python as string;
    const child = spawn(
      python,
      [script, address, join(dir, "good.bin"), join(dir, "bad.bin"), String(threads), String(perThread), "0.005"],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += String(d);
    });
    child.stderr.on("data", (d) => {
      stderr += String(d);
    });
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    if (code !== 0) throw new Error(`storm.py exited with ${code}:\n${stderr}`);
    return JSON.parse(stdout) as StormResult;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe.runIf(pythonGrpcRequired())("grpcio callers sharing a channel with a caller whose deadlines are 5 ms", () => {
  it("every good call is answered: none refused (RESOURCE_EXHAUSTED), reset (INTERNAL) or lost with the connection (UNAVAILABLE)", async () => {
    // 6 callers x 100 calls of 100 KB each way, as images and their tensors are, beside a caller
    // whose calls mostly miss their 5 ms deadline. Before: the first hundreds of resets used up the
    // session's memory allowance; good calls were refused by the dozen, then the connection went.
    const payload = echoRequest(25_600);
    const result = await storm(`127.0.0.1:${server.grpcPort}`, payload, payload, 6, 100);
    expect(result.errors).toEqual([]);
    expect(result.good).toEqual({ OK: 600 });
    // The short-deadline caller did hit its deadline, mid-call, again and again.
    expect(result.bad.DEADLINE_EXCEEDED ?? 0).toBeGreaterThan(10);
  }, 90_000);
});
