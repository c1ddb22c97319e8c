/**
 * Issue 52 item 7: the bound on BYTES tensors in flight (--max-inflight-bytes-tensor-bytes).
 * Each request's BYTES inputs count their framed bytes plus 128 bytes an element; past the
 * bound a request is refused RESOURCE_EXHAUSTED (HTTP 429) naming the flag, before the model
 * sees it, while other requests are answered; what a request reserved is given back once it is
 * answered, so a later request fits again.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { binaryRequest, echoConfig, grpcClientOf, jsonOf, makeRepository } from "./helpers.js";

const BOUND = 1024 * 1024;
/** What one one-byte element counts: its 4-byte prefix, its byte, 128 bytes of overhead. */
const PER_ELEMENT = 4 + 1 + 128;

let repo: string;
let server: ServerProcess;
let client: ReturnType<typeof grpcClientOf>;

beforeAll(async () => {
  repo = await makeRepository({
    strings: { config: echoConfig("strings", { datatype: "TYPE_STRING", dims: [-1], maxBatch: 0 }) },
    echo: { config: echoConfig("echo") },
  });
  server = await startServerProcess([
    ...["--model-repository", repo],
    ...["--max-inflight-bytes-tensor-bytes", String(BOUND)],
  ]);
  client = grpcClientOf(server);
});
afterAll(async () => {
  const code = await server?.stop();
  await removeDir(repo);
  expect(code).toBe(0);
});

/** `count` one-byte elements, framed; element i is the letter i mod 26. */
function elements(count: number): Uint8Array[] {
  return Array.from({ length: count }, (_, i) => new Uint8Array([97 + (i % 26)]));
}

/** A gRPC call of `count` one-byte elements, held `delayMs` by the model: "right", or the error's code and message. */
async function strings(count: number, delayMs = 0): Promise<string> {
  const raw = frameBytes(elements(count));
  try {
    const res = await client.modelInfer({
      modelName: "strings",
      inputs: [{ name: "INPUT", datatype: "BYTES", shape: [BigInt(count)] }],
      rawInputContents: [raw],
      parameters: delayMs > 0 ? { delay_ms: { parameterChoice: { case: "int64Param", value: BigInt(delayMs) } } } : {},
    });
    return res.outputs[0]?.shape[0] === BigInt(count) && Buffer.compare(res.rawOutputContents[0]!, raw) === 0
      ? "right"
      : "wrong";
  } catch (err) {
    const e = ConnectError.from(err);
    return `${Code[e.code]}: ${e.rawMessage}`;
  }
}

/** Good requests beside the bad: 16 FP32 echoes, each answered with its own values. */
async function goodTraffic(): Promise<string[]> {
  const answers = await Promise.all(
    Array.from({ length: 16 }, async (_, i) => {
      const res = await fetch(`${server.http}/v2/models/echo/infer`, {
        method: "POST",
        body: JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [i, i, i, i] }] }),
        headers: { "content-type": "application/json" },
      });
      return `${res.status}:${(await jsonOf(res)).outputs?.[0]?.data?.join(",")}`;
    }),
  );
  return answers;
}
const expectedGood = Array.from({ length: 16 }, (_, i) => `200:${i},${i},${i},${i}`);

describe("BYTES tensors in flight", () => {
  it("refuses a request past the bound alone, over gRPC and HTTP, naming the flag; accepts one within it", async () => {
    const good = goodTraffic();
    const over = Math.ceil(BOUND / PER_ELEMENT) + 1;
    const refused = await strings(over);
    expect(refused).toMatch(/^ResourceExhausted: /);
    expect(refused).toContain(`BYTES inputs of ${over} elements count ${over * PER_ELEMENT} bytes`);
    expect(refused).toContain(`more than the server's bound of ${BOUND} bytes`);
    expect(refused).toContain("--max-inflight-bytes-tensor-bytes");

    const { body, headerLength } = binaryRequest({ inputs: [{ name: "INPUT", datatype: "BYTES", shape: [over] }] }, [
      frameBytes(elements(over)),
    ]);
    const http = await fetch(`${server.http}/v2/models/strings/infer`, {
      method: "POST",
      body,
      headers: { "inference-header-content-length": String(headerLength) },
    });
    expect(http.status).toBe(429);
    expect((await jsonOf(http)).error).toContain("--max-inflight-bytes-tensor-bytes");
    // JSON strings count as framed ones do.
    const json = await fetch(`${server.http}/v2/models/strings/infer`, {
      method: "POST",
      body: JSON.stringify({
        inputs: [{ name: "INPUT", datatype: "BYTES", shape: [over], data: Array(over).fill("a") }],
      }),
      headers: { "content-type": "application/json" },
    });
    expect(json.status).toBe(429);

    // Just within the bound: answered, its bytes back.
    expect(await strings(Math.floor(BOUND / PER_ELEMENT))).toBe("right");
    expect(await good).toEqual(expectedGood);
  });

  it("refuses what does not fit beside a request in flight, and fits it again once that one is answered", async () => {
    const good = goodTraffic();
    // 4,500 elements count 598,500 bytes: one fits in the 1 MiB bound, two do not.
    let holderDone = false;
    const holder = strings(4500, 6000).finally(() => {
      holderDone = true;
    });
    // The holder reserves as soon as the server reads it; until then a second one may still fit.
    let second = "";
    for (let i = 0; i < 100 && !second.startsWith("ResourceExhausted"); i++) {
      second = await strings(4500);
      if (!second.startsWith("ResourceExhausted")) await new Promise((r) => setTimeout(r, 20));
    }
    expect(second).toMatch(/^ResourceExhausted: strings: BYTES inputs of 4500 elements count 598500 bytes/);
    expect(second).toContain("try again later");
    expect(holderDone).toBe(false);
    // A smaller one fits beside it (598,500 + 133,000 bytes).
    expect(await strings(1000)).toBe("right");
    expect(holderDone).toBe(false);
    expect(await holder).toBe("right");
    // The holder's reservation is given back: the same request fits now, and a refused one reserved nothing.
    expect(await strings(4500)).toBe("right");
    expect(await strings(4500)).toBe("right");
    expect(await good).toEqual(expectedGood);
  });
});
