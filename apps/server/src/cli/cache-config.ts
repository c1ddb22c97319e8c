/**
 * The response cache the command line asks for, read as tritonserver reads it:
 * --cache-config "<cache>,<key>=<value>" (repeatable) for Triton's local cache
 * (one setting, size in bytes) or its redis cache, whose settings keep the names
 * of Triton's redis cache implementation (triton-inference-server/redis_cache),
 * so a deployment's flags work as pasted. tritonserver's older
 * --response-cache-byte-size <n> is local,size=<n> (0: no cache).
 */
import type { RedisCacheSettings } from "../integrations/redis-cache.js";
import { splitSetting, UsageError } from "./usage.js";

export type CacheChoice = { kind: "local"; size: number } | { kind: "redis"; settings: RedisCacheSettings };

/** The redis cache's settings, in the order the refusal of an unknown one lists them. */
const REDIS_SETTINGS = [
  "host",
  "port",
  "user",
  "password",
  "db",
  "connect_timeout",
  "socket_timeout",
  "pool_size",
  "wait_timeout",
  "tls_enabled",
  "cert",
  "key",
  "cacert",
  "cacert_dir",
  "sni",
] as const;
type RedisSetting = (typeof REDIS_SETTINGS)[number];
const TLS_SETTINGS = ["cert", "key", "cacert", "cacert_dir", "sni"] as const;

/** Triton's redis cache reads its credentials from these when the flags do not give them. */
export const REDIS_USERNAME_ENV = "TRITONCACHE_REDIS_USERNAME";
export const REDIS_PASSWORD_ENV = "TRITONCACHE_REDIS_PASSWORD";

const isRedisSetting = (key: string): key is RedisSetting => (REDIS_SETTINGS as readonly string[]).includes(key);

/** A whole number at least `min`, or a UsageError naming the entry and what was expected. */
function whole(entry: string, value: string | undefined, what: string, min: number): number {
  const n = Number(value);
  if (!value || !Number.isSafeInteger(n) || n < min) throw new UsageError(`--cache-config ${entry}: expected ${what}`);
  return n;
}

function redisSettings(entries: string[], env: NodeJS.ProcessEnv): RedisCacheSettings {
  const given = new Map<RedisSetting, { entry: string; value: string }>();
  for (const entry of entries) {
    const { key, value } = splitSetting(entry);
    if (!isRedisSetting(key) || value === undefined) {
      throw new UsageError(
        `--cache-config ${entry}: the redis cache's settings are ${REDIS_SETTINGS.join(", ")} (each redis,<setting>=<value>)`,
      );
    }
    given.set(key, { entry, value });
  }
  const host = given.get("host");
  const port = given.get("port");
  if (!host?.value || !port) {
    throw new UsageError(
      "--cache-config redis: host and port are both required, as in Triton: --cache-config redis,host=<host> --cache-config redis,port=<port>",
    );
  }
  const number = (key: RedisSetting, what: string, fallback: number, min = 0) => {
    const s = given.get(key);
    return s ? whole(s.entry, s.value, what, min) : fallback;
  };
  const text = (key: RedisSetting) => given.get(key)?.value;
  const user = text("user") ?? env[REDIS_USERNAME_ENV];
  const password = text("password") ?? env[REDIS_PASSWORD_ENV];
  const settings: RedisCacheSettings = {
    host: host.value,
    port: whole(port.entry, port.value, "a port number", 1),
    ...(user ? { user } : {}),
    ...(password ? { password } : {}),
    db: number("db", "a database number", 0),
    connectTimeoutMs: number("connect_timeout", "a number of milliseconds (0: no limit)", 0),
    socketTimeoutMs: number("socket_timeout", "a number of milliseconds (0: no limit)", 0),
    poolSize: number("pool_size", "a number of connections, 1 or more", 1, 1),
    waitTimeoutMs: number("wait_timeout", "a number of milliseconds, 1 or more", 1000, 1),
  };
  const tlsEnabled = given.get("tls_enabled");
  if (tlsEnabled && tlsEnabled.value !== "true" && tlsEnabled.value !== "false") {
    throw new UsageError(`--cache-config ${tlsEnabled.entry}: expected true or false`);
  }
  const tlsGiven = TLS_SETTINGS.filter((k) => given.has(k));
  if (tlsEnabled?.value === "true") {
    settings.tls = {
      ...(given.has("cert") ? { cert: text("cert") } : {}),
      ...(given.has("key") ? { key: text("key") } : {}),
      ...(given.has("cacert") ? { cacert: text("cacert") } : {}),
      ...(given.has("cacert_dir") ? { cacertDir: text("cacert_dir") } : {}),
      ...(given.has("sni") ? { sni: text("sni") } : {}),
    };
  } else if (tlsGiven.length > 0) {
    // Triton reads these only with tls_enabled; refused rather than silently connecting in the clear.
    throw new UsageError(
      `--cache-config redis,${tlsGiven.join("/")}: TLS settings need --cache-config redis,tls_enabled=true`,
    );
  }
  return settings;
}

/** The response cache --cache-config and --response-cache-byte-size ask for, or undefined for none. */
export function readCacheConfig(
  cacheConfig: string[],
  responseCacheByteSize: string | undefined,
  env: NodeJS.ProcessEnv,
): CacheChoice | undefined {
  if (responseCacheByteSize !== undefined && cacheConfig.length > 0) {
    throw new UsageError(
      "incompatible flags --response-cache-byte-size and --cache-config: give one (--cache-config local,size=<bytes> is the first's successor), as tritonserver requires",
    );
  }
  if (responseCacheByteSize !== undefined) {
    const n = Number(responseCacheByteSize);
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new UsageError(
        `--response-cache-byte-size ${responseCacheByteSize}: expected a whole number of bytes (0: no cache)`,
      );
    }
    return n > 0 ? { kind: "local", size: n } : undefined;
  }
  const byCache = new Map<string, string[]>();
  for (const entry of cacheConfig) {
    const cache = splitSetting(entry).scope;
    if (cache !== "local" && cache !== "redis") {
      throw new UsageError(
        `--cache-config ${entry}: the caches are local ("local,size=<bytes>") and redis ("redis,host=<host>", "redis,port=<port>"), each setting given as <cache>,<setting>=<value>`,
      );
    }
    byCache.set(cache, [...(byCache.get(cache) ?? []), entry]);
  }
  if (byCache.size > 1) throw new UsageError("--cache-config: one response cache, local or redis, not both");
  const redis = byCache.get("redis");
  if (redis) return { kind: "redis", settings: redisSettings(redis, env) };
  const local = byCache.get("local");
  if (!local) return undefined;
  let size: number | undefined;
  for (const entry of local) {
    const { key, value } = splitSetting(entry);
    if (key !== "size") throw new UsageError(`--cache-config ${entry}: the local cache's one setting is size=<bytes>`);
    size = whole(entry, value, "local,size=<bytes> with a whole number of bytes", 1);
  }
  return { kind: "local", size: size as number };
}
