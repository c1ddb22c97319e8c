/**
 * Acceptance for the page on the HTTP port (/ui, apps/web): real headless
 * Chromium (Debian's `chromium`, driven by playwright-core) against the real
 * server process with the seed repository and the shared MobileNetV2. The
 * browser speaks Connect to GRPCInferenceService on the HTTP port; the step
 * timings it shows come from the server's per-model statistics.
 */
import { mkdir, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  fixtureImagesDir,
  makeSeedRepository,
  removeDir,
  type ServerProcess,
  STABLE_TOP1,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
/** Where the screenshot goes (not committed): $TRELLIS_ARTIFACTS or the temp folder. */
const ARTIFACTS = process.env.TRELLIS_ARTIFACTS ?? join(tmpdir(), "trellis-artifacts");

let repo: string;
let server: ServerProcess;
let browser: Browser;

beforeAll(async () => {
  repo = await makeSeedRepository();
  await mkdir(ARTIFACTS, { recursive: true });
  [server, browser] = await Promise.all([
    startServerProcess(["--model-repository", repo]),
    chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] }),
  ]);
});
afterAll(async () => {
  await browser?.close();
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

/** The live panel's request count for `model` (success + failure, from the server's statistics). */
async function requestCount(page: Page, model: string): Promise<number> {
  const text = await page.locator(`#models tr[data-model="${model}"] [data-field="requests"]`).textContent();
  return Number(text);
}

describe("the page on the HTTP port", () => {
  it("classifies chelsea.jpg with the step timings, shows truncated.jpg's error beside it, and the live count goes up", async () => {
    const page = await browser.newPage({ viewport: { width: 1000, height: 900 } });
    const foreign: string[] = [];
    page.on("request", (r) => {
      if (!r.url().startsWith(server.http) && !r.url().startsWith("blob:") && !r.url().startsWith("data:")) {
        foreign.push(r.url());
      }
    });
    const nav = await page.goto(`${server.http}/`);
    expect(nav?.status()).toBe(200);
    expect(new URL(page.url()).pathname).toBe("/ui/");
    // Evaluated in the page (this package's types have no DOM): the navigation's own timing.
    const timing = await page.evaluate<{ domContentLoaded: number; load: number; transfer: number }>(
      `(() => { const n = performance.getEntriesByType("navigation")[0];
        return { domContentLoaded: n.domContentLoadedEventEnd, load: n.loadEventEnd, transfer: n.transferSize }; })()`,
    );
    console.log(`page load from the server: ${JSON.stringify(timing)}`);
    expect(timing.load).toBeGreaterThan(0);

    // The model comes from the repository index; the live panel lists every model with its state.
    await expect.poll(() => page.locator("#model").inputValue()).toBe("resnet50_ensemble");
    const row = page.locator('#models tr[data-model="resnet50_ensemble"]');
    await expect.poll(() => row.locator('[data-field="state"]').textContent()).toBe("READY");
    await expect.poll(() => page.locator("#models tbody tr").count()).toBe(4);
    // Only the ensemble takes an encoded image and gives a top-5 (preprocess answers an image tensor).
    expect(await page.locator("#model option").allTextContents()).toEqual(["resnet50_ensemble"]);
    const before = await requestCount(page, "resnet50_ensemble");

    await page
      .locator("#files")
      .setInputFiles([join(fixtureImagesDir, "chelsea.jpg"), join(fixtureImagesDir, TRUNCATED_PHOTO)]);
    const chelsea = page.locator('#results [data-file="chelsea.jpg"]');
    const truncated = page.locator(`#results [data-file="${TRUNCATED_PHOTO}"]`);
    await expect.poll(() => chelsea.getAttribute("data-state"), { timeout: 30_000 }).toBe("done");
    await expect.poll(() => truncated.getAttribute("data-state"), { timeout: 30_000 }).toBe("error");

    // Chelsea: the top label with its probability, five rows, and the three steps' times.
    const top = chelsea.locator("ol.top5 li").first();
    expect(await top.locator(".label").textContent()).toBe(STABLE_TOP1["chelsea.jpg"]?.label);
    expect(await top.locator(".prob").textContent()).toMatch(/^\d{1,3}\.\d%$/);
    expect(await chelsea.locator("ol.top5 li").count()).toBe(5);
    const steps = chelsea.locator("table.steps tbody tr");
    expect(await steps.locator("th").allTextContents()).toEqual([
      "resnet50_preprocess",
      "resnet50_inference",
      "resnet50_postprocess",
    ]);
    for (const ms of await steps.locator('[data-field="total"]').allTextContents()) expect(ms).toMatch(/^\d+\.\d ms$/);
    // The server's error, in its words, next to the bad file; no top-5 there.
    expect(await truncated.locator('[role="alert"]').textContent()).toMatch(
      /resnet50_ensemble: step 0 resnet50_preprocess: INVALID_ARGUMENT: input RAW_IMAGE element 0: truncated or corrupt jpeg/,
    );
    expect(await truncated.locator("ol.top5").count()).toBe(0);

    // The live panel, refreshed from the server's statistics: both requests counted.
    await expect.poll(() => requestCount(page, "resnet50_ensemble"), { timeout: 10_000 }).toBe(before + 2);

    const shot = join(ARTIFACTS, "ui.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`screenshot: ${shot}`);
    expect(foreign).toEqual([]);
    await page.close();
  });

  it("fits a narrow screen and is usable by keyboard", async () => {
    const page = await browser.newPage({ viewport: { width: 360, height: 740 } });
    await page.goto(`${server.http}/ui/`);
    const load = await page.evaluate<number>('performance.getEntriesByType("navigation")[0].loadEventEnd');
    console.log(`page load from the server (/ui/, second browser page): ${load.toFixed(1)} ms`);
    const width = await page.evaluate<number>("document.documentElement.scrollWidth");
    expect(width).toBeLessThanOrEqual(360);
    // The pick button and the model choice are labelled controls reachable with Tab.
    expect(await page.getByLabel("Model").count()).toBe(1);
    const focused: string[] = [];
    for (let i = 0; i < 3; i++) {
      await page.keyboard.press("Tab");
      focused.push(await page.evaluate<string>('document.activeElement?.id ?? ""'));
    }
    expect(focused).toContain("model");
    expect(focused).toContain("pick");
    expect(await page.locator("#results").getAttribute("aria-live")).toBe("polite");
    await page.screenshot({ path: join(ARTIFACTS, "ui-narrow.png"), fullPage: true });
    await page.close();
  });

  it("serves only its built files: other paths are not found, nothing reaches the file system", async () => {
    const index = await fetch(`${server.http}/ui/`);
    expect(index.status).toBe(200);
    expect(index.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(index.headers.get("content-security-policy")).toMatch(/default-src 'self'/);
    const html = await index.text();
    const asset = /src="\/ui\/(assets\/[^"]+\.js)"/.exec(html)?.[1];
    expect(asset).toBeDefined();
    const js = await fetch(`${server.http}/ui/${asset}`);
    expect(js.status).toBe(200);
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    for (const path of [
      "/ui/../package.json",
      "/ui/%2e%2e/package.json",
      "/ui/assets/..%2f..%2fpackage.json",
      "/ui//etc/passwd",
      "/ui/assets/",
      "/ui/nothing.js",
    ]) {
      const res = await fetch(`${server.http}${path}`);
      expect([path, res.status]).toEqual([path, 404]);
    }
  });
});

describe("the page switched off", () => {
  let empty: string;
  beforeAll(async () => {
    empty = await mkdtemp(join(tmpdir(), "trellis-ui-empty-"));
  });
  afterAll(async () => {
    await removeDir(empty);
  });

  it("--ui false: /ui and / are not found, the API still answers", async () => {
    const off = await startServerProcess(["--model-repository", empty, "--ui", "false"]);
    try {
      expect((await fetch(`${off.http}/ui/`)).status).toBe(404);
      expect((await fetch(`${off.http}/`, { redirect: "manual" })).status).toBe(404);
      expect((await fetch(`${off.http}/v2/health/live`)).status).toBe(200);
    } finally {
      expect(await off.stop()).toBe(0);
    }
  });

  it("a restricted HTTP API turns the page off", async () => {
    const off = await startServerProcess([
      "--model-repository",
      empty,
      "--http-restricted-api",
      "model-repository:admin-key=secret",
    ]);
    try {
      expect((await fetch(`${off.http}/ui/`)).status).toBe(404);
      expect(off.logs.some((l) => /page \(\/ui\) is off/.test(String(l.msg)))).toBe(true);
    } finally {
      expect(await off.stop()).toBe(0);
    }
  });
});
