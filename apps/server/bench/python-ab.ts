/**
 * Issue 42's migration payoff: the seed ensemble with the seed's Python pre/postprocess
 * (../shared/fixtures/triton-python, instance_group count 2) against the TypeScript stages, both
 * servers up at once, the shared photos as base64 over HTTP JSON; throughput and p50 at
 * concurrency 1 and 8, in interleaved rounds (the median round reported).
 * Run: pnpm --filter @trellis/server bench:python [seconds per round, default 5] [rounds, default 3]
 * (PYTHON=<python3 with numpy and cv2>, default /usr/bin/python3)
 */
import {
  closedLoop,
  fixturePhotos,
  interleavedRounds,
  makeSeedRepository,
  median,
  percentile,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";

const seconds = Number(process.argv[2] ?? 5);
const rounds = Number(process.argv[3] ?? 3);

const pythonSeedRepository = () => makeSeedRepository({ prefix: "trellis-python-bench-", pythonInstances: 2 });

const bodies = fixturePhotos().map((p) =>
  JSON.stringify({
    inputs: [
      {
        name: "RAW_IMAGE",
        datatype: "BYTES",
        shape: [1, 1],
        data: [Buffer.from(readFixtureImage(p)).toString("base64")],
      },
    ],
  }),
);

async function classify(server: ServerProcess, i: number): Promise<void> {
  const res = await fetch(`${server.http}/v2/models/resnet50_ensemble/infer`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: bodies[i % bodies.length],
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  await res.arrayBuffer();
}

const [tsRepo, pyRepo] = await Promise.all([
  makeSeedRepository({ prefix: "trellis-ts-bench-" }),
  pythonSeedRepository(),
]);
const servers = await Promise.all([
  startServerProcess(["--model-repository", tsRepo]),
  startServerProcess(["--model-repository", pyRepo, "--python-executable", process.env.PYTHON ?? "/usr/bin/python3"]),
]);
const subjects = [
  { name: "TypeScript stages", server: servers[0] },
  { name: "Python pre/post (model.py)", server: servers[1] },
];
const results = new Map<string, { rps: number[]; p50: number[] }>();
try {
  for (const s of subjects) await closedLoop((i) => classify(s.server, i), 2, 2); // warm both
  await interleavedRounds(subjects, rounds, async (s) => {
    for (const concurrency of [1, 8]) {
      const r = await closedLoop((i) => classify(s.server, i), concurrency, seconds, { warmupSeconds: 1 });
      const key = `${s.name}|${concurrency}`;
      const row = results.get(key) ?? { rps: [], p50: [] };
      row.rps.push(r.calls / r.seconds);
      row.p50.push(percentile(r.latencies, 50));
      results.set(key, row);
    }
  });
} finally {
  await Promise.all(servers.map((s) => s.stop()));
  await Promise.all([removeDir(tsRepo), removeDir(pyRepo)]);
}
console.log(
  `seed ensemble (MobileNetV2 int8), ${bodies.length} photos as base64 JSON, ${rounds} interleaved rounds of ${seconds} s, median round`,
);
console.log("| pre/postprocess | concurrency | req/s | p50 ms |\n| --- | ---: | ---: | ---: |");
for (const [key, row] of results) {
  const [name, concurrency] = key.split("|");
  console.log(`| ${name} | ${concurrency} | ${median(row.rps).toFixed(1)} | ${median(row.p50).toFixed(1)} |`);
}
