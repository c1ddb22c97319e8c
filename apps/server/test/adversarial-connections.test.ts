/**
 * Adversarial connections (issue 18, items 8 and 9), black-box against the server process:
 * connections that never say anything (or stop halfway) are closed on the timeouts the
 * flags set, and SIGTERM under load answers every request already on the wire, never
 * resetting its connection.
 */
import http from "node:http";
import net from "node:net";
import { grpcJsInferenceClient, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, makeRepository, postJson } from "./helpers.js";

const INFER = { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] };
const INFER_BODY = Buffer.from(JSON.stringify(INFER));
const grpcInfer = (values: number[]) => ({
  model_name: "echo",
  inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4] }],
  raw_input_contents: [Buffer.from(new Float32Array(values).buffer)],
});
/** HTTP/2's connection preface (RFC 9113 §3.4) and an empty SETTINGS frame. */
const H2_MAGIC = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
const H2_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);

interface Watched {
  socket: net.Socket;
  received: Buffer[];
  /** Resolves when the server ends the connection (or `limitMs` passes: "open"). */
  closed: Promise<"closed-by-server" | "open">;
}

/** A raw TCP connection to `port` that records what the server sends and whether it closes. */
function watchedSocket(port: number, limitMs: number): Promise<Watched> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    const received: Buffer[] = [];
    socket.on("data", (d: Buffer) => received.push(d));
    socket.once("error", reject);
    socket.once("connect", () => {
      socket.off("error", reject);
      // A reset is a close too, for these tests: the point is that the server let go.
      socket.on("error", () => {});
      const closed = new Promise<"closed-by-server" | "open">((done) => {
        const timer = setTimeout(() => done("open"), limitMs);
        socket.once("close", () => {
          clearTimeout(timer);
          done("closed-by-server");
        });
      });
      resolve({ socket, received, closed });
    });
  });
}

/** The HTTP/2 frames in `bytes` after the server's side of the preface, as [type, payload]. */
function h2Frames(bytes: Buffer): [number, Buffer][] {
  const frames: [number, Buffer][] = [];
  for (let at = 0; at + 9 <= bytes.length; ) {
    const length = bytes.readUIntBE(at, 3);
    frames.push([bytes[at + 3] as number, bytes.subarray(at + 9, at + 9 + length)]);
    at += 9 + length;
  }
  return frames;
}
const GOAWAY = 7;

describe("idle and slow connections are closed (issue 18 item 8)", () => {
  let repo: string;
  // Each limit alone on its server, so each test pins its own: the handshake and HTTP timeouts
  // (no idle limit), and the idle limit (no handshake limit).
  let server: ServerProcess;
  let idleServer: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    [server, idleServer] = await Promise.all([
      startServerProcess([
        "--model-repository",
        repo,
        "--grpc-handshake-timeout",
        "1000",
        "--grpc-max-connection-idle",
        "0",
        "--http-headers-timeout",
        "1500",
        "--http-request-timeout",
        "2000",
      ]),
      startServerProcess([
        "--model-repository",
        repo,
        "--grpc-handshake-timeout",
        "0",
        "--grpc-max-connection-idle",
        "1500",
      ]),
    ]);
  });
  afterAll(async () => {
    await server?.stop("SIGKILL");
    await idleServer?.stop("SIGKILL");
    await removeDir(repo);
  });

  /** A good request over each protocol right after: the server still answers. */
  async function stillAnswers(target: ServerProcess = server): Promise<void> {
    const server = target;
    const res = await postJson(`${server.http}/v2/models/echo/infer`, INFER);
    expect(res.status).toBe(200);
    expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4]);
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const out = await client.modelInfer(grpcInfer([5, 6, 7, 8]));
      expect(Array.from(new Float32Array(Uint8Array.from(out.raw_output_contents[0] as Buffer).buffer))).toEqual([
        5, 6, 7, 8,
      ]);
    } finally {
      client.close();
    }
  }

  it("closes a gRPC connection that never sends the HTTP/2 preface", async () => {
    // 1 s handshake timeout; the 20 s bound only stops a server that never closes it.
    const conn = await watchedSocket(server.grpcPort, 20_000);
    expect(await conn.closed).toBe("closed-by-server");
    await stillAnswers();
  });

  it("closes a gRPC connection that sends the preface's magic and then nothing", async () => {
    const conn = await watchedSocket(server.grpcPort, 20_000);
    conn.socket.write(H2_MAGIC);
    expect(await conn.closed).toBe("closed-by-server");
    await stillAnswers();
  });

  it("keeps a gRPC connection that has sent its preface and SETTINGS with no idle limit set", async () => {
    // The handshake timeout has passed (1 s) and the connection is still open: the test above is the handshake's.
    const conn = await watchedSocket(server.grpcPort, 3_000);
    conn.socket.write(Buffer.concat([H2_MAGIC, H2_SETTINGS]));
    expect(await conn.closed).toBe("open");
    conn.socket.destroy();
  });

  it("closes a gRPC connection with no call for --grpc-max-connection-idle, with GOAWAY NO_ERROR", async () => {
    const conn = await watchedSocket(idleServer.grpcPort, 20_000);
    conn.socket.write(Buffer.concat([H2_MAGIC, H2_SETTINGS]));
    expect(await conn.closed).toBe("closed-by-server");
    const goaway = h2Frames(Buffer.concat(conn.received)).find(([type]) => type === GOAWAY);
    expect(goaway).toBeDefined();
    // Last-Stream-ID 0 (no call was made), error code NO_ERROR.
    expect([goaway?.[1].readUInt32BE(0), goaway?.[1].readUInt32BE(4)]).toEqual([0, 0]);
    await stillAnswers(idleServer);
  });

  it("keeps a gRPC connection whose call outlasts the idle timeout, and a client reconnects after GOAWAY", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${idleServer.grpcPort}`);
    try {
      // A 3 s call on a connection with a 1.5 s idle timeout: it is not idle while the call runs.
      const slow = await client.modelInfer({
        ...grpcInfer([1, 1, 1, 1]),
        parameters: { delay_ms: { int64_param: 3000 } },
      });
      expect(slow.outputs[0]?.name).toBe("OUTPUT");
      // Idle for longer than the timeout: the server has sent GOAWAY; the next call reconnects.
      await new Promise((r) => setTimeout(r, 2500));
      const next = await client.modelInfer(grpcInfer([2, 2, 2, 2]));
      expect(next.outputs[0]?.name).toBe("OUTPUT");
    } finally {
      client.close();
    }
  });

  it("closes an HTTP connection that sends nothing within --http-headers-timeout", async () => {
    const conn = await watchedSocket(server.httpPort, 20_000);
    expect(await conn.closed).toBe("closed-by-server");
    await stillAnswers();
  });

  it("answers 408 to an HTTP request whose body trickles in slower than --http-request-timeout", async () => {
    const conn = await watchedSocket(server.httpPort, 20_000);
    conn.socket.write(
      `POST /v2/models/echo/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${INFER_BODY.length}\r\n\r\n`,
    );
    // One byte a second: the body would take longer than the 20 s bound; the 2 s timeout comes first.
    let sent = 0;
    const trickle = setInterval(() => {
      if (!conn.socket.destroyed && sent < INFER_BODY.length) conn.socket.write(INFER_BODY.subarray(sent, ++sent));
    }, 1000);
    try {
      expect(await conn.closed).toBe("closed-by-server");
    } finally {
      clearInterval(trickle);
    }
    expect(sent).toBeLessThan(INFER_BODY.length);
    expect(Buffer.concat(conn.received).toString("latin1")).toMatch(/^HTTP\/1\.1 408 /);
    await stillAnswers();
  });

  it("answers 408 to an HTTP request whose headers trickle in slower than --http-headers-timeout", async () => {
    const conn = await watchedSocket(server.httpPort, 20_000);
    const head = "GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz\r\n\r\n";
    let sent = 0;
    const trickle = setInterval(() => {
      if (!conn.socket.destroyed && sent < head.length) conn.socket.write(head.slice(sent, ++sent));
    }, 500);
    try {
      expect(await conn.closed).toBe("closed-by-server");
    } finally {
      clearInterval(trickle);
    }
    expect(sent).toBeLessThan(head.length);
    expect(Buffer.concat(conn.received).toString("latin1")).toMatch(/^HTTP\/1\.1 408 /);
    await stillAnswers();
  });
});

type Outcome =
  | { status: number; connection?: string }
  | { error: string; code?: string; written: boolean; reused: boolean };

/** POST an inference request through `agent`, recording its answer or how it failed. */
function httpInfer(agent: http.Agent, port: number): Promise<Outcome> {
  return new Promise((resolve) => {
    let written = false;
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        path: "/v2/models/echo/infer",
        method: "POST",
        agent,
        headers: { "content-type": "application/json", "content-length": INFER_BODY.length },
      },
      (res) => {
        res.resume();
        res.on("end", () => resolve({ status: res.statusCode ?? 0, connection: res.headers.connection }));
        res.on("error", (err: NodeJS.ErrnoException) =>
          resolve({ error: err.message, code: err.code, written, reused: req.reusedSocket }),
        );
      },
    );
    req.on("finish", () => {
      written = true;
    });
    req.on("error", (err: NodeJS.ErrnoException) =>
      resolve({ error: err.message, code: err.code, written, reused: req.reusedSocket }),
    );
    req.end(INFER_BODY);
  });
}

/** A reset or hang-up of a request the client had written in full: what must never happen. */
const lost = (o: Outcome) =>
  "error" in o && o.written && (o.code === "ECONNRESET" || o.code === "EPIPE" || /socket hang up/.test(o.error));

describe("SIGTERM answers every request already on the wire (issue 18 item 9)", () => {
  it("resets no keep-alive HTTP request and no gRPC call under load; idle connections written to at SIGTERM are answered", async () => {
    const repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const server = await startServerProcess(["--model-repository", repo, "--exit-timeout-secs", "20"]);
    const agents: http.Agent[] = [];
    const grpcClient = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      // 24 idle keep-alive connections: one request each, all at once, so each has its own socket.
      const IDLE = 24;
      const idleAgent = new http.Agent({ keepAlive: true, maxSockets: IDLE });
      agents.push(idleAgent);
      const warm = await Promise.all(Array.from({ length: IDLE }, () => httpInfer(idleAgent, server.httpPort)));
      expect(warm.every((o) => "status" in o && o.status === 200)).toBe(true);
      expect(Object.values(idleAgent.freeSockets).flat()).toHaveLength(IDLE);

      // Load: 6 keep-alive HTTP clients and 2 gRPC callers, back to back, until the server goes
      // (a refused connection: the listener is closed) or 3,000 requests each at most.
      let started = 0;
      let signalled!: () => void;
      const startedEnough = new Promise<void>((r) => {
        signalled = r;
      });
      const httpLoop = async (): Promise<Outcome[]> => {
        const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
        agents.push(agent);
        const outcomes: Outcome[] = [];
        for (let i = 0; i < 3000; i++) {
          const o = await httpInfer(agent, server.httpPort);
          outcomes.push(o);
          if (++started === 200) signalled();
          if ("error" in o) break;
        }
        return outcomes;
      };
      const grpcLoop = async (): Promise<{ ok: number; errors: string[] }> => {
        let ok = 0;
        const errors: string[] = [];
        for (let i = 0; i < 3000; i++) {
          try {
            await grpcClient.modelInfer(grpcInfer([i, 0, 0, 0]));
            ok++;
          } catch (err) {
            errors.push((err as Error).message);
            break;
          }
        }
        return { ok, errors };
      };
      const httpLoops = Array.from({ length: 6 }, httpLoop);
      const grpcLoops = Array.from({ length: 2 }, grpcLoop);
      await startedEnough;

      // SIGTERM, and in the same instant a request on each idle connection: they are on the
      // wire as shutdown begins.
      const exitCode = server.stop("SIGTERM");
      const atSignal = Array.from({ length: IDLE }, () => httpInfer(idleAgent, server.httpPort));

      const idleOutcomes = await Promise.all(atSignal);
      const loadOutcomes = (await Promise.all(httpLoops)).flat();
      const grpcOutcomes = await Promise.all(grpcLoops);
      expect(await exitCode).toBe(0);

      // Every request on an idle connection was written on an open connection: answered.
      expect(idleOutcomes.filter(lost)).toEqual([]);
      expect(idleOutcomes.map((o) => ("status" in o ? o.status : o.error))).toEqual(Array(IDLE).fill(200));
      // Load: answered 200 (or 503), or refused a new connection once the listener closed; none lost.
      expect(loadOutcomes.filter(lost)).toEqual([]);
      for (const o of loadOutcomes) {
        if ("status" in o) expect([200, 503]).toContain(o.status);
        else expect(o.code).toBe("ECONNREFUSED");
      }
      // gRPC: every call answered until the server went (GOAWAY), then one that found no server:
      // UNAVAILABLE with the connection refused, never a call cut off on its connection.
      for (const g of grpcOutcomes) {
        expect(g.ok).toBeGreaterThan(0);
        expect(g.errors).toHaveLength(1);
        expect(g.errors[0]).toMatch(/^14 UNAVAILABLE: No connection established.*ECONNREFUSED/);
      }
      expect(server.logs.find((l) => l.msg === "stopped")).toMatchObject({ timedOut: false });
    } finally {
      grpcClient.close();
      for (const a of agents) a.destroy();
      await server.stop("SIGKILL");
      await removeDir(repo);
    }
  }, 60_000);
});
