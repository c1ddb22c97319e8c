/**
 * Start-up as an operator (and a Kubernetes probe) sees it, on the real server process:
 * readiness and --exit-on-error as Triton's, a busy port or a missing repository as one line
 * and an exit with nothing left listening, the default repository a flag replaces, each load
 * failure logged once, and the readable log style.
 */
import { spawn } from "node:child_process";
import net from "node:net";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { ServerReadyRequestSchema } from "@trellis/protocol";
import { removeDir, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, freePort, grpcClientOf, makeRepository, postJson } from "./helpers.js";

const SERVER_MAIN = join(import.meta.dirname, "..", "dist", "main.js");

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the server to its exit (it must exit by itself within `timeoutMs`). */
function runToExit(args: string[], timeoutMs = 60_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, [SERVER_MAIN, "--no-fetch-models", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d) => {
      stdout += String(d);
    });
    proc.stderr.on("data", (d) => {
      stderr += String(d);
    });
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`the server did not exit within ${timeoutMs} ms:\n${stdout}\n${stderr}`));
    }, timeoutMs);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const lines = (text: string) => text.split("\n").filter((l) => l.trim() !== "");

/** Whether something accepts connections on the loopback port. */
const listening = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });

let repo: string;
let other: string;
beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    broken: { config: echoConfig("broken", { params: { module: "./missing.js" } }) },
  });
  other = await makeRepository({ other: { config: echoConfig("other") } });
});
afterAll(async () => {
  await removeDir(repo);
  await removeDir(other);
});

describe("readiness and --exit-on-error, as Triton's", () => {
  it("exits 1 at start when a model fails to load (Triton's default --exit-on-error=true), naming it in one line", async () => {
    const run = await runToExit([
      "--model-repository",
      repo,
      ...["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
    ]);
    expect(run.code).toBe(1);
    expect(lines(run.stderr)).toHaveLength(1);
    expect(run.stderr).toMatch(/broken/);
    expect(run.stderr).not.toMatch(/\n\s+at /);
  });

  it("with --exit-on-error=false serves the rest but is not ready (HTTP 400, gRPC ServerReady false) while a model failed", async () => {
    const server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
    try {
      expect((await fetch(`${server.http}/v2/health/live`)).status).toBe(200);
      expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(400);
      const client = grpcClientOf(server);
      expect((await client.serverReady(create(ServerReadyRequestSchema, {}))).ready).toBe(false);
      const infer = await postJson(`${server.http}/v2/models/echo/infer`, {
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
      });
      expect(infer.status).toBe(200);
      expect(server.logs.find((l) => l.msg === "server started")).toMatchObject({ ready: false, failed: 1 });
      // Unloaded, the failed model no longer holds readiness back (Triton: a version "unloaded" is fine).
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("with --strict-readiness=false is ready whatever the models' state", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      "--exit-on-error=false",
      "--strict-readiness=false",
    ]);
    try {
      expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("logs each load failure once", async () => {
    const chained = await makeRepository({
      step: { config: echoConfig("step", { params: { module: "./missing.js" } }) },
      pipeline: {
        config: `name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "step" model_version: -1 input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "OUT" } } ] }
`,
      },
    });
    try {
      const server = await startServerProcess(["--model-repository", chained, "--exit-on-error=false"]);
      try {
        const mentions = (model: string) =>
          server.logs.filter((l) => l.model === model && typeof l.reason === "string" && l.reason !== "").length;
        expect(mentions("step")).toBe(1);
        expect(mentions("pipeline")).toBe(1);
      } finally {
        expect(await server.stop()).toBe(0);
      }
    } finally {
      await removeDir(chained);
    }
  });
});

describe("a start that cannot serve is one line and an exit, with nothing left listening", () => {
  it("a busy --http-port", async () => {
    const held = net.createServer();
    await new Promise<void>((resolve) => held.listen(0, "127.0.0.1", resolve));
    const busy = (held.address() as net.AddressInfo).port;
    const [grpc, metrics] = [await freePort(), await freePort()];
    try {
      const run = await runToExit([
        ...["--model-repository", other],
        ...["--http-port", String(busy), "--grpc-port", String(grpc), "--metrics-port", String(metrics)],
      ]);
      expect(run.code).not.toBe(0);
      expect(run.code).not.toBeNull();
      expect(lines(run.stderr)).toHaveLength(1);
      expect(run.stderr).toMatch(new RegExp(`${busy}.*in use`));
      expect(run.stderr).toMatch(/--http-port/);
      expect(run.stderr + run.stdout).not.toMatch(/\n\s+at /);
      expect(await listening(grpc)).toBe(false);
      expect(await listening(metrics)).toBe(false);
    } finally {
      held.close();
    }
  });

  it("a missing --model-repository", async () => {
    const [http, grpc, metrics] = [await freePort(), await freePort(), await freePort()];
    const missing = join(other, "no-such-folder");
    const run = await runToExit([
      ...["--model-repository", missing],
      ...["--http-port", String(http), "--grpc-port", String(grpc), "--metrics-port", String(metrics)],
    ]);
    expect(run.code).not.toBe(0);
    expect(run.code).not.toBeNull();
    expect(lines(run.stderr)).toHaveLength(1);
    expect(run.stderr).toContain(missing);
    expect(run.stderr + run.stdout).not.toMatch(/\n\s+at /);
    // Refused before any port opened: no "listening" line.
    expect(run.stdout).not.toMatch(/"listening"/);
    for (const port of [http, grpc, metrics]) expect(await listening(port)).toBe(false);
  });
});

describe("--default-model-repository (what `pnpm start` passes)", () => {
  const served = async (args: string[]) => {
    const server = await startServerProcess(args);
    try {
      const index = (await postJson(`${server.http}/v2/repository/index`, {})).json as { name: string }[];
      return index.map((m) => m.name).sort();
    } finally {
      expect(await server.stop()).toBe(0);
    }
  };

  it("serves the default repository when no --model-repository is given", async () => {
    expect(await served(["--default-model-repository", other])).toEqual(["other"]);
  });

  it("a --model-repository replaces it: that repository alone is served", async () => {
    const both = ["--default-model-repository", other, "--model-repository", repo, "--exit-on-error=false"];
    expect(await served(both)).toEqual(["broken", "echo"]);
  });
});

describe("--log-style", () => {
  it("text: one readable line per entry, not JSON", async () => {
    const proc = spawn(
      process.execPath,
      [SERVER_MAIN, "--no-fetch-models", "--model-repository", other, "--log-style", "text", "--http-port", "0"].concat(
        ["--grpc-port", "0", "--metrics-port", "0"],
      ),
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    const started = new Promise<void>((resolve, reject) => {
      proc.stdout.on("data", (d) => {
        stdout += String(d);
        if (/server started/.test(stdout)) resolve();
      });
      proc.on("exit", (code) => reject(new Error(`exited with ${code}: ${stdout}`)));
    });
    try {
      await started;
      const started_ = lines(stdout).find((l) => l.includes("server started")) ?? "";
      expect(() => JSON.parse(started_)).toThrow();
      expect(started_).toMatch(/^\S+ INFO +server started .*ready=true/);
      expect(lines(stdout).find((l) => l.includes("model loaded"))).toMatch(/model=other/);
    } finally {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        await new Promise((resolve) => proc.once("exit", resolve));
      }
    }
  });
});
