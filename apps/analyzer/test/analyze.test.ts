/**
 * The analyzer's quick mode end to end on a tiny repository (one TypeScript stage that takes
 * 20 ms per execution), on real servers: the choice must follow the table it measured, the copy
 * must carry exactly the chosen settings, and the user's repository must stay byte for byte.
 * Nothing asserts a speed: only what the analyzer controls.
 */
import { createHash } from "node:crypto";
import { copyFile, cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { fixtureImagesDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AnalyzeResult, analyze, readSettings, scoreOf } from "../src/index.js";

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

  it("chooses the finalist with the highest median throughput among those within the budget", () => {
    const within = result.finalists.filter((f) => f.p99Ms.median <= BUDGET_MS);
    const expected = within.length
      ? within.reduce((a, b) => (b.throughput.median > a.throughput.median ? b : a))
      : result.finalists.find((f) => f.trial.id === "baseline");
    expect(result.winner).toBe(expected);
    expect(result.finalists.map((f) => f.trial.id)).toContain("baseline");
    for (const f of result.finalists) expect(f.rounds).toHaveLength(3);
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

  it("writes a self-contained report: the chart, the budget line, the winner, the tables", async () => {
    const html = await readFile(join(output, "analysis.html"), "utf8");
    expect(html).toContain("<svg");
    expect(html).toContain(`budget ${BUDGET_MS} ms`);
    expect(html).toContain("★");
    expect(html).not.toMatch(/<script|https?:\/\/(?!www\.w3\.org)/);
    for (const t of result.trials) expect(html).toContain(`<th>${t.id}`);
  });
});
