/**
 * Soak: the server process on the seed repository (the shared MobileNetV2 as the
 * inference model), SOAK_REQUESTS ensemble requests (default 10000) from SOAK_CONCURRENCY
 * clients (default 4), alternating gRPC and HTTP binary, batches of 1 and 3, every 7th
 * with a truncated JPEG that must fail. Prints the server's resident memory and JS heap
 * (from its own /metrics) every tenth of the way: both should level off, not climb.
 * Run: pnpm --filter @trellis/server soak (after pnpm build). SOAK_SERVER_ARGS adds server flags.
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { frameBytes } from "@trellis/stage";
import { makeSeedRepository, readFixtureImage, removeDir, startServerProcess, TRUNCATED_PHOTO } from "@trellis/testing";

const TOTAL = Number(process.env.SOAK_REQUESTS ?? 10_000);
const CONCURRENCY = Number(process.env.SOAK_CONCURRENCY ?? 4);

const repo = await makeSeedRepository();
// SOAK_SERVER_ARGS: more server flags, space-separated (e.g. tracing every request).
const extraArgs = process.env.SOAK_SERVER_ARGS?.split(" ").filter(Boolean) ?? [];
const server = await startServerProcess(["--model-repository", repo, ...extraArgs]);
const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.grpc }));
const good = readFixtureImage("chelsea.jpg");
const bad = readFixtureImage(TRUNCATED_PHOTO);

async function memory(): Promise<{ rss: number; heap: number }> {
  const text = await (await fetch(`${server.metrics}/metrics`)).text();
  const read = (name: string) => Number(new RegExp(`^${name} (\\d+)`, "m").exec(text)?.[1] ?? Number.NaN) / 1e6;
  return { rss: read("process_resident_memory_bytes"), heap: read("nodejs_heap_size_used_bytes") };
}

const counts = { ok: 0, failed: 0, wrong: 0 };

/** Request `i`: must succeed unless it carries the truncated JPEG, which must fail with 400 / INVALID_ARGUMENT. */
async function request(i: number): Promise<void> {
  const failing = i % 7 === 0;
  const images = failing ? [good, bad] : i % 3 === 0 ? [good, good, good] : [good];
  const raw = frameBytes(images);
  let ok: boolean;
  if (i % 2) {
    ok = await client
      .modelInfer(
        create(ModelInferRequestSchema, {
          modelName: "resnet50_ensemble",
          inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [BigInt(images.length), 1n] }],
          rawInputContents: [raw],
        }),
      )
      .then(
        () => true,
        () => false,
      );
  } else {
    const header = JSON.stringify({
      inputs: [
        {
          name: "RAW_IMAGE",
          datatype: "BYTES",
          shape: [images.length, 1],
          parameters: { binary_data_size: raw.byteLength },
        },
      ],
    });
    const res = await fetch(`${server.http}/v2/models/resnet50_ensemble/infer`, {
      method: "POST",
      headers: { "inference-header-content-length": String(Buffer.byteLength(header)) },
      body: Buffer.concat([Buffer.from(header), raw]),
    });
    await res.arrayBuffer();
    ok = res.status === 200;
  }
  if (ok === failing) counts.wrong++;
  else if (ok) counts.ok++;
  else counts.failed++;
}

console.log(`soak: ${TOTAL} requests, ${CONCURRENCY} clients; server pid ${server.proc.pid}`);
console.log("requests  rss MB  JS heap MB");
const checkpoints: { at: number; rss: number; heap: number }[] = [];
const step = Math.max(1, Math.floor(TOTAL / 10));
let next = 0;
const started = Date.now();
await Promise.all(
  Array.from({ length: CONCURRENCY }, async () => {
    while (next < TOTAL) {
      const i = next++;
      await request(i);
      if (i % step === 0) {
        const m = await memory();
        checkpoints.push({ at: i, ...m });
        console.log(`${String(i).padStart(8)}  ${m.rss.toFixed(0).padStart(6)}  ${m.heap.toFixed(1).padStart(10)}`);
      }
    }
  }),
);
const end = await memory();
const seconds = (Date.now() - started) / 1000;
const warm = checkpoints.find((c) => c.at >= step) ?? checkpoints[0];
console.log(
  `${TOTAL} requests in ${seconds.toFixed(0)} s: ${counts.ok} answered, ${counts.failed} refused as they should be, ` +
    `${counts.wrong} wrong; rss ${end.rss.toFixed(0)} MB (${(end.rss - (warm?.rss ?? end.rss)).toFixed(0)} MB since the first tenth), ` +
    `JS heap ${end.heap.toFixed(1)} MB`,
);
await server.stop();
await removeDir(repo);
if (counts.wrong > 0) process.exitCode = 1;
