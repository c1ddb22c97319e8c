/**
 * The analyzer's quick mode end to end on a tiny repository (one TypeScript stage that takes
 * 20 ms per execution), on real servers: the choice must follow the table it measured, the copy
 * must carry exactly the chosen settings, and the user's repository must stay byte for byte.
 * Nothing asserts a speed: only what the analyzer controls.
 */
import { createHash } from "node:crypto";
import { copyFile, cp, lstat, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { fixtureImagesDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type AnalyzeResult,
  analyze,
  beyondList,
  readSettings,
  scoreOf,
  thisMachine,
  verdictLine,
} from "../src/index.js";

const FIXTURE = new URL("./fixtures/tiny-repo/", import.meta.url).pathname;
const BUDGET_MS = 200;

/** Every file under `dir` with its sha256, by relative path. */
async function digest(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue;
    const path = join(entry.parentPath, entry.name);
    out[path.slice(dir.length)] = createHash("sha256")
      .update(await readFile(path))
      .digest("hex");
  }
  return out;
}

describe("trellis analyze --quick on a stage of known cost", () => {
  let scratch: string;
  let repository: string;
  let output: string;
  let before: Record<string, string>;
  let result: AnalyzeResult;

  beforeAll(async () => {
    scratch = await mkdtemp(join(tmpdir(), "trellis-analyzer-test-"));
    repository = join(scratch, "repo");
    output = join(scratch, "tuned");
    await cp(FIXTURE, repository, { recursive: true });
    // A 20 ms stage: raise the fixture's 12 ms so the machine's own overhead matters less.
    const model = join(repository, "work", "1", "model.mjs");
    await writeFile(model, (await readFile(model, "utf8")).replace("COST_MS = 12", "COST_MS = 20"));
    const images = join(scratch, "images");
    await mkdir(images);
    for (const f of ["chelsea.jpg", "coffee.jpg"]) await copyFile(join(fixtureImagesDir, f), join(images, f));
    before = await digest(repository);
    result = await analyze({
      repository,
      ensemble: "tiny_ensemble",
      inputData: images,
      budgetMs: BUDGET_MS,
      output,
      quick: true,
      cores: 2,
      concurrencies: [1, 2, 4, 8],
      windowMs: 500,
      warmupMs: 150,
      rounds: 3,
    });
  }, 110_000);

  afterAll(async () => {
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  it("declares a winner only when it beats the shipped config by more than the spread between rounds", () => {
    const baseline = result.finalists.find((f) => f.trial.id === "baseline")!;
    const within = result.finalists.filter((f) => f.p99Ms.median <= BUDGET_MS);
    for (const f of result.finalists) expect(f.rounds).toHaveLength(3);
    // Each round scored the highest throughput within the budget of its short sweep, when any was.
    for (const f of result.finalists) for (const r of f.rounds) expect(r.throughput).toBeGreaterThan(0);
    if (within.length === 0) {
      expect(result.verdict.kind).toBe("nothing met the budget");
      expect(result.winner).toBe(baseline);
      return;
    }
    const best = within.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a));
    const noise = Math.max(
      best.throughput.max - best.throughput.min,
      baseline.throughput.max - baseline.throughput.min,
    );
    const wins =
      best !== baseline && (!within.includes(baseline) || best.throughput.median - baseline.throughput.median > noise);
    expect(result.verdict.kind).toBe(wins ? "winner" : "no significant difference");
    expect(result.winner).toBe(wins ? best : baseline);
    expect(verdictLine(result)).toMatch(wins ? /^Winner c\d+: .*×/ : /^No significant difference/);
  });

  it("goes past the list's top in the finals while within the budget: its last gap again, up to twice the top", () => {
    expect([4, 6, 8].map((c) => beyondList(c, [1, 2, 4]))).toEqual([6, 8, undefined]);
    expect(beyondList(2, [1, 2, 4])).toBeUndefined();
    expect(beyondList(16, [1, 2, 4, 8, 16])).toBe(24);
    expect(beyondList(1, [1])).toBe(2);
    // A finalist scored past the top only where its round's sweep was still within the budget.
    for (const f of result.finalists)
      for (const r of f.rounds) if (r.concurrency > 8) expect(r.p99Ms).toBeLessThanOrEqual(BUDGET_MS);
  });

  it("scores each candidate by its best measured point within the budget, and stops sweeps over it", () => {
    for (const t of result.trials) {
      expect(t.sweep.score).toBe(scoreOf(t.sweep.points, BUDGET_MS));
      const last = t.sweep.points.at(-1)!;
      if (t.sweep.end === "over budget") expect(last.p99Ms).toBeGreaterThan(BUDGET_MS);
      // No point after the first one over the budget was measured.
      const over = t.sweep.points.findIndex((p) => p.p99Ms > BUDGET_MS);
      if (over >= 0) expect(over).toBe(t.sweep.points.length - 1);
    }
  });

  it("writes a copy whose config.pbtxt carries exactly the chosen settings", async () => {
    const written = parseModelConfig(await readFile(join(output, "work", "config.pbtxt"), "utf8"));
    expect(readSettings(written)).toEqual(result.winner.trial.candidate.work);
    const original = await readFile(join(repository, "work", "config.pbtxt"), "utf8");
    if (result.rewritten.includes("work"))
      expect(await readFile(join(output, "work", "config.pbtxt"), "utf8")).not.toBe(original);
    else expect(await readFile(join(output, "work", "config.pbtxt"), "utf8")).toBe(original);
    expect(await readFile(join(output, "work", "1", "model.mjs"), "utf8")).toBe(
      await readFile(join(repository, "work", "1", "model.mjs"), "utf8"),
    );
  });

  it("leaves the user's repository byte for byte as it was", async () => {
    expect(await digest(repository)).toEqual(before);
  });

  it("writes a self-contained report: the verdict, the machine, the chart, the budget line, the tables", async () => {
    const html = await readFile(join(output, "analysis.html"), "utf8");
    expect(html).toContain(verdictLine(result).replace(/'/g, "&#39;"));
    expect(html).toContain(`${thisMachine().cores} cores`);
    expect(html).toContain("pnpm analyze --model-repository");
    expect(html).toContain("<svg");
    expect(html).toContain(`budget ${BUDGET_MS} ms`);
    expect(html).toContain("★");
    expect(html).not.toMatch(/<script|https?:\/\/(?!www\.w3\.org)/);
    for (const t of result.trials) expect(html).toContain(`<th>${t.id}`);
  });
});

/**
 * A repository as models on a shared volume make it: the ensemble's folder a symbolic link, the
 * stage's model.mjs a link to a file elsewhere. Its stage refuses more than one instance, so
 * every candidate with two fails to load: the analysis goes on and shows why. And a budget no
 * configuration can meet gets a verdict that says so.
 */
describe("trellis analyze on linked model files, a failing candidate, a budget nothing meets", () => {
  let scratch: string;
  let repository: string;
  let images: string;
  let before: Record<string, string>;

  beforeAll(async () => {
    scratch = await mkdtemp(join(tmpdir(), "trellis-analyzer-links-"));
    const volume = join(scratch, "volume");
    repository = join(scratch, "repo");
    await cp(FIXTURE, volume, { recursive: true });
    const model = join(volume, "work", "1", "model.mjs");
    await writeFile(
      model,
      (await readFile(model, "utf8")).replace(
        "export function createStage({ config }) {",
        `export function createStage({ config }) {
  if ((config.instanceGroup[0]?.count ?? 1) > 1) throw new Error("this stage refuses more than one instance");`,
      ),
    );
    await mkdir(join(repository, "work", "1"), { recursive: true });
    await copyFile(join(volume, "work", "config.pbtxt"), join(repository, "work", "config.pbtxt"));
    await symlink(model, join(repository, "work", "1", "model.mjs"));
    await symlink(join(volume, "tiny_ensemble"), join(repository, "tiny_ensemble"));
    images = join(scratch, "images");
    await mkdir(images);
    await copyFile(join(fixtureImagesDir, "chelsea.jpg"), join(images, "chelsea.jpg"));
    before = await digest(volume);
  });

  afterAll(async () => {
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  const quickRun = (budgetMs: number, output: string) =>
    analyze({
      repository,
      ensemble: "tiny_ensemble",
      inputData: images,
      budgetMs,
      output: join(scratch, output),
      quick: true,
      cores: 2,
      concurrencies: [1, 2],
      windowMs: 300,
      warmupMs: 100,
      rounds: 2,
      searchDeadlineMs: 20_000,
    });

  it("follows the links, and shows each failed candidate with its reason", async () => {
    const result = await quickRun(BUDGET_MS, "tuned");
    const failed = result.trials.filter((t) => t.failed);
    expect(failed.length).toBeGreaterThan(0);
    for (const t of failed) {
      expect(t.candidate.work?.count).toBeGreaterThan(1);
      expect(t.failed).toContain("this stage refuses more than one instance");
      expect(t.sweep).toEqual({ points: [], end: "failed", score: 0 });
    }
    // Candidates that loaded, through the linked folder and file, were measured.
    expect(result.trials.find((t) => t.id === "baseline")!.sweep.points.length).toBeGreaterThan(0);
    const html = await readFile(result.reportPath, "utf8");
    expect(html).toContain("failed to start:");
    expect(html).toContain("this stage refuses more than one instance");
    // The copy's rewritten config is a file of its own; the volume behind the links is untouched.
    if (result.rewritten.includes("work")) {
      expect((await lstat(join(scratch, "tuned", "work", "config.pbtxt"))).isFile()).toBe(true);
    }
    expect(await digest(join(scratch, "volume"))).toEqual(before);
  }, 110_000);

  it("says when nothing met the budget, and which budget the best one meets", async () => {
    const result = await quickRun(1, "impossible");
    expect(result.verdict.kind).toBe("nothing met the budget");
    const best = result.finalists.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a));
    expect(result.verdict).toEqual({
      kind: "nothing met the budget",
      best: best.trial.id,
      smallestBudgetMs: Math.ceil(best.p99Ms.median),
    });
    expect(result.winner.trial.id).toBe("baseline");
    expect(result.rewritten).toEqual([]);
    expect(verdictLine(result)).toMatch(
      new RegExp(
        `^Nothing met the p99 budget of 1 ms, the shipped config included .* meets a budget of ${Math.ceil(best.p99Ms.median)} ms`,
      ),
    );
    expect(await readFile(result.reportPath, "utf8")).toContain("Nothing met the p99 budget of 1 ms");
  }, 110_000);
});
