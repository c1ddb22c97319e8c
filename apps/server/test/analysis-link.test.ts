/**
 * The page's link to the last model analysis: the server serves `analysis.html` from the root of
 * the repository it serves at /ui/analysis.html, that one name only, with a policy that lets the
 * self-contained report show and run nothing; no other name or path reaches the file system.
 */
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { makeSeedRepository, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ANALYSIS_PATH, readUiAssets } from "../src/web-page.js";

/** The built page (apps/server build copies apps/web into dist/ui). */
const BUILT_UI = fileURLToPath(new URL("../dist/ui/", import.meta.url));
const REPORT = "<!doctype html><html><body><h1>Model analysis</h1><svg></svg></body></html>\n";
let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeSeedRepository({ prefix: "trellis-analysis-link-" });
  await writeFile(join(repo, "analysis.html"), REPORT);
  // A file beside it that no URL may reach.
  await writeFile(join(repo, "secret.html"), "not for clients");
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

describe("/ui/analysis.html", () => {
  it("serves the served repository's analysis.html, and the page links to it", async () => {
    const res = await fetch(`${server.http}${ANALYSIS_PATH}`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(REPORT);
    expect(res.headers.get("content-security-policy")).toMatch(/^default-src 'none'; style-src 'unsafe-inline'/);
    const page = await (await fetch(`${server.http}/ui/`)).text();
    expect(page).toContain('href="./analysis.html"');
  });

  it("serves no other name from the repository, however the path is spelled", async () => {
    for (const path of [
      "/ui/secret.html",
      "/ui/../secret.html",
      "/ui/%2e%2e/secret.html",
      "/ui/analysis.html%2f..%2fsecret.html",
      "/analysis.html",
    ]) {
      const res = await fetch(`${server.http}${path}`);
      expect([404, 400]).toContain(res.status);
      expect(await res.text()).not.toContain("not for clients");
    }
  });

  it("has no report when the served repository has none", async () => {
    const empty = await mkdtemp(join(tmpdir(), "trellis-no-analysis-"));
    try {
      expect(readUiAssets(BUILT_UI, [empty]).has(ANALYSIS_PATH)).toBe(false);
      expect(readUiAssets(BUILT_UI, [repo]).get(ANALYSIS_PATH)?.body.toString()).toBe(REPORT);
    } finally {
      await removeDir(empty);
    }
  });
});
