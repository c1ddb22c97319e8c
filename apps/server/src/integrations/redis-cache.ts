/**
 * Triton's Redis response cache (--cache-config redis,host=...,port=...): the
 * response cache kept in a Redis server, so the replicas of a deployment share
 * it (an answer one computed is a hit for the others). Entries are the
 * responses as KServe v2 gRPC messages, raw tensors in them, over TCP or TLS; Redis's own
 * maxmemory policy bounds and evicts them. A Redis that fails mid-run costs
 * cache hits, never requests: a failed lookup is a miss, a failed insert is
 * skipped, each logged.
 */
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type { ConnectionOptions } from "node:tls";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { inferResponseFromWire, inferResponseToWire } from "@trellis/kserve/wire";
import { ModelInferResponseSchema } from "@trellis/protocol";
import type { ResponseStore } from "@trellis/runtime";
import type { InferRequest, InferResponse, StageLogger } from "@trellis/stage";
import { Redis, type RedisOptions } from "ioredis";

/** Triton's redis cache settings (cache-config.ts reads them from the command line). */
export interface RedisCacheSettings {
  host: string;
  port: number;
  user?: string;
  password?: string;
  /** The database number (db). */
  db: number;
  /** How long connecting may take (connect_timeout; 0: no limit, Triton's default). */
  connectTimeoutMs: number;
  /** How long a command may wait for its answer (socket_timeout; 0: wait_timeout bounds it, below). */
  socketTimeoutMs: number;
  /** Connections to Redis (pool_size); commands take them in turn. */
  poolSize: number;
  /**
   * wait_timeout: in Triton's redis cache (redis++), how long a request waits for one of the
   * pool's connections. ioredis pipelines commands on its connections instead of lending them
   * out, so here it bounds the wait for the command itself when socket_timeout sets no bound:
   * a Redis that stops answering costs a request that long at most, as a miss.
   */
  waitTimeoutMs: number;
  /** TLS (tls_enabled): the CA to trust as a PEM file and/or a folder of them (default the system's), a client certificate, SNI. */
  tls?: { cacert?: string; cacertDir?: string; cert?: string; key?: string; sni?: string };
}

/** A TLS setting's file, read now: one that cannot be read names the setting. */
async function pem(setting: string, path: string | undefined): Promise<Buffer | undefined> {
  if (path === undefined) return undefined;
  return readFile(path).catch((err: Error) => {
    throw new Error(`${setting}=${path}: ${err.message}`);
  });
}

/** Every PEM certificate file in `dir` (OpenSSL's CApath holds them under hashed names; any name is read here). */
async function pemDir(dir: string): Promise<Buffer[]> {
  const names = await readdir(dir).catch((err: Error) => {
    throw new Error(`cacert_dir=${dir}: ${err.message}`);
  });
  const files = await Promise.all(names.sort().map((n) => readFile(join(dir, n)).catch(() => undefined)));
  const certs: Buffer[] = [];
  for (const f of files) if (f?.includes("-----BEGIN CERTIFICATE-----")) certs.push(f);
  if (certs.length === 0) throw new Error(`cacert_dir=${dir}: no PEM certificate in it`);
  return certs;
}

async function tlsOptions(tls: NonNullable<RedisCacheSettings["tls"]>): Promise<ConnectionOptions> {
  const ca = [
    ...(tls.cacert ? [(await pem("cacert", tls.cacert)) as Buffer] : []),
    ...(tls.cacertDir ? await pemDir(tls.cacertDir) : []),
  ];
  return {
    ...(ca.length > 0 ? { ca } : {}),
    ...(tls.cert ? { cert: await pem("cert", tls.cert) } : {}),
    ...(tls.key ? { key: await pem("key", tls.key) } : {}),
    ...(tls.sni ? { servername: tls.sni } : {}),
  };
}

/** Where Trellis's entries live in the Redis keyspace. */
const KEY_PREFIX = "trellis:response:";

export class RedisResponseCache implements ResponseStore {
  readonly shared = true;
  private turn = 0;
  private constructor(
    private readonly pool: Redis[],
    private readonly log?: StageLogger,
  ) {}

  /** Opens the pool's connections and checks the server answers on each: one that cannot be reached stops the server at start. */
  static async connect(settings: RedisCacheSettings, log?: StageLogger): Promise<RedisResponseCache> {
    const tls = settings.tls && (await tlsOptions(settings.tls));
    const options: RedisOptions = {
      host: settings.host,
      port: settings.port,
      db: settings.db,
      ...(tls ? { tls } : {}),
      ...(settings.user ? { username: settings.user } : {}),
      ...(settings.password ? { password: settings.password } : {}),
      commandTimeout: settings.socketTimeoutMs || settings.waitTimeoutMs,
      // 0: no limit (ioredis sets no timer for 0).
      connectTimeout: settings.connectTimeoutMs,
      lazyConnect: true,
      // Failing fast while disconnected: a request must not wait on the cache.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
    };
    const pool: Redis[] = [];
    try {
      for (let i = 0; i < settings.poolSize; i++) {
        const redis = new Redis(options);
        pool.push(redis);
        // Errors surface through the commands that fail; the event tells why a connection failed.
        let why: Error | undefined;
        redis.on("error", (err: Error) => {
          why = err;
        });
        try {
          await redis.connect();
          await redis.ping();
        } catch (err) {
          throw new Error(
            `cannot reach Redis at ${settings.host}:${settings.port}: ${(why ?? (err as Error)).message}`,
          );
        }
      }
    } catch (err) {
      for (const redis of pool) redis.disconnect();
      throw err;
    }
    return new RedisResponseCache(pool, log);
  }

  /** The pool's connections in turn. */
  private next(): Redis {
    this.turn = (this.turn + 1) % this.pool.length;
    return this.pool[this.turn] as Redis;
  }

  async lookup(key: string, request: InferRequest): Promise<InferResponse | undefined> {
    let stored: Buffer | null;
    try {
      stored = await this.next().getBuffer(KEY_PREFIX + key);
    } catch (err) {
      this.log?.warn({ err: (err as Error).message }, "Redis response cache lookup failed: treated as a miss");
      return undefined;
    }
    if (!stored) return undefined;
    const message = fromBinary(ModelInferResponseSchema, stored);
    return { ...inferResponseFromWire(message, message.modelName), id: request.id };
  }

  async insert(key: string, response: InferResponse): Promise<void> {
    try {
      await this.next().set(
        KEY_PREFIX + key,
        Buffer.from(toBinary(ModelInferResponseSchema, inferResponseToWire(response))),
      );
    } catch (err) {
      this.log?.warn({ err: (err as Error).message }, "Redis response cache insert failed: not cached");
    }
  }

  close(): void {
    for (const redis of this.pool) redis.disconnect();
  }
}
