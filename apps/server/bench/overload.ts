/**
 * Overload: the server process on the seed repository (the shared MobileNetV2 as the inference
 * model) takes OVERLOAD_REQUESTS (default 1000) requests (OVERLOAD_PROTOCOL grpc, the default, over one
 * connection; or http, HTTP/1.1 binary, a connection per caller) of one 1920x1080 JPEG each from
 * OVERLOAD_CONCURRENCY (default 250) callers at once. The inference step's config gets
 * `max_queue_size: OVERLOAD_QUEUE` (default 4; "none": left as the seed has it, so the server's
 * --default-max-queue-size applies). Reports how many were answered and refused, the time to
 * answer of each (p50, p99, max), whether any refused request was decoded first (preprocess's
 * request count against the answered ones), and the server's resident memory at start and peak.
 * Run: node apps/server/dist/bench/overload.js (after pnpm build); OVERLOAD_SERVER_ARGS adds
 * server flags (e.g. "--default-max-queue-size 0" with OVERLOAD_QUEUE=none: unbounded, as before).
 * OVERLOAD_TRACE=1 traces every request (Triton's trace file) and reports the server's own time
 * on each refused one: from the request read in full to its answer starting out.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { makeSeedRepository, percentile, removeDir, startServerProcess } from "@trellis/testing";
import { fullHdPhotos } from "./photos.js";

const REQUESTS = Number(process.env.OVERLOAD_REQUESTS ?? 1000);
const CONCURRENCY = Number(process.env.OVERLOAD_CONCURRENCY ?? 250);
const QUEUE = process.env.OVERLOAD_QUEUE ?? "4";
const PROTOCOL = process.env.OVERLOAD_PROTOCOL ?? "grpc";
const SERVER_ARGS = (process.env.OVERLOAD_SERVER_ARGS ?? "").split(/\s+/).filter(Boolean);

const rssOf = (pid: number) => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
};

async function main(): Promise<void> {
  const photos = await fullHdPhotos();
  const repo = await makeSeedRepository({
    editConfig: (model, config) =>
      model === "resnet50_inference" && QUEUE !== "none"
        ? config.replace(
            "max_queue_delay_microseconds: 100000",
            `max_queue_delay_microseconds: 100000\n  default_queue_policy { max_queue_size: ${Number(QUEUE)} }`,
          )
        : config,
  });
  const traceFile = join(repo, "trace.json");
  const tracing = process.env.OVERLOAD_TRACE
    ? ["--trace-config", `triton,file=${traceFile}`, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]
    : [];
  const server = await startServerProcess(["--model-repository", repo, ...tracing, ...SERVER_ARGS]);
  try {
    const pid = server.proc.pid as number;
    // 250 requests of ~400 KB queued on one connection: more than node's default 10 MB a session may
    // hold unsent, past which node's own client resets its streams (ENHANCE_YOUR_CALM).
    const transport = createGrpcTransport({ baseUrl: server.grpc, nodeOptions: { maxSessionMemory: 512 } });
    const client = createClient(GRPCInferenceService, transport);
    const request = (i: number) =>
      create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([photos[i % photos.length] as Uint8Array])],
      });
    /** One request: undefined when answered, else its code and message. */
    const call = async (i: number): Promise<{ code: string; message: string } | undefined> => {
      if (PROTOCOL === "http") {
        const image = photos[i % photos.length] as Uint8Array;
        const header = new TextEncoder().encode(
          JSON.stringify({
            inputs: [
              {
                name: "RAW_IMAGE",
                datatype: "BYTES",
                shape: [1, 1],
                parameters: { binary_data_size: image.byteLength + 4 },
              },
            ],
          }),
        );
        const body = new Uint8Array(header.byteLength + image.byteLength + 4);
        body.set(header, 0);
        body.set(frameBytes([image]), header.byteLength);
        const res = await fetch(`${server.http}/v2/models/resnet50_ensemble/infer`, {
          method: "POST",
          body,
          headers: { "inference-header-content-length": String(header.byteLength) },
        });
        const text = await res.text();
        return res.status === 200 ? undefined : { code: String(res.status), message: text };
      }
      try {
        await client.modelInfer(request(i));
        return undefined;
      } catch (err) {
        const e = ConnectError.from(err);
        return { code: String(e.code), message: e.rawMessage };
      }
    };
    // One request first: the connection and the model's first run are not the overload's.
    if (await call(0)) throw new Error("the first request failed");
    const rssStart = rssOf(pid);
    let rssPeak = rssStart;
    const sampler = setInterval(() => {
      rssPeak = Math.max(rssPeak, rssOf(pid));
    }, 100);
    const answered: number[] = [];
    const refused: number[] = [];
    const other = new Map<string, number>();
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < REQUESTS) {
          const i = next++;
          const start = performance.now();
          const failure = await call(i).catch((err: Error) => ({ code: "client", message: err.message }));
          if (!failure) answered.push(performance.now() - start);
          else if (/Exceeds maximum queue size/.test(failure.message)) refused.push(performance.now() - start);
          else {
            const key = `${failure.code}: ${failure.message.slice(0, 120)}`;
            other.set(key, (other.get(key) ?? 0) + 1);
          }
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    clearInterval(sampler);
    const stats = (await (await fetch(`${server.http}/v2/models/resnet50_preprocess/stats`)).json()) as {
      model_stats: { inference_stats: { success: { count: number }; fail: { count: number } } }[];
    };
    const pre = stats.model_stats[0]!.inference_stats;
    const ens = (await (await fetch(`${server.http}/v2/models/resnet50_ensemble/stats`)).json()) as {
      model_stats: { inference_stats: { fail: { count: number; ns: number } } }[];
    };
    const fail = ens.model_stats[0]!.inference_stats.fail;
    const ms = (xs: number[]) =>
      xs.length === 0
        ? "-"
        : `p50 ${percentile(xs, 50).toFixed(1)} ms, p99 ${percentile(xs, 99).toFixed(1)} ms, max ${Math.max(...xs).toFixed(1)} ms`;
    console.log(
      [
        `overload: ${REQUESTS} ${PROTOCOL} requests, ${CONCURRENCY} at once, resnet50_inference max_queue_size ${QUEUE}, server args [${SERVER_ARGS.join(" ")}], ${seconds.toFixed(1)} s`,
        `  answered ${answered.length}: ${ms(answered)}`,
        `  refused ${refused.length} (UNAVAILABLE, Exceeds maximum queue size): ${ms(refused)}`,
        `  the ensemble's own time on a refused request (its statistics): mean ${(Number(fail.ns) / Math.max(1, Number(fail.count)) / 1000).toFixed(1)} µs over ${fail.count}`,
        `  other errors: ${other.size === 0 ? "none" : JSON.stringify(Object.fromEntries(other))}`,
        `  resnet50_preprocess decoded ${Number(pre.success.count) - 1 + Number(pre.fail.count)} requests (answered ${answered.length})`,
        `  server RSS: start ${rssStart.toFixed(0)} MB, peak ${rssPeak.toFixed(0)} MB`,
      ].join("\n"),
    );
    await server.stop();
    if (tracing.length > 0) console.log(`  ${serverTimes(traceFile)}`);
  } finally {
    await server.stop();
    await removeDir(repo);
  }
}

/** From a Triton trace file: the server's time on each refused ensemble request (no step ran), read to answer. */
function serverTimes(path: string): string {
  const entries = JSON.parse(readFileSync(path, "utf8")) as {
    id: number;
    model_name?: string;
    parent_id?: number;
    timestamps?: { name: string; ns: number }[];
  }[];
  const models = new Map<number, string>();
  const parents = new Set<number>();
  const stamps = new Map<number, Map<string, number>>();
  for (const e of entries) {
    if (e.model_name !== undefined) models.set(e.id, e.model_name);
    if (e.parent_id !== undefined) parents.add(e.parent_id);
    if (e.timestamps) stamps.set(e.id, new Map(e.timestamps.map((t) => [t.name, t.ns])));
  }
  const times: number[] = [];
  for (const [id, model] of models) {
    if (model !== "resnet50_ensemble" || parents.has(id)) continue;
    const t = stamps.get(id);
    const read = t?.get("HTTP_RECV_END") ?? t?.get("GRPC_WAITREAD_END");
    const send = t?.get("HTTP_SEND_START") ?? t?.get("GRPC_SEND_START");
    if (read !== undefined && send !== undefined) times.push((send - read) / 1e6);
  }
  if (times.length === 0) return "server's time on refused requests: none traced";
  return `server's own time on ${times.length} refused requests (read in full -> answer sent out): p50 ${percentile(times, 50).toFixed(2)} ms, p99 ${percentile(times, 99).toFixed(2)} ms, max ${Math.max(...times).toFixed(2)} ms`;
}

await main();
