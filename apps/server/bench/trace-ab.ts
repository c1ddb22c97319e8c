/**
 * What on-demand tracing costs (issue 40): one server process (the seed ensemble, the shared
 * MobileNetV2), driven over gRPC by TRACE_AB_CONCURRENCY (8) Connect callers of 1920x1080 JPEGs,
 * A without any trace ask, B with the `trellis-trace: 1` header on 1 request in 100 (each such
 * request traced and kept among the recent traces, the store full and evicting). Same server,
 * same run, interleaved rounds with the order alternating (A B, B A, …), TRACE_AB_SECONDS (8)
 * each after 2 s of warm-up; reported: req/s and p50 per round, and B/A throughput per round
 * with its median (target: within 2%).
 * Run (after pnpm build): pnpm bench (after the server bench), or pnpm --filter @trellis/server bench:trace
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { grpcTransport } from "@trellis/kserve";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { makeSeedRepository, removeDir, startServerProcess } from "@trellis/testing";
import { fullHdPhotos } from "./photos.js";
import { measureRounds, printRounds, type RoundSubject } from "./rounds.js";

const SECONDS = Number(process.env.TRACE_AB_SECONDS ?? 8);
const ROUNDS = Number(process.env.TRACE_AB_ROUNDS ?? 6);
const CONCURRENCY = Number(process.env.TRACE_AB_CONCURRENCY ?? 8);
/** B asks for a trace on every this-many-th request. */
const ONE_IN = 100;

const repo = await makeSeedRepository({ prefix: "trellis-trace-ab-" });
const server = await startServerProcess(["--model-repository", repo]);
const transport = grpcTransport(server.grpc);
const client = createClient(GRPCInferenceService, transport);
const photos = await fullHdPhotos();

function requestOf(photo: Uint8Array, id: string) {
  const framed = new Uint8Array(4 + photo.length);
  new DataView(framed.buffer).setUint32(0, photo.length, true);
  framed.set(photo, 4);
  return create(ModelInferRequestSchema, {
    id,
    modelName: "resnet50_ensemble",
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
    rawInputContents: [framed],
  });
}

let sent = 0;
let asked = 0;
const subjects: RoundSubject[] = [
  {
    label: "A (no trace asks)",
    infer: (photo) => client.modelInfer(requestOf(photo, `a-${sent++}`)),
    rates: [],
    p50s: [],
  },
  {
    label: `B (1 in ${ONE_IN} asks for its trace)`,
    infer: (photo) => {
      const n = sent++;
      const ask = n % ONE_IN === 0;
      if (ask) asked++;
      return client.modelInfer(requestOf(photo, `b-${n}`), ask ? { headers: { "trellis-trace": "1" } } : {});
    },
    rates: [],
    p50s: [],
  },
];

try {
  await measureRounds(subjects, photos, { rounds: ROUNDS, concurrency: CONCURRENCY, seconds: SECONDS });
  const kept = (await (await fetch(`${server.http}/v2/traces`)).json()) as {
    kept: { count: number; bytes: number; maxCount: number; maxBytes: number };
  };
  printRounds(
    `on-demand tracing: A none vs B 1 in ${ONE_IN}; concurrency ${CONCURRENCY}, ${ROUNDS} rounds of ${SECONDS} s; seed ensemble (MobileNetV2 int8), 1920x1080 JPEGs over gRPC`,
    subjects,
    { name: "B/A", values: subjects[1]!.rates.map((b, i) => b / subjects[0]!.rates[i]!) },
  );
  console.log(
    `B asked for ${asked} traces; the server keeps ${kept.kept.count} (${kept.kept.bytes} bytes; bounds ${kept.kept.maxCount} traces, ${kept.kept.maxBytes} bytes)`,
  );
} finally {
  transport.close();
  await server.stop();
  await removeDir(repo);
}
