/**
 * Hardening soak: the server process on the seed repository (the shared MobileNetV2 as the
 * inference model) under SOAK_MINUTES (default 5) of mixed traffic from SOAK_CONCURRENCY
 * clients (default 4), over gRPC and HTTP, two good requests for every bad one (the kinds are
 * in soak-traffic.ts). Every good answer's top-1 is checked against the reference; a bad
 * request answered with another code than its own is a finding: printed, not a failure.
 * The server's resident memory and event-loop lag are read from its own /metrics every few
 * seconds. Exit 0 only with no error on a good request, no wrong answer and resident memory
 * growing less than 10% over the last two thirds of the run.
 * Run: pnpm --filter @trellis/server soak (after pnpm build). SOAK_SERVER_ARGS adds server flags.
 */
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { LABELS_PATH, makeSeedRepository, removeDir, startServerProcess } from "@trellis/testing";
import { CALL_TIMEOUT_MS, type Kind, PHOTOS, type Result, references, soakKinds } from "./soak-traffic.js";

function positive(name: string, fallback: number): number {
  const value = Number(process.env[name] ?? fallback);
  if (!(value > 0)) throw new Error(`${name} must be a positive number, got ${process.env[name]}`);
  return value;
}

const MINUTES = positive("SOAK_MINUTES", 5);
const CONCURRENCY = Math.ceil(positive("SOAK_CONCURRENCY", 4));
const SAMPLE_MS = 3000;
const MAX_GROWTH = 0.1;
/** How many messages of each sort the report quotes. */
const QUOTE = 5;
// What a client must never see in a message: a path, an install location, an address.
const LEAK =
  /(^|[\s'"(])\/(tmp|work|root|home|usr|opt|etc)\/|node_modules|dist\/[\w./-]+\.js|\b127\.0\.0\.1\b|https?:\/\//;

const labels = readFileSync(LABELS_PATH, "utf8").split("\n");
for (const photo of PHOTOS) {
  const ref = references[photo];
  if (!ref || labels[ref.top5_index[0] as number] !== ref.top5_labels[0]) {
    throw new Error(`the reference top-1 of ${photo} disagrees with ${LABELS_PATH}`);
  }
}

/** Why a set of answers is wrong, or undefined when each image's top-1 label and index are the reference's. */
function wrongness(photos: string[], answers: string[] | undefined): string | undefined {
  if (answers?.length !== photos.length) return `${answers?.length ?? 0} answers for ${photos.length} images`;
  for (const [k, photo] of photos.entries()) {
    const ref = references[photo] as (typeof references)[string];
    let label: unknown;
    try {
      label = JSON.parse(answers[k] as string).top5_labels?.[0];
    } catch {
      return `${photo}: unreadable answer ${answers[k]?.slice(0, 100)}`;
    }
    const index = labels.indexOf(String(label));
    if (label !== ref.top5_labels[0] || index !== ref.top5_index[0]) {
      return `${photo}: top-1 ${index} "${label}", the reference's ${ref.top5_index[0]} "${ref.top5_labels[0]}"`;
    }
  }
  return undefined;
}

interface KindStats {
  sent: number;
  asExpected: number;
  other: number;
  codes: Map<string, number>;
}
/** Same kind, variant and code: counted once, its first message quoted. */
interface Finding {
  what: string;
  count: number;
  message: string;
}
interface Sample {
  t: number;
  rss: number;
  heap: number;
  lagP99: number;
  lagMax: number;
}

const repo = await makeSeedRepository();
// SOAK_SERVER_ARGS: more server flags, space-separated.
const extraArgs = process.env.SOAK_SERVER_ARGS?.split(" ").filter(Boolean) ?? [];
const server = await startServerProcess(["--model-repository", repo, ...extraArgs]);
const kinds = soakKinds(server);
const good = kinds.filter((k) => k.good);
const bad = kinds.filter((k) => !k.good);
const stats = new Map<Kind, KindStats>(kinds.map((k) => [k, { sent: 0, asExpected: 0, other: 0, codes: new Map() }]));
const totals = { goodOk: 0, goodErrors: 0, badExpected: 0, badOther: 0, wrong: 0 };
const goodErrors: string[] = [];
const wrongs: string[] = [];
const findings = new Map<string, Finding>();
const leaks = new Map<string, Finding>();
let scrapeFailures = 0;

function note(into: Map<string, Finding>, what: string, message: string): void {
  const f = into.get(what);
  if (f) f.count++;
  else into.set(what, { what, count: 1, message: message.replace(/\s+/g, " ").slice(0, 240) });
}

function record(kind: Kind, { outcome, variant, photos }: Result): void {
  const s = stats.get(kind) as KindStats;
  s.codes.set(outcome.code, (s.codes.get(outcome.code) ?? 0) + 1);
  const expected = kind.expect.includes(outcome.code);
  if (expected) s.asExpected++;
  else s.other++;
  if (kind.good) {
    if (expected) totals.goodOk++;
    else {
      totals.goodErrors++;
      if (goodErrors.length < QUOTE) goodErrors.push(`${kind.name} [${variant}]: ${outcome.code} ${outcome.message}`);
    }
  } else if (expected) totals.badExpected++;
  else {
    totals.badOther++;
    note(findings, `${kind.name} [${variant}] answered ${outcome.code}`, outcome.message);
  }
  if (photos && outcome.answers) {
    const why = wrongness(photos, outcome.answers);
    if (why) {
      totals.wrong++;
      if (wrongs.length < QUOTE) wrongs.push(`${kind.name}: ${why}`);
    }
  }
  if (LEAK.test(outcome.message)) note(leaks, `${kind.name} [${variant}] ${outcome.code}`, outcome.message);
}

const metricOf = (text: string, name: string) =>
  Number(new RegExp(`^${name} ([0-9.e+-]+)`, "m").exec(text)?.[1] ?? Number.NaN);

async function sample(t: number): Promise<Sample | undefined> {
  try {
    const res = await fetch(`${server.metrics}/metrics`, { signal: AbortSignal.timeout(10_000) });
    const text = await res.text();
    return {
      t,
      rss: metricOf(text, "process_resident_memory_bytes"),
      heap: metricOf(text, "nodejs_heap_size_used_bytes"),
      // prom-client resets its event-loop histogram at each scrape: these cover the last interval.
      lagP99: metricOf(text, "nodejs_eventloop_lag_p99_seconds"),
      lagMax: metricOf(text, "nodejs_eventloop_lag_max_seconds"),
    };
  } catch {
    scrapeFailures++;
    return undefined;
  }
}

const mb = (bytes: number) => `${(bytes / 1e6).toFixed(0)} MB`;
const ms = (seconds: number) => `${(seconds * 1000).toFixed(0)} ms`;
const pct = (x: number) => `${x >= 0 ? "+" : ""}${(x * 100).toFixed(1)}%`;
const requests = () => totals.goodOk + totals.goodErrors + totals.badExpected + totals.badOther;

const durationMs = MINUTES * 60_000;
console.log(
  `soak: ${MINUTES} min, ${CONCURRENCY} clients, ${good.length} good and ${bad.length} bad kinds of request; ` +
    `server pid ${server.proc.pid}`,
);
const samples: Sample[] = [];
const first = await sample(0);
if (first) samples.push(first);

const started = performance.now();
const elapsed = () => performance.now() - started;
let next = 0;
// Two good requests for every bad one, each list walked in turn so every kind comes up evenly.
const kindOf = (i: number) => {
  const round = Math.floor(i / 3);
  return i % 3 === 2 ? (bad[round % bad.length] as Kind) : (good[(2 * round + (i % 3)) % good.length] as Kind);
};
async function client(): Promise<void> {
  while (elapsed() < durationMs) {
    const kind = kindOf(next++);
    const nth = (stats.get(kind) as KindStats).sent++;
    const result = await kind
      .run(nth)
      .catch((err: unknown): Result => ({ variant: "?", outcome: { code: "CLIENT EXCEPTION", message: String(err) } }));
    record(kind, result);
  }
}

let trafficDone = false;
const sampler = (async () => {
  let tenth = 0;
  // Bounded by the run: the last call ends at most CALL_TIMEOUT_MS after it.
  while (!trafficDone && elapsed() < durationMs + CALL_TIMEOUT_MS + 10_000) {
    await sleep(SAMPLE_MS);
    const s = await sample(elapsed());
    if (s) samples.push(s);
    const reached = Math.min(10, Math.floor(elapsed() / (durationMs / 10)));
    if (reached <= tenth) continue;
    tenth = reached;
    console.log(
      `[${String(tenth * 10).padStart(3)}%] ${(elapsed() / 1000).toFixed(0).padStart(4)} s  ${requests()} requests: ` +
        `good ${totals.goodOk} ok / ${totals.goodErrors} errors, bad ${totals.badExpected} as expected / ` +
        `${totals.badOther} not, ${totals.wrong} wrong` +
        (s
          ? `; rss ${mb(s.rss)}, JS heap ${mb(s.heap)}, lag p99 ${ms(s.lagP99)} max ${ms(s.lagMax)}`
          : "; /metrics unanswered"),
    );
  }
})();
await Promise.all(Array.from({ length: CONCURRENCY }, client));
const trafficSeconds = elapsed() / 1000;
trafficDone = true;
await sampler;
const last = await sample(elapsed());
if (last) samples.push(last);

const ready = await fetch(`${server.http}/v2/health/ready`, { signal: AbortSignal.timeout(10_000) }).then(
  (r) => r.status === 200,
  () => false,
);
const alive = server.proc.exitCode === null && server.proc.signalCode === null;
const exitCode = await server.stop();
await removeDir(repo);

console.log(
  `\n${requests()} requests in ${trafficSeconds.toFixed(0)} s (${(requests() / trafficSeconds).toFixed(1)}/s)`,
);
console.log(`${"kind".padEnd(40)} ${"sent".padStart(6)} ${"expected".padStart(8)} ${"other".padStart(6)}  codes`);
for (const [kind, s] of stats) {
  const codes = [...s.codes].map(([code, n]) => `${code} x${n}`).join(", ");
  console.log(
    `${kind.name.padEnd(40)} ${String(s.sent).padStart(6)} ${String(s.asExpected).padStart(8)} ${String(s.other).padStart(6)}  ${codes}`,
  );
}
console.log(`\ngood requests: ${totals.goodOk} answered, ${totals.goodErrors} errors`);
for (const e of goodErrors) console.log(`  ${e}`);
console.log(`wrong answers: ${totals.wrong}`);
for (const w of wrongs) console.log(`  ${w}`);
console.log(`bad requests: ${totals.badExpected} answered with the expected code, ${totals.badOther} with another`);
for (const f of findings.values()) console.log(`  FINDING ${f.what} (x${f.count}): ${f.message}`);
for (const f of leaks.values())
  console.log(`  FINDING message names an internal path or address: ${f.what} (x${f.count}): ${f.message}`);

let growth = Number.NaN;
const third = samples.find((s) => s.t >= durationMs / 3);
const end = samples.at(-1);
if (first && third && end) {
  growth = (end.rss - third.rss) / third.rss;
  const peak = samples.reduce((a, b) => (b.rss > a.rss ? b : a));
  const lagP99 = Math.max(...samples.map((s) => s.lagP99));
  const lagMax = Math.max(...samples.map((s) => s.lagMax));
  console.log(
    `rss: start ${mb(first.rss)}, at 1/3 ${mb(third.rss)}, peak ${mb(peak.rss)} (at ${(peak.t / 1000).toFixed(0)} s), ` +
      `end ${mb(end.rss)}; growth over the last two thirds ${pct(growth)}`,
  );
  // The whole series, so a step (one allocation spike) can be told from a climb (a leak).
  console.log(`rss every ${SAMPLE_MS / 1000} s (MB): ${samples.map((s) => (s.rss / 1e6).toFixed(0)).join(" ")}`);
  console.log(
    `JS heap: start ${mb(first.heap)}, end ${mb(end.heap)}; event-loop lag: worst interval p99 ${ms(lagP99)}, max ${ms(lagMax)}`,
  );
}
console.log(
  `${samples.length} memory samples, ${scrapeFailures} /metrics scrapes unanswered; server ${alive ? "alive" : "DEAD"} ` +
    `and ${ready ? "ready" : "NOT ready"} at the end, exit code ${exitCode} on SIGTERM`,
);

const failures = [
  totals.goodErrors > 0 && `${totals.goodErrors} good requests failed`,
  totals.wrong > 0 && `${totals.wrong} wrong answers`,
  !(growth < MAX_GROWTH) && (Number.isNaN(growth) ? "no memory samples to judge growth by" : `rss grew ${pct(growth)}`),
  !(alive && ready) && "the server did not survive ready",
].filter(Boolean);
console.log(failures.length ? `FAIL: ${failures.join("; ")}` : "PASS");
if (failures.length) process.exitCode = 1;
