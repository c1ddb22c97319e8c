/**
 * Parity, round 3 (issue 56 items 2-4), black-box over real HTTP against an ONNX identity model
 * built here, with good requests in flight beside each bad one:
 * - a body past --http-max-input-size, in Triton's words for what the body is: a raw binary
 *   request (server src/http_server.cc EVBufferToRawInput: "Raw input has a byte_size (N bytes)
 *   that exceeds the maximum allowed value of M bytes..."), a JSON body (EVBufferToJson: "request
 *   JSON size of N bytes exceeds the maximum allowed input size of M bytes..."), a compressed body
 *   (src/data_compressor.h DecompressData: "Decompressed data size exceeds the maximum allowed
 *   value of M bytes...");
 * - a chunked body of more than 65,536 non-empty chunks (http_server.cc kMaxChunkedChunks,
 *   ChunkCountIncrement: 400, "Chunked request body exceeds maximum of 65536 non-empty chunks.
 *   Send fewer or larger HTTP chunks.", the connection closed), refused without reading on;
 * - Content-Length with Transfer-Encoding: chunked: refused with a JSON error saying why (a
 *   deliberate difference: Triton reads the body by its chunked encoding; docs/triton-parity.md).
 * The gRPC frontend has no such paths (its size texts are checked in adversarial-limits.test.ts).
 */
import net from "node:net";
import { gzipSync } from "node:zlib";
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRepository, postJson } from "./helpers.js";

// Above 65,536 so that a body of that many one-byte chunks fits under it: the two bounds apart.
const LIMIT = 131_072;
const HINT = "Use --http-max-input-size to increase the limit.";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    fp32: {
      config: `name: "fp32"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "INPUT0_out" data_type: TYPE_FP32 dims: [ -1 ] } ]
`,
      files: { "1/model.onnx": identityModel([{ name: "INPUT0", type: "float32", shape: ["D0"] }]) },
    },
  });
  server = await startServerProcess(["--model-repository", repo, "--http-max-input-size", String(LIMIT)]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

/** Good requests in a loop while `work` runs: all must answer 200 with the identity. */
async function besideGoodTraffic<T>(work: () => Promise<T>): Promise<T> {
  let done = false;
  const loop = async () => {
    let ok = 0;
    while (!done) {
      const res = await postJson(`${server.http}/v2/models/fp32/infer`, {
        inputs: [{ name: "INPUT0", datatype: "FP32", shape: [3], data: [1, 2, 3] }],
      });
      expect(res.status, JSON.stringify(res.json)).toBe(200);
      expect(res.json.outputs[0].data).toEqual([1, 2, 3]);
      ok++;
    }
    return ok;
  };
  const loops = [loop(), loop()];
  try {
    return await work();
  } finally {
    done = true;
    const answered = await Promise.all(loops);
    expect(answered[0]! + answered[1]!).toBeGreaterThan(0);
  }
}

/** Sends raw bytes on a fresh connection; resolves with everything the server wrote until it closed. */
function exchange(port: number, write: (socket: net.Socket) => void): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1", () => write(socket));
    let text = "";
    socket.on("data", (d) => {
      text += d.toString("latin1");
    });
    // The server may close while this side is still writing: what it answered is what counts.
    socket.on("error", (err) => (text ? resolve(text) : reject(err)));
    socket.on("close", () => resolve(text));
  });
}

const statusOf = (answer: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1]);
const bodyOf = (answer: string) => JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4)) as { error: string };
const header = (answer: string, name: string) =>
  new RegExp(`^${name}: *(.*)$`, "im").exec(answer.slice(0, answer.indexOf("\r\n\r\n")))?.[1]?.trim();

describe("a body past --http-max-input-size, in Triton's words for what it is", () => {
  it("a raw binary request: EVBufferToRawInput's text", async () => {
    const size = LIMIT + 400;
    const res = await besideGoodTraffic(() =>
      fetch(`${server.http}/v2/models/fp32/infer`, {
        method: "POST",
        headers: { "content-type": "application/octet-stream", "inference-header-content-length": "0" },
        body: new Uint8Array(size),
      }),
    );
    expect(res.status).toBe(400);
    expect((await res.json()).error).toBe(
      `Raw input has a byte_size (${size} bytes) that exceeds the maximum allowed value of ${LIMIT} bytes. ${HINT}`,
    );
  });

  it("a JSON body: EVBufferToJson's text (unchanged)", async () => {
    const body = JSON.stringify({
      inputs: [{ name: "INPUT0", datatype: "FP32", shape: [40_000], data: Array(40_000).fill(1.25) }],
    });
    const res = await besideGoodTraffic(() => postJson(`${server.http}/v2/models/fp32/infer`, JSON.parse(body)));
    expect(res.status).toBe(400);
    expect(res.json.error).toBe(
      `request JSON size of ${Buffer.byteLength(body)} bytes exceeds the maximum allowed input size of ${LIMIT} bytes. ${HINT}`,
    );
  });

  it("a gzip body that inflates past it: DecompressData's text", async () => {
    const json = JSON.stringify({
      inputs: [{ name: "INPUT0", datatype: "FP32", shape: [100_000], data: Array(100_000).fill(0) }],
    });
    const gz = gzipSync(json);
    expect(gz.byteLength).toBeLessThan(LIMIT);
    const res = await besideGoodTraffic(() =>
      fetch(`${server.http}/v2/models/fp32/infer`, {
        method: "POST",
        headers: { "content-type": "application/json", "content-encoding": "gzip" },
        body: gz,
      }),
    );
    expect(res.status).toBe(400);
    expect((await res.json()).error).toBe(
      `Decompressed data size exceeds the maximum allowed value of ${LIMIT} bytes. ${HINT}`,
    );
  });
});

describe("a chunked body of too many chunks", () => {
  it("is refused at the 65,537th non-empty chunk, and the connection closed", async () => {
    const head = `POST /v2/models/fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
    // 70,000 one-byte chunks (of a JSON body far under the byte limit), then a terminator.
    const chunks = Buffer.from("1\r\n \r\n".repeat(70_000));
    const answer = await besideGoodTraffic(() =>
      exchange(server.httpPort, (s) => {
        s.write(head);
        s.write(chunks);
        s.write("0\r\n\r\n");
      }),
    );
    expect(statusOf(answer), answer.slice(0, 200)).toBe(400);
    expect(header(answer, "connection")).toBe("close");
    expect(bodyOf(answer).error).toBe(
      "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger HTTP chunks.",
    );
  });

  it("takes a body of fewer chunks, empty ones not counted", async () => {
    const json = JSON.stringify({ inputs: [{ name: "INPUT0", datatype: "FP32", shape: [2], data: [4, 5] }] });
    // Each character its own chunk; the terminator is the one empty chunk.
    const body = [...json].map((c) => `1\r\n${c}\r\n`).join("");
    const answer = await exchange(server.httpPort, (s) => {
      s.write(
        `POST /v2/models/fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body}0\r\n\r\n`,
      );
    });
    expect(statusOf(answer)).toBe(200);
    expect(JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4)).outputs[0].data).toEqual([4, 5]);
  });
});

describe("Content-Length together with Transfer-Encoding: chunked", () => {
  it("is refused with a JSON error that says why, the connection closed (a deliberate difference)", async () => {
    const json = JSON.stringify({ inputs: [{ name: "INPUT0", datatype: "FP32", shape: [1], data: [7] }] });
    const chunked = `${json.length.toString(16)}\r\n${json}\r\n0\r\n\r\n`;
    const answer = await besideGoodTraffic(() =>
      exchange(server.httpPort, (s) =>
        s.write(
          `POST /v2/models/fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${json.length}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`,
        ),
      ),
    );
    expect(statusOf(answer)).toBe(400);
    expect(header(answer, "connection")).toBe("close");
    expect(bodyOf(answer).error).toBe(
      "the request has both Content-Length and Transfer-Encoding: chunked, which make its body ambiguous (RFC 9112 section 6.3); send only one of them",
    );
    // Node's own answers for other parse errors are kept: an empty 400 for a malformed request line.
    const garbage = await exchange(server.httpPort, (s) => s.write("NOT HTTP\r\n\r\n"));
    expect(statusOf(garbage)).toBe(400);
  });
});
