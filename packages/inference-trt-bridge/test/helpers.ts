import { type ChildProcess, fork } from "node:child_process";
import type { Http2Server, ServerHttp2Session } from "node:http2";
import { type AddressInfo, createServer } from "node:net";
import { join } from "node:path";

/** A port that was free a moment ago (listen on 0, close). */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

export interface Child {
  proc: ChildProcess;
  port: number;
  /** Requests the child has received so far. */
  received: number;
  /** Resolves when the child has received `n` requests. */
  receivedAtLeast(n: number): Promise<void>;
  kill(): Promise<void>;
}

/** Forks test/fixtures/serve-child.mjs: a KServe v2 gRPC server in its own process. */
export async function spawnServer(
  kind: "scale" | "hold" | "onnx",
  port = 0,
  args: string[] = [],
  env: Record<string, string> = {},
): Promise<Child> {
  const proc = fork(join(import.meta.dirname, "fixtures", "serve-child.mjs"), [kind, String(port), ...args], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    env: { ...process.env, ...env },
  });
  const waiters: { n: number; resolve: () => void }[] = [];
  const child: Child = {
    proc,
    port: 0,
    received: 0,
    receivedAtLeast: (n) =>
      child.received >= n ? Promise.resolve() : new Promise((resolve) => waiters.push({ n, resolve })),
    kill: async () => {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGKILL");
      await exited;
      // The child's exit can reach us before our end of its connections sees them close; a call
      // made in between goes out on a dead connection (lost in flight, not refused at connect).
      await new Promise((r) => setTimeout(r, 20));
    },
  };
  proc.on("message", (m: { received?: number }) => {
    if (m.received === undefined) return;
    child.received = m.received;
    for (const w of waiters.filter((w) => w.n <= child.received)) w.resolve();
  });
  child.port = await new Promise<number>((resolve, reject) => {
    proc.on("message", (m: { listening?: number }) => m.listening !== undefined && resolve(m.listening));
    proc.once("exit", (code) => reject(new Error(`server child exited (${code}) before listening`)));
  });
  return child;
}

/** Listens on an ephemeral loopback port; close() also ends open HTTP/2 sessions, so it cannot hang. */
export async function listenH2(server: Http2Server): Promise<{ port: number; close: () => Promise<void> }> {
  const sessions = new Set<ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sessions) s.destroy();
      }),
  };
}
