/** The real Trellis server process (node apps/server/dist/main.js) on ephemeral loopback ports. */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { repoRoot } from "./paths.js";

export interface ServerProcess {
  proc: ChildProcess;
  http: string;
  /** http://, or https:// when the gRPC port serves TLS. */
  grpc: string;
  metrics: string;
  /** what the process wrote to stderr so far (native libraries write there, bypassing the log) */
  stderr(): string;
  httpPort: number;
  grpcPort: number;
  /** Every JSON log line so far. */
  logs: Record<string, unknown>[];
  /** Resolves with the exit code. */
  exited: Promise<number | null>;
  /** Sends `signal` and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

export interface ServerProcessOptions {
  /** The server's entry point (default apps/server/dist/main.js: build it first). */
  main?: string;
  /** Working directory (default apps/server). */
  cwd?: string;
  /** How long to wait for "server started" before killing the process (default 120 s). */
  startTimeoutMs?: number;
  /** Where the server logs when started with --log-file: its lines are read from there instead of stdout. */
  logFile?: string;
  /** Environment variables set for the server, over this process's own. */
  env?: NodeJS.ProcessEnv;
}

/** What the server logged at level error (pino's 50) or above: each entry's error message, else its msg. */
function loggedErrors(logs: Record<string, unknown>[]): string {
  return logs
    .filter((e) => typeof e.level === "number" && e.level >= 50)
    .map((e) => {
      const err = e.err as { message?: unknown } | undefined;
      const model = typeof e.model === "string" ? `${e.model}: ` : "";
      const why = typeof e.reason === "string" ? e.reason : typeof err?.message === "string" ? err.message : "";
      return `${model}${String(e.msg)}${why ? ` (${why})` : ""}`;
    })
    .join("; ");
}

/**
 * Starts the server with `args` on ports 0 (HTTP, gRPC, metrics), no model fetching and no
 * drain window at SIGTERM (--shutdown-drain-secs 0 unless `args` set it); resolves once it logs "server started", with the ports it logged.
 */
export async function startServerProcess(args: string[], options: ServerProcessOptions = {}): Promise<ServerProcess> {
  const serverDir = join(repoRoot, "apps", "server");
  const proc = spawn(
    process.execPath,
    [
      options.main ?? join(serverDir, "dist", "main.js"),
      "--http-port",
      "0",
      "--grpc-port",
      "0",
      "--metrics-port",
      "0",
      "--no-fetch-models",
      // No drain window at SIGTERM (a test's own --shutdown-drain-secs, later, wins): on loopback no
      // load balancer needs one, and every test's stop() would wait it out. Not given to another
      // build (`main`), which may predate the flag.
      ...(options.main ? [] : ["--shutdown-drain-secs", "0"]),
      ...args,
    ],
    {
      cwd: options.cwd ?? serverDir,
      stdio: ["ignore", "pipe", "pipe"],
      ...(options.env ? { env: { ...process.env, ...options.env } } : {}),
    },
  );
  const logs: Record<string, unknown>[] = [];
  const ports: Record<string, number> = {};
  let grpcTls = false;
  let stderr = "";
  proc.stderr?.on("data", (d) => {
    stderr += String(d);
  });
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  const startTimeoutMs = options.startTimeoutMs ?? 120_000;
  let timer: NodeJS.Timeout | undefined;
  const started = new Promise<void>((resolve, reject) => {
    timer = setTimeout(
      () => reject(new Error(`server (pid ${proc.pid}) did not start within ${startTimeoutMs} ms:\n${stderr}`)),
      startTimeoutMs,
    );
    const onLine = (line: string) => {
      let entry: Record<string, unknown>;
      try {
        entry = JSON.parse(line);
      } catch {
        return;
      }
      logs.push(entry);
      if (entry.msg === "listening") {
        ports[entry.protocol as string] = entry.port as number;
        if (entry.protocol === "grpc") grpcTls = entry.tls === true;
      }
      if (entry.msg === "server started") resolve();
    };
    if (options.logFile) followFile(options.logFile, onLine, exited);
    else createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on("line", onLine);
    exited.then((code) =>
      reject(new Error(`server exited with ${code} before starting: ${loggedErrors(logs)}\n${stderr}`.trimEnd())),
    );
  });
  try {
    await started;
  } catch (err) {
    // A server that never started must not outlive the test that asked for it.
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
    await exited;
    throw err;
  } finally {
    clearTimeout(timer);
  }
  const host = "http://127.0.0.1";
  return {
    proc,
    logs,
    exited,
    httpPort: ports.http as number,
    grpcPort: ports.grpc as number,
    http: `${host}:${ports.http}`,
    grpc: `${grpcTls ? "https" : "http"}://127.0.0.1:${ports.grpc}`,
    metrics: `${host}:${ports.metrics}`,
    stderr: () => stderr,
    stop: async (signal = "SIGTERM") => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}

/**
 * Why the server refuses to start with `args`: its error, as text (stderr included). A server
 * that starts after all is stopped, and that is an error, so no test leaves one running.
 */
export async function startupRefusal(args: string[], options: ServerProcessOptions = {}): Promise<string> {
  let server: ServerProcess;
  try {
    server = await startServerProcess(args, options);
  } catch (err) {
    return String(err);
  }
  await server.stop();
  throw new Error(`the server started with ${args.join(" ")}; a refusal was expected`);
}

/** Calls `onLine` for each line appended to `path` (which may not exist yet) until `done` settles. */
function followFile(path: string, onLine: (line: string) => void, done: Promise<unknown>): void {
  let offset = 0;
  let partial = "";
  const read = () => {
    let text: string;
    try {
      const buf = readFileSync(path);
      text = buf.subarray(offset).toString("utf8");
      offset = buf.byteLength;
    } catch {
      return; // not written yet
    }
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) onLine(line);
  };
  const timer = setInterval(read, 25);
  void done.then(() => {
    read();
    clearInterval(timer);
  });
}
