/**
 * A process serving one TypeScript stage loads only what it serves: the optional
 * integrations (the Redis response cache's ioredis, OpenTelemetry, SageMaker, Vertex AI,
 * the model downloader) and onnxruntime-node are loaded when a flag or a model asks for
 * them, never at start. Observed from outside: the server runs with a --import preload
 * (test/fixtures/record-imports.mjs) that writes down every module it resolves and who
 * asked for it.
 */
import { readFile, rm } from "node:fs/promises";
import net, { type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  makeSeedRepository,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
} from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";

const PRELOAD = join(import.meta.dirname, "fixtures", "record-imports.mjs");
const ONE_STAGE = ["--model-control-mode", "explicit", "--load-model", "resnet50_preprocess"];

/** One module resolved: its URL and the URL of the module that imported or required it. */
interface Resolution {
  url: string;
  from: string;
}

let repo: string;
beforeAll(async () => {
  repo = await makeSeedRepository();
});
afterAll(async () => {
  await removeDir(repo);
});

const importLog = () => join(tmpdir(), `trellis-imports-${process.pid}-${Math.random().toString(36).slice(2)}.txt`);
const probe = (log: string) => ({ env: { NODE_OPTIONS: `--import ${PRELOAD}`, TRELLIS_IMPORT_LOG: log } });

async function readLog(log: string): Promise<Resolution[]> {
  const lines = (await readFile(log, "utf8")).split("\n").filter((line) => line !== "");
  return lines.map((line) => {
    const [url = "", from = ""] = line.split("\t");
    return { url, from };
  });
}

/** Starts the server on the seed repository with `args` under the probe; what it resolved by the time it is ready. */
async function modulesLoaded(args: string[]): Promise<Resolution[]> {
  const log = importLog();
  let server: ServerProcess | undefined;
  try {
    server = await startServerProcess(["--model-repository", repo, ...ONE_STAGE, ...args], probe(log));
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
    expect((await fetch(`${server.http}/v2/models/resnet50_preprocess/ready`)).status).toBe(200);
    return await readLog(log);
  } finally {
    if (server) expect(await server.stop()).toBe(0);
    await rm(log, { force: true });
  }
}

/** The npm package a file URL lies in ("@scope/name" or "name"): the part after its last node_modules/. */
function packageOf(url: string): string | undefined {
  const at = url.lastIndexOf("/node_modules/");
  if (at < 0) return undefined;
  const [first = "", second = ""] = url.slice(at + "/node_modules/".length).split("/");
  return first.startsWith("@") ? `${first}/${second}` : first;
}

const packagesLoaded = (loaded: Resolution[]) =>
  new Set(loaded.map((r) => packageOf(r.url)).filter((p): p is string => p !== undefined));
const urlsWith = (loaded: Resolution[], part: string) => loaded.map((r) => r.url).filter((url) => url.includes(part));
const isOtel = (name: string | undefined) => name?.startsWith("@opentelemetry/") === true;

it("a process serving one TypeScript stage loads no ioredis, OpenTelemetry, onnxruntime-node or cloud endpoint", async () => {
  const loaded = await modulesLoaded([]);
  const packages = packagesLoaded(loaded);
  // The probe sees what the server does load: the stage's package (and its sharp), the server's own modules.
  expect(urlsWith(loaded, "/packages/preprocess/dist/index.js").length).toBeGreaterThan(0);
  expect(packages.has("sharp")).toBe(true);
  expect(urlsWith(loaded, "/apps/server/dist/server.js").length).toBeGreaterThan(0);

  expect(packages.has("ioredis")).toBe(false);
  expect(packages.has("onnxruntime-node")).toBe(false);
  // prom-client (the metrics) requires OpenTelemetry's no-op API for its exemplars; nothing else
  // of OpenTelemetry is loaded, and nothing but prom-client reaches into it.
  expect([...packages].filter(isOtel)).toEqual(["@opentelemetry/api"]);
  const intoOtel = loaded.filter((r) => isOtel(packageOf(r.url)) && !isOtel(packageOf(r.from)));
  expect(new Set(intoOtel.map((r) => packageOf(r.from)))).toEqual(new Set(["prom-client"]));
  for (const module of [
    "/apps/server/dist/observability/otel.js",
    "/apps/server/dist/integrations/redis-cache.js",
    "/packages/frontends/dist/cloud-index.js",
    "/packages/frontends/dist/http/sagemaker.js",
    "/packages/frontends/dist/http/vertex-ai.js",
    "/tooling/dist/index.js",
  ]) {
    expect(urlsWith(loaded, module)).toEqual([]);
  }
});

it("--trace-config mode=opentelemetry loads OpenTelemetry's SDK, and nothing else optional", async () => {
  const loaded = await modulesLoaded(["--trace-config", "mode=opentelemetry", "--trace-config", "rate=1"]);
  const packages = packagesLoaded(loaded);
  for (const name of ["@opentelemetry/sdk-trace-base", "@opentelemetry/exporter-trace-otlp-http"]) {
    expect(packages.has(name)).toBe(true);
  }
  expect(urlsWith(loaded, "/apps/server/dist/observability/otel.js").length).toBeGreaterThan(0);
  expect(packages.has("ioredis")).toBe(false);
  expect(packages.has("onnxruntime-node")).toBe(false);
});

it("--cache-config redis loads ioredis (a Redis it cannot reach stops the server at start)", async () => {
  // A port nothing listens on: the one a server just had.
  const free = net.createServer();
  await new Promise<void>((resolve) => free.listen(0, "127.0.0.1", resolve));
  const port = (free.address() as AddressInfo).port;
  await new Promise((resolve) => free.close(resolve));
  const log = importLog();
  try {
    const refusal = await startupRefusal(
      [
        ...["--model-repository", repo, ...ONE_STAGE],
        ...["--cache-config", "redis,host=127.0.0.1", "--cache-config", `redis,port=${port}`],
      ],
      probe(log),
    );
    expect(refusal).toContain(`--cache-config redis: cannot reach Redis at 127.0.0.1:${port}`);
    const packages = packagesLoaded(await readLog(log));
    expect(packages.has("ioredis")).toBe(true);
    expect(packages.has("@opentelemetry/sdk-trace-base")).toBe(false);
  } finally {
    await rm(log, { force: true });
  }
});
