/**
 * Acceptance for one request's waterfall in the page (apps/web waterfall.ts): real headless
 * Chromium (playwright-core) drops photos on the page of a real server, opens each card's
 * waterfall (the request traced on demand, kept by the server), checks a row per step with
 * queue and compute inside the total, the truncated JPEG's failing step, the export's
 * trace-event format; then the same through the front of the split deployment, where the
 * remote steps' own queue and compute appear under the front's calls.
 */
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { type Browser, chromium, type Locator, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { explicitModels } from "./helpers.js";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
/** Where the screenshots go (not committed): $TRELLIS_ARTIFACTS or the temp folder. */
const ARTIFACTS = process.env.TRELLIS_ARTIFACTS ?? join(tmpdir(), "trellis-artifacts");

let repo: string;
let browser: Browser;
const servers: ServerProcess[] = [];
let single: ServerProcess;
let front: ServerProcess;

beforeAll(async () => {
  repo = await makeSeedRepository();
  await mkdir(ARTIFACTS, { recursive: true });
  const explicit = (model: string) => [...explicitModels(repo), "--load-model", model];
  const started = await Promise.all([
    startServerProcess(["--model-repository", repo]),
    startServerProcess(explicit("resnet50_preprocess")),
    startServerProcess(explicit("resnet50_inference")),
  ]);
  servers.push(...started);
  const [one, pre, inf] = started as [ServerProcess, ServerProcess, ServerProcess];
  single = one;
  const endpoints = join(repo, "endpoints.json");
  await writeFile(endpoints, JSON.stringify({ resnet50_preprocess: pre.grpc, resnet50_inference: inf.grpc }));
  [front, browser] = await Promise.all([
    startServerProcess([...explicit("resnet50_ensemble"), "--endpoints", endpoints]),
    chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] }),
  ]);
  servers.push(front);
});
afterAll(async () => {
  await browser?.close();
  const codes: (number | null)[] = [];
  for (const s of [...servers].reverse()) codes.push(await s.stop());
  await removeDir(repo);
  expect(codes).toEqual(servers.map(() => 0));
});

/** Drops `files` on the page's drop zone, as a drag from the desktop does (a DataTransfer of Files). */
async function dropFiles(page: Page, files: string[]): Promise<void> {
  const payload = files.map((name) => ({ name, base64: Buffer.from(readFixtureImage(name)).toString("base64") }));
  const transfer = await page.evaluateHandle(
    `(() => { const dt = new DataTransfer();
      for (const f of ${JSON.stringify(payload)}) {
        const bytes = Uint8Array.from(atob(f.base64), (c) => c.charCodeAt(0));
        dt.items.add(new File([bytes], f.name, { type: "image/jpeg" }));
      }
      return dt; })()`,
  );
  await page.dispatchEvent("#drop", "drop", { dataTransfer: transfer });
}

interface Row {
  step: string;
  depth: number;
  failed: boolean;
  remote: boolean;
  requestUs: number;
  queueUs: number;
  computeUs: number;
}

/** Opens `card`'s waterfall and reads its rows. */
async function openWaterfall(card: Locator): Promise<Row[]> {
  await card.locator("button.open-waterfall").click();
  const rows = card.locator("table.waterfall tbody tr");
  await expect.poll(() => rows.count(), { timeout: 10_000 }).toBeGreaterThan(0);
  const out: Row[] = [];
  for (const row of await rows.all()) {
    const num = async (name: string) => Number((await row.getAttribute(name)) ?? Number.NaN);
    out.push({
      step: (await row.getAttribute("data-step")) ?? "",
      depth: await num("data-depth"),
      failed: (await row.getAttribute("data-failed")) === "true",
      remote: (await row.getAttribute("data-remote")) === "true",
      requestUs: await num("data-request-us"),
      queueUs: await num("data-queue-us"),
      computeUs: await num("data-compute-us"),
    });
  }
  return out;
}

/** The trace-event format's required fields, on every event. */
function checkTraceEventFormat(doc: { traceEvents?: Record<string, unknown>[] }): void {
  expect(Array.isArray(doc.traceEvents)).toBe(true);
  expect(doc.traceEvents!.length).toBeGreaterThan(0);
  for (const e of doc.traceEvents!) {
    expect(typeof e.ph).toBe("string");
    for (const field of ["ts", "dur", "pid", "tid"]) expect(Number.isFinite(e[field]), field).toBe(true);
  }
}

describe("one request's waterfall in the page", () => {
  it("shows a row per seed-ensemble step with queue and compute within the total, and the truncated JPEG's failing step", async () => {
    const page = await browser.newPage({ viewport: { width: 1100, height: 1000 }, acceptDownloads: true });
    await page.goto(`${single.http}/ui/`);
    await expect.poll(() => page.locator("#model").inputValue()).toBe("resnet50_ensemble");
    await dropFiles(page, ["chelsea.jpg", TRUNCATED_PHOTO]);
    const chelsea = page.locator('#results [data-file="chelsea.jpg"]');
    const truncated = page.locator(`#results [data-file="${TRUNCATED_PHOTO}"]`);
    await expect.poll(() => chelsea.getAttribute("data-state"), { timeout: 30_000 }).toBe("done");
    await expect.poll(() => truncated.getAttribute("data-state"), { timeout: 30_000 }).toBe("error");

    const rows = await openWaterfall(chelsea);
    expect(rows.map((r) => [r.step, r.depth])).toEqual([
      ["resnet50_ensemble", 0],
      ["resnet50_preprocess", 1],
      ["resnet50_inference", 1],
      ["resnet50_postprocess", 1],
    ]);
    const [total, ...steps] = rows as [Row, ...Row[]];
    expect(total.requestUs).toBeGreaterThan(0);
    let sum = 0;
    for (const s of steps) {
      expect(s.failed).toBe(false);
      expect(s.queueUs).toBeGreaterThanOrEqual(0);
      expect(s.computeUs).toBeGreaterThan(0);
      sum += s.queueUs + s.computeUs;
    }
    console.log(
      `waterfall (µs): total ${total.requestUs.toFixed(0)}; ${steps.map((s) => `${s.step} queue ${s.queueUs.toFixed(0)} compute ${s.computeUs.toFixed(0)}`).join("; ")}`,
    );
    expect(sum).toBeLessThanOrEqual(total.requestUs);
    expect(await chelsea.locator("tr[data-step] [data-field=batch]").allTextContents()).toEqual(
      expect.arrayContaining(["1"]),
    );
    // Queue and compute bars drawn on the one axis.
    expect(await chelsea.locator('[data-segment="compute"]').count()).toBe(4);

    const failedRows = await openWaterfall(truncated);
    expect(failedRows.filter((r) => r.depth === 1).map((r) => [r.step, r.failed])).toEqual([
      ["resnet50_preprocess", true],
    ]);
    expect(await truncated.locator("tr.failed").count()).toBeGreaterThanOrEqual(1);

    const shot = join(ARTIFACTS, "ui-waterfall.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`screenshot: ${shot}`);

    // One click downloads the trace as Chrome trace-event JSON.
    const [download] = await Promise.all([page.waitForEvent("download"), chelsea.locator("a.export").click()]);
    expect(download.suggestedFilename()).toMatch(/^trellis-trace-\d+\.json$/);
    const doc = JSON.parse(await readFile((await download.path()) as string, "utf8"));
    checkTraceEventFormat(doc);
    await page.close();
  });

  it("through the front of the split deployment: the remote steps' own queue and compute under the front's calls", async () => {
    const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
    await page.goto(`${front.http}/ui/`);
    await expect.poll(() => page.locator("#model").inputValue()).toBe("resnet50_ensemble");
    await dropFiles(page, ["coffee.jpg"]);
    const coffee = page.locator('#results [data-file="coffee.jpg"]');
    await expect.poll(() => coffee.getAttribute("data-state"), { timeout: 30_000 }).toBe("done");
    const rows = await openWaterfall(coffee);
    expect(rows.map((r) => [r.step, r.depth, r.remote])).toEqual([
      ["resnet50_ensemble", 0, false],
      ["resnet50_preprocess", 1, false],
      ["resnet50_preprocess", 2, true],
      ["resnet50_inference", 1, false],
      ["resnet50_inference", 2, true],
      ["resnet50_postprocess", 1, false],
    ]);
    for (const remote of rows.filter((r) => r.remote)) {
      expect(remote.queueUs).toBeGreaterThanOrEqual(0);
      expect(remote.computeUs).toBeGreaterThan(0);
      // The front's call took at least the remote's own time: the rest is the network.
      const call = rows[rows.indexOf(remote) - 1]!;
      expect(call.requestUs).toBeGreaterThanOrEqual(remote.requestUs);
      console.log(
        `split ${remote.step}: call ${call.requestUs.toFixed(0)} µs, remote queue ${remote.queueUs.toFixed(0)} µs + compute ${remote.computeUs.toFixed(0)} µs of its ${remote.requestUs.toFixed(0)} µs`,
      );
    }
    await page.screenshot({ path: join(ARTIFACTS, "ui-waterfall-split.png"), fullPage: true });
    await page.close();
  });
});
