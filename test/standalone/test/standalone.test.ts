/**
 * Issue 55: the repository stands alone. The committed tree (`git archive HEAD`) is copied into
 * a temporary folder with nothing beside it (no ../shared), and there the README's first two
 * commands run as written (`pnpm install`, `pnpm start`, given free ports as the README allows)
 * and then its `pnpm client classify samples/images/chelsea.jpg`, offline: every download is
 * sent to a proxy that refuses connections, so the bundled MobileNetV2 is what classifies.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const repoRoot = join(import.meta.dirname, "..", "..", "..");
const readme = readFileSync(join(repoRoot, "README.md"), "utf8");

/** The README's first shell block, each line's command without its comment. */
function firstCommands(): string[] {
  const block = /```sh\n([\s\S]*?)```/.exec(readme)?.[1] ?? "";
  return block
    .split("\n")
    .map((line) => line.replace(/#.*$/, "").trim())
    .filter(Boolean);
}

/** The README's classify command, as its table prints it. */
const classifyCommand = (): string => /`(pnpm client classify samples\/images\/chelsea\.jpg)`/.exec(readme)?.[1] ?? "";

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

let parent: string;
let clone: string;
let env: NodeJS.ProcessEnv;
let server: ChildProcess | undefined;
let serverLog = "";
/** The server's ports, as its log reports them. */
const ports = { http: 0, grpc: 0 };

/** Runs `command` (a README line: words split on spaces) in the clone; its output, or the failure with it. */
function runInClone(command: string, extra: string[] = []): string {
  const [program, ...args] = command.split(/\s+/);
  try {
    return execFileSync(program as string, [...args, ...extra], { cwd: clone, env, encoding: "utf8", stdio: "pipe" });
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(`${command} failed: ${e.message}\n${e.stdout ?? ""}\n${e.stderr ?? ""}`);
  }
}

/** The port the server's log says it listens on for `protocol` (its JSON "listening" line), once it has said so. */
function listeningPort(protocol: string): number | undefined {
  for (const line of serverLog.split("\n")) {
    if (!line.includes('"msg":"listening"') || !line.includes(`"protocol":"${protocol}"`)) continue;
    const port = Number(/"port":(\d+)/.exec(line)?.[1]);
    if (port > 0) return port;
  }
  return undefined;
}

/**
 * Waits for the server to report ready, or to exit. Its ports are its own choice (port 0), read
 * from its log: ports picked here before a first start's minutes of building could be taken by
 * another suite's server meanwhile, which would then answer for it. The bound is only a hang
 * guard, under the test's own 900 s: a first `pnpm start` builds every package, which on a CI
 * machine running the other suites beside it has taken over 300 s.
 */
async function waitReady(deadline: number): Promise<void> {
  while (Date.now() < deadline) {
    if (server?.exitCode !== null) throw new Error(`pnpm start exited (${server?.exitCode}):\n${serverLog}`);
    ports.http = listeningPort("http") ?? 0;
    ports.grpc = listeningPort("grpc") ?? 0;
    if (!ports.http || !ports.grpc) {
      await new Promise((r) => setTimeout(r, 500));
      continue;
    }
    const ok = await fetch(`http://127.0.0.1:${ports.http}/v2/health/ready`)
      .then((r) => r.status === 200)
      .catch(() => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`not ready in time:\n${serverLog}`);
}

beforeAll(async () => {
  parent = await mkdtemp(join(tmpdir(), "trellis-alone-"));
  clone = join(parent, "trellis");
  await mkdir(clone);
  // What is committed, not the working tree: untracked or ignored files here must not help.
  execFileSync("sh", ["-c", `git -C "${repoRoot}" archive --format=tar HEAD | tar -x -C "${clone}"`]);
  const deadProxy = `http://127.0.0.1:${await freePort()}`;
  env = {
    ...process.env,
    CI: "",
    ONNXRUNTIME_NODE_INSTALL: "skip",
    TURBO_TELEMETRY_DISABLED: "1",
    TURBO_NO_UPDATE_NOTIFIER: "1",
    // Offline: pnpm takes every package from its store; a model download has nowhere to go.
    npm_config_offline: "true",
    HTTPS_PROXY: deadProxy,
    HTTP_PROXY: deadProxy,
    https_proxy: deadProxy,
    http_proxy: deadProxy,
    NO_PROXY: "",
    no_proxy: "",
  };
}, 60_000);

/** Whether anything still answers on the server's HTTP port. */
const answers = () =>
  fetch(`http://127.0.0.1:${ports.http}/v2/health/live`).then(
    () => true,
    () => false,
  );

afterAll(async () => {
  if (server?.pid !== undefined && server.exitCode === null && server.signalCode === null) {
    // pnpm does not pass SIGTERM on to the script it runs: the whole group (pnpm, start.mjs and the
    // server in it) gets it, and the server drains and exits.
    const exited = new Promise((r) => server?.once("exit", r));
    process.kill(-server.pid, "SIGTERM");
    await exited;
    for (let i = 0; ports.http && i < 60 && (await answers()); i++) await new Promise((r) => setTimeout(r, 500));
  }
  await rm(parent, { recursive: true, force: true });
}, 60_000);

describe("a clone with nothing beside it", () => {
  it("has no ../shared and the README's commands name only what it holds", async () => {
    expect(existsSync(join(clone, "..", "shared"))).toBe(false);
    expect(await readdir(parent)).toEqual(["trellis"]);
    expect(firstCommands()).toEqual(["pnpm install", "pnpm start"]);
    expect(classifyCommand()).toBe("pnpm client classify samples/images/chelsea.jpg");
    expect(existsSync(join(clone, "samples", "images", "chelsea.jpg"))).toBe(true);
  });

  it("pnpm install, pnpm start, then pnpm client classify: chelsea is an Egyptian cat", async () => {
    const deadline = Date.now() + 840_000;
    const [install, start] = firstCommands() as [string, string];
    runInClone(install);
    const [program, ...args] = start.split(/\s+/);
    const portFlags = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"];
    server = spawn(program as string, [...args, ...portFlags], {
      cwd: clone,
      env,
      stdio: ["ignore", "pipe", "pipe"],
      detached: true, // its own process group, so the end of the test stops all of it
    });
    server.stdout?.on("data", (c: Buffer) => {
      serverLog += c.toString();
    });
    server.stderr?.on("data", (c: Buffer) => {
      serverLog += c.toString();
    });
    await waitReady(deadline);
    expect(serverLog).toContain("bundled MobileNetV2 (offline)");
    const answer = runInClone(classifyCommand(), ["-u", `127.0.0.1:${ports.grpc}`]);
    expect(answer).toContain("chelsea.jpg");
    // The top class, printed as Triton's image_client prints it: "    0.757 = Egyptian cat".
    const first = answer.split("\n").find((l) => /^\s+\d\.\d+ = /.test(l)) ?? "";
    expect(first, answer).toContain("Egyptian cat");
    // The models it served are the clone's own, in its own models/.
    expect(existsSync(join(clone, "models", "resnet50_inference", "1", "model.onnx"))).toBe(true);
    expect(dirname(clone)).toBe(parent);
  }, 900_000);

  it("stops, server and all, on SIGTERM to the process group", async () => {
    expect(await answers()).toBe(true);
    const pid = server?.pid as number;
    const exited = new Promise((r) => server?.once("exit", r));
    process.kill(-pid, "SIGTERM");
    await exited;
    let up = true;
    for (let i = 0; i < 60 && up; i++) {
      up = await answers();
      if (up) await new Promise((r) => setTimeout(r, 500));
    }
    expect(up).toBe(false);
  }, 60_000);
});
