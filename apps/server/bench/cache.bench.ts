/**
 * The response cache's miss and hit times (docs/bench-history.md, "Response cache"): the seed
 * ensemble with the shared MobileNetV2 and `response_cache { enable: true }`, served with
 * `--cache-config local,size=...` and, when `redis-server` is on the PATH, with a Redis cache on
 * loopback, one server at a time. Each of the 13 fixture photos is sent CACHE_PASSES (3) times,
 * made distinct by two trailing bytes, and each of those twice over gRPC by grpc-js: the first
 * call a miss, the repeat a hit; the server's statistics must count exactly that. Prints the
 * p50 (and p90) of each, client side.
 * Run (after pnpm build): node --enable-source-maps dist/bench/cache.bench.js
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createServer } from "node:net";
import {
  fixturePhotos,
  grpcJsInferenceClient,
  makeSeedRepository,
  median,
  percentile,
  readFixtureImage,
  removeDir,
  startServerProcess,
} from "@trellis/testing";

const PASSES = Number(process.env.CACHE_PASSES ?? 3);

function frame(image: Uint8Array): Buffer {
  const length = Buffer.alloc(4);
  length.writeUInt32LE(image.length);
  return Buffer.concat([length, image]);
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function redisServer(): Promise<{ proc: ChildProcess; port: number } | undefined> {
  try {
    execFileSync("redis-server", ["--version"], { stdio: "pipe" });
  } catch {
    console.log("redis-server not found: the Redis cache is not measured (apt-get install redis-server)");
    return undefined;
  }
  const port = await freePort();
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
  const proc = spawn("redis-server", args, { stdio: "ignore" });
  await new Promise((r) => setTimeout(r, 500));
  return { proc, port };
}

interface Result {
  cache: string;
  miss: number[];
  hit: number[];
}

async function measure(repo: string, cache: string, cacheArgs: string[]): Promise<Result> {
  const server = await startServerProcess(["--model-repository", repo, ...cacheArgs]);
  const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
  const result: Result = { cache, miss: [], hit: [] };
  const call = async (image: Uint8Array) => {
    const start = performance.now();
    await client.modelInfer({
      model_name: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [frame(image)],
    });
    return performance.now() - start;
  };
  try {
    // One uncounted call first, so the first miss does not pay for connecting and warming up.
    await call(readFixtureImage("chelsea.jpg"));
    for (let pass = 0; pass < PASSES; pass++) {
      for (const name of fixturePhotos()) {
        const bytes = readFixtureImage(name);
        const image = new Uint8Array(bytes.length + 2);
        image.set(bytes);
        image.set([0xa5, pass], bytes.length); // after the image's end: decoders ignore it, the cache key does not
        result.miss.push(await call(image));
        result.hit.push(await call(image));
      }
    }
    const stats = (await (await fetch(`${server.http}/v2/models/resnet50_ensemble/stats`)).json()) as {
      model_stats: { inference_stats: { cache_hit?: { count: number }; cache_miss?: { count: number } } }[];
    };
    const s = stats.model_stats[0]!.inference_stats;
    const n = PASSES * fixturePhotos().length;
    if (s.cache_hit?.count !== n || s.cache_miss?.count !== n + 1)
      throw new Error(`${cache}: expected ${n} hits and ${n + 1} misses, the server counted ${JSON.stringify(s)}`);
  } finally {
    client.close();
    await server.stop();
  }
  return result;
}

const repo = await makeSeedRepository({
  prefix: "trellis-cache-bench-",
  editConfig: (name, text) => (name === "resnet50_ensemble" ? `${text}\nresponse_cache { enable: true }\n` : text),
});
const redis = await redisServer();
try {
  const results = [await measure(repo, "local", ["--cache-config", "local,size=268435456"])];
  if (redis) {
    const args = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${redis.port}`];
    results.push(await measure(repo, "redis", args));
  }
  const ms = (xs: number[], p: number) => `${percentile(xs, p).toFixed(2)}`;
  console.log(
    `\n${PASSES} passes of ${fixturePhotos().length} fixture photos, each sent twice over gRPC (grpc-js); MobileNetV2 int8`,
  );
  for (const r of results) {
    console.log(
      `${r.cache}: miss p50 ${median(r.miss).toFixed(2)} ms (p90 ${ms(r.miss, 90)}), hit p50 ${median(r.hit).toFixed(2)} ms (p90 ${ms(r.hit, 90)}), ${r.miss.length} each`,
    );
  }
} finally {
  redis?.proc.kill();
  await removeDir(repo);
}
