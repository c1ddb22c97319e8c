/**
 * Triton's Redis response cache, black-box: two server processes on one
 * redis-server share answers (what one computed is a hit for the other), a
 * changed model file starts afresh, and a Redis that cannot be reached stops
 * the server at start. Needs redis-server (Debian: apt-get install
 * redis-server; .ci/run installs it): without it this is skipped, saying so,
 * except in CI, where it fails.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import net from "node:net";
import { join } from "node:path";
import {
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
  TLS_CERT_PATH,
  TLS_KEY_PATH,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, freePort, makeRepository, postJson } from "./helpers.js";

function redisServerFound(): boolean {
  try {
    execFileSync("redis-server", ["--version"], { stdio: "pipe" });
    return true;
  } catch {
    if (!process.env.CI) console.warn("Redis cache tests skipped: no redis-server (apt-get install redis-server)");
    return !!process.env.CI;
  }
}

/** Resolves once something accepts connections on `port`. */
async function listening(port: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, "127.0.0.1", () => resolve(!!s.end()));
      s.on("error", () => resolve(false));
    });
    if (up) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on ${port}`);
}

interface Stats {
  inference_stats: { cache_hit?: { count: number }; cache_miss?: { count: number } };
  execution_count: number;
}
const stats = async (server: ServerProcess): Promise<Stats> =>
  ((await (await fetch(`${server.http}/v2/models/cached/stats`)).json()) as { model_stats: Stats[] }).model_stats[0]!;
const infer = (server: ServerProcess, values: number[]) =>
  postJson(`${server.http}/v2/models/cached/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: values }],
  });

describe.runIf(redisServerFound())("--cache-config redis", () => {
  let redis: ChildProcess;
  let port: number;
  let repo: string;
  beforeAll(async () => {
    port = await freePort();
    redis = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
      stdio: "ignore",
    });
    await listening(port);
    repo = await makeRepository({
      cached: { config: echoConfig("cached", { extra: "response_cache { enable: true }", params: { scale: "3" } }) },
    });
  });
  afterAll(async () => {
    redis?.kill();
    await removeDir(repo);
  });

  const start = () =>
    startServerProcess([
      "--model-repository",
      repo,
      ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${port}`],
    ]);

  it("shares answers between server processes: what one computed is a hit for the other", async () => {
    const a = await start();
    const b = await start();
    try {
      expect((await infer(a, [1, 2, 3, 4])).json.outputs[0].data).toEqual([3, 6, 9, 12]);
      expect(await stats(a)).toMatchObject({ execution_count: 1, inference_stats: { cache_miss: { count: 1 } } });
      // The other replica never ran the model for it: a hit, with the same answer.
      expect((await infer(b, [1, 2, 3, 4])).json.outputs[0].data).toEqual([3, 6, 9, 12]);
      expect(await stats(b)).toMatchObject({ execution_count: 0, inference_stats: { cache_hit: { count: 1 } } });
      // A different request is a miss there.
      expect((await infer(b, [5, 6, 7, 8])).json.outputs[0].data).toEqual([15, 18, 21, 24]);
      expect((await stats(b)).execution_count).toBe(1);
    } finally {
      expect(await a.stop()).toBe(0);
      expect(await b.stop()).toBe(0);
    }
  });

  it("starts afresh for a model whose files changed, whatever Redis holds from before", async () => {
    await writeFile(join(repo, "cached", "1", "notes.txt"), "a file of the model's, changed");
    const c = await start();
    try {
      expect((await infer(c, [1, 2, 3, 4])).json.outputs[0].data).toEqual([3, 6, 9, 12]);
      expect(await stats(c)).toMatchObject({ execution_count: 1, inference_stats: { cache_miss: { count: 1 } } });
    } finally {
      expect(await c.stop()).toBe(0);
    }
  });

  it("reaches a Redis over TLS with the CA given (tls_enabled, ca_cert), and stops at start without it", async () => {
    const tlsPort = await freePort();
    const tlsRedis = spawn(
      "redis-server",
      [
        ...["--port", "0", "--tls-port", String(tlsPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        ...["--tls-cert-file", TLS_CERT_PATH, "--tls-key-file", TLS_KEY_PATH, "--tls-auth-clients", "no"],
      ],
      { stdio: "ignore" },
    );
    try {
      await listening(tlsPort);
      const redisTls = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${tlsPort}`];
      const server = await startServerProcess([
        "--model-repository",
        repo,
        ...redisTls,
        ...["--cache-config", "redis,tls_enabled=true", "--cache-config", `redis,ca_cert=${TLS_CERT_PATH}`],
      ]);
      try {
        for (let i = 0; i < 2; i++) expect((await infer(server, [7, 7, 7, 7])).status).toBe(200);
        expect(await stats(server)).toMatchObject({ execution_count: 1, inference_stats: { cache_hit: { count: 1 } } });
      } finally {
        expect(await server.stop()).toBe(0);
      }
      // Without the CA the certificate is not trusted: the cache is unusable, so the server does not start.
      const untrusted = await startupRefusal([
        "--model-repository",
        repo,
        ...redisTls,
        ...["--cache-config", "redis,tls_enabled=true"],
      ]);
      expect(String(untrusted)).toMatch(/--cache-config redis: cannot reach Redis at 127\.0\.0\.1:\d+: .*certificate/);
    } finally {
      tlsRedis.kill();
    }
  });

  it("answers every request when Redis goes away mid-run: lookups become misses, said in the log", async () => {
    const d = await start();
    try {
      expect((await infer(d, [2, 2, 2, 2])).status).toBe(200);
      redis.kill();
      await new Promise((r) => redis.once("exit", r));
      const answer = await infer(d, [4, 4, 4, 4]);
      expect(answer.status).toBe(200);
      expect(answer.json.outputs[0].data).toEqual([12, 12, 12, 12]);
      expect(d.logs.some((l) => l.msg === "Redis response cache lookup failed: treated as a miss")).toBe(true);
    } finally {
      expect(await d.stop()).toBe(0);
    }
  });

  it("stops at start when Redis cannot be reached, and refuses settings it does not know", async () => {
    const nowhere = await startupRefusal([
      "--model-repository",
      repo,
      ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${await freePort()}`],
    ]);
    expect(String(nowhere)).toMatch(/trellis-server: --cache-config redis: cannot reach Redis at 127\.0\.0\.1:\d+: /);
    const pool = await startupRefusal(["--model-repository", repo, "--cache-config", "redis,max_connections=4"]);
    expect(String(pool)).toContain(
      "--cache-config redis,max_connections=4: the redis cache's settings here are host, port, user, password, wait_timeout_ms, tls_enabled, ca_cert, cert, key and sni",
    );
    const both = await startupRefusal([
      "--model-repository",
      repo,
      ...["--cache-config", "local,size=1000000", "--cache-config", "redis,host=127.0.0.1"],
    ]);
    expect(String(both)).toContain("--cache-config: one response cache, local or redis, not both");
  });
});
