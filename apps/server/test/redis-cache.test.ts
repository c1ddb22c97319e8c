/**
 * Triton's Redis response cache, black-box: two server processes on one
 * redis-server share answers (what one computed is a hit for the other), a
 * changed model file starts afresh, and a Redis that cannot be reached stops
 * the server at start. Needs redis-server (Debian: apt-get install
 * redis-server; .ci/run installs it): without it this is skipped, saying so,
 * except in CI, where it fails.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { copyFile, mkdtemp, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
  TLS_CERT_PATH,
  TLS_KEY_PATH,
} from "@trellis/testing";
import { Redis } from "ioredis";
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

/** A redis-server of its own on a free port (no persistence; TLS with the test certificate), once it accepts connections. */
async function redisServer(
  options: { tls?: boolean; args?: string[] } = {},
): Promise<{ proc: ChildProcess; port: number }> {
  const port = await freePort();
  const ports = options.tls
    ? ["--port", "0", "--tls-port", String(port), "--tls-cert-file", TLS_CERT_PATH, "--tls-key-file", TLS_KEY_PATH]
    : ["--port", String(port)];
  const proc = spawn(
    "redis-server",
    [
      ...ports,
      ...(options.tls ? ["--tls-auth-clients", "no"] : []),
      "--bind",
      "127.0.0.1",
      "--save",
      "",
      "--appendonly",
      "no",
      ...(options.args ?? []),
    ],
    { stdio: "ignore" },
  );
  await listening(port);
  return { proc, port };
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
    ({ proc: redis, port } = await redisServer());
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

  it("reaches a Redis over TLS with the CA given (tls_enabled with cacert or cacert_dir), and stops at start without it", async () => {
    const tlsRedis = await redisServer({ tls: true });
    const caDir = await mkdtemp(join(tmpdir(), "trellis-redis-ca-"));
    try {
      await copyFile(TLS_CERT_PATH, join(caDir, "3a1f9c2e.0"));
      await writeFile(join(caDir, "README"), "not a certificate: passed over");
      const redisTls = [
        ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${tlsRedis.port}`],
        ...["--cache-config", "redis,tls_enabled=true"],
      ];
      for (const ca of [`redis,cacert=${TLS_CERT_PATH}`, `redis,cacert_dir=${caDir}`]) {
        const server = await startServerProcess(["--model-repository", repo, ...redisTls, "--cache-config", ca]);
        try {
          // Each pass asks its own question: the first is a miss, the repeat a hit.
          const values = ca.includes("cacert_dir") ? [8, 8, 8, 8] : [7, 7, 7, 7];
          for (let i = 0; i < 2; i++) expect((await infer(server, values)).status).toBe(200);
          expect(await stats(server)).toMatchObject({
            execution_count: 1,
            inference_stats: { cache_hit: { count: 1 } },
          });
        } finally {
          expect(await server.stop()).toBe(0);
        }
      }
      // Without the CA the certificate is not trusted: the cache is unusable, so the server does not start.
      const untrusted = await startupRefusal(["--model-repository", repo, ...redisTls]);
      expect(String(untrusted)).toMatch(/--cache-config redis: cannot reach Redis at 127\.0\.0\.1:\d+: .*certificate/);
      const noCerts = await startupRefusal([
        ...["--model-repository", repo, ...redisTls],
        ...["--cache-config", `redis,cacert_dir=${repo}`],
      ]);
      expect(String(noCerts)).toContain(`--cache-config redis: cacert_dir=${repo}: no PEM certificate in it`);
    } finally {
      tlsRedis.proc.kill();
      await removeDir(caDir);
    }
  });

  it("keeps pool_size connections and its entries in the db given", async () => {
    const probe = new Redis({ host: "127.0.0.1", port, lazyConnect: true });
    await probe.connect();
    const connections = async () =>
      String(await probe.call("CLIENT", "LIST"))
        .trim()
        .split("\n").length;
    try {
      const before = await connections();
      const server = await startServerProcess([
        "--model-repository",
        repo,
        ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${port}`],
        ...["--cache-config", "redis,pool_size=3", "--cache-config", "redis,db=5"],
      ]);
      try {
        expect(await connections()).toBe(before + 3);
        await probe.select(5);
        const inDb5 = async () => (await probe.keys("trellis:response:*")).length;
        const stored = await inDb5();
        // Four requests go over the pool's connections in turn; each answer lands in db 5.
        for (const v of [21, 22, 23, 24]) expect((await infer(server, [v, v, v, v])).status).toBe(200);
        expect(await inDb5()).toBe(stored + 4);
        await probe.select(0);
        expect((await probe.keys("trellis:response:*")).length).toBeLessThan(stored + 4);
      } finally {
        expect(await server.stop()).toBe(0);
      }
      expect(await connections()).toBe(before);
    } finally {
      probe.disconnect();
    }
  });

  it("authenticates with the flags' credentials or, as Triton, $TRITONCACHE_REDIS_USERNAME / _PASSWORD", async () => {
    const locked = await redisServer({ args: ["--requirepass", "redis123!"] });
    const endpoint = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${locked.port}`];
    try {
      const fromEnv = await startServerProcess(["--model-repository", repo, ...endpoint], {
        env: { TRITONCACHE_REDIS_USERNAME: "default", TRITONCACHE_REDIS_PASSWORD: "redis123!" },
      });
      try {
        for (let i = 0; i < 2; i++) expect((await infer(fromEnv, [9, 9, 9, 9])).status).toBe(200);
        expect(await stats(fromEnv)).toMatchObject({ inference_stats: { cache_hit: { count: 1 } } });
      } finally {
        expect(await fromEnv.stop()).toBe(0);
      }
      // The flag wins over the environment.
      const wrong = await startupRefusal(
        ["--model-repository", repo, ...endpoint, "--cache-config", "redis,password=wrong"],
        { env: { TRITONCACHE_REDIS_PASSWORD: "redis123!" } },
      );
      expect(String(wrong)).toMatch(/cannot reach Redis at 127\.0\.0\.1:\d+: WRONGPASS/);
      const none = await startupRefusal(["--model-repository", repo, ...endpoint]);
      expect(String(none)).toMatch(/cannot reach Redis at 127\.0\.0\.1:\d+: NOAUTH Authentication required/);
    } finally {
      locked.proc.kill();
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

  it("stops at start when Redis cannot be reached, and refuses settings as Triton does or that it does not know", async () => {
    const nowhere = await startupRefusal([
      "--model-repository",
      repo,
      ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${await freePort()}`],
    ]);
    expect(String(nowhere)).toMatch(/trellis-server: --cache-config redis: cannot reach Redis at 127\.0\.0\.1:\d+: /);
    const refusal = async (...flags: string[]) => String(await startupRefusal(["--model-repository", repo, ...flags]));
    const endpoint = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${port}`];
    expect(await refusal("--cache-config", "redis,host=127.0.0.1")).toContain(
      "--cache-config redis: host and port are both required, as in Triton",
    );
    expect(await refusal(...endpoint, "--cache-config", "redis,max_connections=4")).toContain(
      "--cache-config redis,max_connections=4: the redis cache's settings are host, port, user, password, db, connect_timeout, socket_timeout, pool_size, wait_timeout, tls_enabled, cert, key, cacert, cacert_dir, sni",
    );
    expect(await refusal(...endpoint, "--cache-config", "redis,pool_size=0")).toContain(
      "--cache-config redis,pool_size=0: expected a number of connections, 1 or more",
    );
    expect(await refusal(...endpoint, "--cache-config", `redis,cacert=${TLS_CERT_PATH}`)).toContain(
      "--cache-config redis,cacert: TLS settings need --cache-config redis,tls_enabled=true",
    );
    expect(await refusal("--cache-config", "local,size=1000000", ...endpoint)).toContain(
      "--cache-config: one response cache, local or redis, not both",
    );
    expect(await refusal("--response-cache-byte-size", "12345", "--cache-config", "local,size=67890")).toContain(
      "incompatible flags --response-cache-byte-size and --cache-config",
    );
  });
});
