/**
 * pnpm analyze:ab on the tiny repository served twice: the rounds are interleaved (the order
 * reversed each round), each sweep stops at the first point over the budget, and the summary
 * gives B/A per round. Asserts the order and the structure, which the script controls; not speed.
 */
import { execFile } from "node:child_process";
import { copyFile, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { fixtureImagesDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const FIXTURE = new URL("./fixtures/tiny-repo/", import.meta.url).pathname;
const AB = new URL("../dist/ab.js", import.meta.url).pathname;

describe("analyze:ab, two repositories at one budget", () => {
  let images: string;
  beforeAll(async () => {
    images = await mkdtemp(join(tmpdir(), "trellis-ab-test-"));
    await mkdir(images, { recursive: true });
    await copyFile(join(fixtureImagesDir, "chelsea.jpg"), join(images, "chelsea.jpg"));
  });
  afterAll(() => rm(images, { recursive: true, force: true }));

  it("measures A and B in interleaved rounds and reports B/A per round", async () => {
    const args = [AB, "--a", FIXTURE, "--b", FIXTURE, "-m", "tiny_ensemble", "--input-data", images];
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [...args, "--p99-ms", "1000", "--rounds", "3", "--concurrency-range", "1:2:1", "--measurement-interval", "300"],
      { timeout: 90_000 },
    );
    const rounds = stdout.split("\n").filter((l) => l.startsWith("round "));
    expect(rounds.map((l) => l.slice(0, 9))).toEqual([
      "round 1 A",
      "round 1 B",
      "round 2 B",
      "round 2 A",
      "round 3 A",
      "round 3 B",
    ]);
    // Within a generous budget both concurrencies are measured, each round.
    for (const line of rounds)
      expect(line).toMatch(/: c1 [\d.]+\/s p99 \d+, c2 [\d.]+\/s p99 \d+ -> [\d.]+\/s at c[12]$/);
    expect(stdout).toMatch(/B\/A per round: [\d.]+, [\d.]+, [\d.]+; median [\d.]+/);
  }, 120_000);

  it("stops a sweep at the first point over the budget", async () => {
    const args = [AB, "--a", FIXTURE, "--b", FIXTURE, "-m", "tiny_ensemble", "--input-data", images];
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [...args, "--p99-ms", "1", "--rounds", "1", "--concurrency-range", "1:4:1", "--measurement-interval", "300"],
      { timeout: 90_000 },
    );
    const rounds = stdout.split("\n").filter((l) => l.startsWith("round "));
    expect(rounds).toHaveLength(2);
    // The 12 ms stage cannot answer within 1 ms: c1 is over, and nothing after it is measured.
    for (const line of rounds) expect(line).toMatch(/: c1 [\d.]+\/s p99 \d+ -> /);
    expect(stdout).toContain("B/A per round:");
  }, 120_000);
});
