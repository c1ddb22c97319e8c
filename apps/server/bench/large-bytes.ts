/**
 * Issue 48's large-BYTES load on the server process: an ONNX identity model of one string
 * input, sent one 10,485,760-element BYTES request (one-letter elements, ~50 MiB, as Triton's
 * own gRPC test sends) over gRPC, then LARGE_BYTES_CONCURRENCY (default "2,4") at once. Prints
 * each request's time and outcome, and the server's peak RSS (VmHWM) after each step.
 * Run: node apps/server/dist/bench/large-bytes.js (after pnpm build). LARGE_BYTES_MAIN runs
 * another build's dist/main.js (the commit before, say) for a before/after.
 */
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService } from "@trellis/protocol";
import { identityModel, removeDir, startServerProcess } from "@trellis/testing";

const ELEMENTS = 10_485_760;
const CONCURRENCY = (process.env.LARGE_BYTES_CONCURRENCY ?? "2,4").split(",").map(Number);

const repo = await mkdtemp(join(tmpdir(), "trellis-large-bytes-"));
await mkdir(join(repo, "ident", "1"), { recursive: true });
await writeFile(join(repo, "ident", "1", "model.onnx"), identityModel([{ name: "IN", type: "string", shape: ["N"] }]));
await writeFile(
  join(repo, "ident", "config.pbtxt"),
  `name: "ident"\nbackend: "onnxruntime"\nmax_batch_size: 0\ninput [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]\noutput [ { name: "IN_out" data_type: TYPE_STRING dims: [ -1 ] } ]\n`,
);
const main = process.env.LARGE_BYTES_MAIN;
const server = await startServerProcess(["--model-repository", repo], main ? { main } : {});
const peakMiB = () => {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${server.proc.pid}/status`, "utf8"));
  return m ? Math.round(Number(m[1]) / 1024) : Number.NaN;
};
const client = createClient(
  GRPCInferenceService,
  createGrpcTransport({ baseUrl: server.grpc, readMaxBytes: 2 ** 30, writeMaxBytes: 2 ** 30 }),
);
const raw = Buffer.alloc(ELEMENTS * 5);
for (let i = 0; i < ELEMENTS; i++) {
  raw.writeUInt32LE(1, i * 5);
  raw[i * 5 + 4] = 97 + (i % 26);
}

async function one(): Promise<string> {
  const t0 = performance.now();
  try {
    const r = await client.modelInfer(
      {
        modelName: "ident",
        inputs: [{ name: "IN", datatype: "BYTES", shape: [BigInt(ELEMENTS)] }],
        rawInputContents: [raw],
      },
      { timeoutMs: 600_000 },
    );
    const right = Buffer.compare(r.rawOutputContents[0] ?? new Uint8Array(0), raw) === 0;
    return `${right ? "right" : "WRONG"} in ${Math.round(performance.now() - t0)} ms`;
  } catch (err) {
    return `${ConnectError.from(err).code} after ${Math.round(performance.now() - t0)} ms`;
  }
}

try {
  console.log(`one request: ${await one()}; server VmHWM ${peakMiB()} MiB`);
  for (const n of CONCURRENCY) {
    const outcomes = await Promise.all(Array.from({ length: n }, one));
    // /proc/<pid> goes with the process, before its exit event may have arrived here.
    const alive = existsSync(`/proc/${server.proc.pid}/status`) && server.proc.exitCode === null;
    console.log(`${n} at once: ${outcomes.join(", ")}; server ${alive ? `alive, VmHWM ${peakMiB()} MiB` : "DEAD"}`);
    if (!alive) break;
  }
} finally {
  await server.stop();
  await removeDir(repo);
}
