#!/usr/bin/env node
/**
 * `pnpm start`: builds what the server needs and nothing else, saying what it does, then runs the
 * server in this process on the project's models/ (HTTP 8000, gRPC 8001, metrics 8002, the page at
 * /ui/), fetching ResNet-50 on a fresh clone or, offline, serving the bundled MobileNetV2.
 *
 * 1. The server's workspace packages and the page (@trellis/web), with turbo (cached: a later
 *    start rebuilds only what changed); not the server's own benchmarks, nor other apps.
 * 2. The server itself (tsc, apps/server/src only), when its sources are newer than its dist/,
 *    and the page copied into dist/ui when the page was rebuilt.
 * 3. The server, with `--fetch-models --default-model-repository ../../models` and any arguments
 *    given to `pnpm start` (as tritonserver takes them).
 */
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const server = join(root, "apps", "server");
const bin = (name) => join(root, "node_modules", ".bin", name);
const began = performance.now();
const say = (line) => console.log(`trellis start [${((performance.now() - began) / 1000).toFixed(1)} s] ${line}`);

function run(command, args, cwd = root) {
  const { status, signal, error } = spawnSync(command, args, { cwd, stdio: "inherit" });
  if (status !== 0) {
    say(`failed: ${command} ${args.join(" ")} (${error?.message ?? signal ?? `exit ${status}`})`);
    process.exit(status || 1);
  }
}

/** The newest modification time (ms) of the files under `dir`, or 0. */
function newest(dir) {
  if (!existsSync(dir)) return 0;
  let latest = 0;
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile()) latest = Math.max(latest, statSync(join(entry.parentPath, entry.name)).mtimeMs);
  }
  return latest;
}
const mtime = (path) => (existsSync(path) ? statSync(path).mtimeMs : 0);

say("1/3 building the packages the server uses and the page (turbo, a line per package; cached after the first start)");
run(bin("turbo"), ["run", "build", "--filter=@trellis/server^...", "--output-logs=hash-only"]);

const main = join(server, "dist", "main.js");
const sources = Math.max(
  newest(join(server, "src")),
  mtime(join(server, "package.json")),
  mtime(join(server, "tsconfig.build.json")),
);
if (mtime(main) < sources) {
  say("2/3 building the server (tsc, apps/server/src; its benchmarks are built by `pnpm build`)");
  run(bin("tsc"), ["-p", "tsconfig.build.json"], server);
} else {
  say("2/3 the server is built (apps/server/dist is newer than its sources)");
}
const page = join(server, "node_modules", "@trellis", "web", "dist", "index.html");
if (mtime(join(server, "dist", "ui", "index.html")) < mtime(page))
  run(process.execPath, ["scripts/copy-ui.mjs"], server);

const args = process.argv.slice(2);
if (args[0] === "--") args.shift();
say("3/3 starting the server on models/ (ResNet-50 is fetched if missing; offline, the bundled MobileNetV2 is served)");
// In this process, so that Ctrl-C and SIGTERM reach the server itself (it drains, then exits).
process.chdir(server);
process.argv = [process.argv[0], main, "--fetch-models", "--default-model-repository", "../../models", ...args];
await import(pathToFileURL(main).href);
