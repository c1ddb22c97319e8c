/**
 * The page on the HTTP port (/ui, built from apps/web and copied into dist/ui at
 * build). The files are read once at start into a table keyed by their URL; a
 * request is answered from that table only, so nothing a client sends reaches
 * the file system. The one file taken from elsewhere is the last model analysis
 * (`pnpm analyze` writes `analysis.html` at the root of the repository it tunes):
 * that fixed name, from the root of a repository the server serves, at the fixed
 * URL /ui/analysis.html.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { extname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

/** Where the build puts the page: dist/ui beside this module. */
export const UI_DIR = fileURLToPath(new URL("./ui/", import.meta.url));
export const UI_PATH = "/ui/";

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".json": "application/json",
};

// The page loads only its own files and talks only to this server; images are shown from blob: URLs.
const CSP =
  "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; style-src 'self'; script-src 'self'; " +
  "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";

// The analysis report is one self-contained document: inline styles and an inline SVG, no script, nothing fetched.
const REPORT_CSP =
  "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";

/** The URL of the last model analysis, and the one file name it is read from. */
export const ANALYSIS_PATH = `${UI_PATH}analysis.html`;
export const ANALYSIS_FILE = "analysis.html";

interface Asset {
  body: Buffer;
  type: string;
  /** Vite's hashed file names never change content: cache them; index.html is revalidated. */
  immutable: boolean;
  /** The page's policy unless set (the analysis report has its own). */
  csp?: string;
}

/** analysis.html from the root of the first of `repositories` that has one, read now; undefined when none does. */
export function readAnalysisReport(repositories: readonly string[]): Asset | undefined {
  const file = repositories.map((r) => join(r, ANALYSIS_FILE)).find((f) => existsSync(f));
  if (!file) return undefined;
  try {
    return { body: readFileSync(file), type: TYPES[".html"]!, immutable: false, csp: REPORT_CSP };
  } catch {
    return undefined;
  }
}

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}

/**
 * The built page's files by URL path (/ui/, /ui/assets/…), and the last analysis report of
 * `repositories` at ANALYSIS_PATH; empty when no page was built.
 */
export function readUiAssets(dir: string = UI_DIR, repositories: readonly string[] = []): Map<string, Asset> {
  const assets = new Map<string, Asset>();
  let found: string[];
  try {
    found = files(dir);
  } catch {
    return assets;
  }
  for (const file of found) {
    const type = TYPES[extname(file)];
    if (!type) continue;
    const rel = relative(dir, file).split(sep).join("/");
    const asset = { body: readFileSync(file), type, immutable: rel.startsWith("assets/") };
    assets.set(`${UI_PATH}${rel}`, asset);
    if (rel === "index.html") assets.set(UI_PATH, asset);
  }
  const report = assets.size > 0 ? readAnalysisReport(repositories) : undefined;
  if (report) assets.set(ANALYSIS_PATH, report);
  return assets;
}

/**
 * A handler for the page's routes: GET/HEAD of a built file, `/ui` and `/` sent to `/ui/`.
 * Returns false for any other path (the REST API answers it).
 */
export function uiHandler(assets: Map<string, Asset>) {
  return (req: IncomingMessage, res: ServerResponse): boolean => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    if (path !== "/" && path !== "/ui" && !path.startsWith(UI_PATH)) return false;
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" }).end("Method Not Allowed");
      return true;
    }
    if (path === "/" || path === "/ui") {
      res.writeHead(302, { location: UI_PATH, "content-length": 0 }).end();
      return true;
    }
    // The raw path, not decoded: only the exact names of built files match.
    const asset = assets.get(path);
    if (!asset) {
      res.writeHead(404, { "content-type": "text/plain" }).end("Not Found");
      return true;
    }
    res.writeHead(200, {
      "content-type": asset.type,
      "content-length": asset.body.length,
      "cache-control": asset.immutable ? "public, max-age=31536000, immutable" : "no-cache",
      "content-security-policy": asset.csp ?? CSP,
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
    });
    res.end(req.method === "HEAD" ? undefined : asset.body);
    return true;
  };
}
