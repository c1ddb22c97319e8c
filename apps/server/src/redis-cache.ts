/**
 * Triton's Redis response cache (--cache-config redis,host=...,port=...): the
 * response cache kept in a Redis server, so the replicas of a deployment share
 * it (an answer one computed is a hit for the others). Entries are the
 * responses as KServe v2 gRPC messages, raw tensors in them, over TCP or TLS; Redis's own
 * maxmemory policy bounds and evicts them. A Redis that fails mid-run costs
 * cache hits, never requests: a failed lookup is a miss, a failed insert is
 * skipped, each logged.
 */
import { readFile } from "node:fs/promises";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { ModelInferResponseSchema } from "@trellis/protocol";
import {
  type InferRequest,
  type InferResponse,
  inferResponseFromWire,
  inferResponseToWire,
  type ResponseStore,
  type StageLogger,
} from "@trellis/stage";
import { Redis } from "ioredis";

export interface RedisCacheSettings {
  host: string;
  port: number;
  user?: string;
  password?: string;
  /** How long a command may take before it counts as failed (Triton's wait_timeout_ms). */
  waitTimeoutMs: number;
  /** TLS (Triton's tls_enabled): PEM files for the CA to trust (default the system's) and a client certificate. */
  tls?: { caCert?: string; cert?: string; key?: string; sni?: string };
}

/** A TLS setting's file, read now: one that cannot be read names the setting. */
async function pem(setting: string, path: string | undefined): Promise<Buffer | undefined> {
  if (path === undefined) return undefined;
  return readFile(path).catch((err: Error) => {
    throw new Error(`${setting}=${path}: ${err.message}`);
  });
}

/** Where Trellis's entries live in the Redis keyspace. */
const KEY_PREFIX = "trellis:response:";

export class RedisResponseCache implements ResponseStore {
  readonly shared = true;
  private constructor(
    private readonly redis: Redis,
    private readonly log?: StageLogger,
  ) {}

  /** Connects, and checks the server answers: one that cannot be reached stops the server at start. */
  static async connect(settings: RedisCacheSettings, log?: StageLogger): Promise<RedisResponseCache> {
    const tls = settings.tls && {
      ...(settings.tls.caCert ? { ca: await pem("ca_cert", settings.tls.caCert) } : {}),
      ...(settings.tls.cert ? { cert: await pem("cert", settings.tls.cert) } : {}),
      ...(settings.tls.key ? { key: await pem("key", settings.tls.key) } : {}),
      ...(settings.tls.sni ? { servername: settings.tls.sni } : {}),
    };
    const redis = new Redis({
      host: settings.host,
      port: settings.port,
      ...(tls ? { tls } : {}),
      ...(settings.user ? { username: settings.user } : {}),
      ...(settings.password ? { password: settings.password } : {}),
      commandTimeout: settings.waitTimeoutMs,
      connectTimeout: settings.waitTimeoutMs,
      lazyConnect: true,
      // Failing fast while disconnected: a request must not wait on the cache.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
    });
    // Errors surface through the commands that fail; the event tells why a connection failed.
    let why: Error | undefined;
    redis.on("error", (err: Error) => {
      why = err;
    });
    try {
      await redis.connect();
      await redis.ping();
    } catch (err) {
      redis.disconnect();
      throw new Error(`cannot reach Redis at ${settings.host}:${settings.port}: ${(why ?? (err as Error)).message}`);
    }
    return new RedisResponseCache(redis, log);
  }

  async lookup(key: string, request: InferRequest): Promise<InferResponse | undefined> {
    let stored: Buffer | null;
    try {
      stored = await this.redis.getBuffer(KEY_PREFIX + key);
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
      await this.redis.set(
        KEY_PREFIX + key,
        Buffer.from(toBinary(ModelInferResponseSchema, inferResponseToWire(response))),
      );
    } catch (err) {
      this.log?.warn({ err: (err as Error).message }, "Redis response cache insert failed: not cached");
    }
  }

  close(): void {
    this.redis.disconnect();
  }
}
