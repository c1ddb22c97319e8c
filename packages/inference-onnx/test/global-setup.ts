/**
 * The stage runs its sessions in dist/worker.js, so the tests use the built
 * package; this rebuilds it first when any source file is newer than dist.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const root = join(import.meta.dirname, "..");

function newest(dir: string): number {
  let t = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    t = Math.max(t, e.isDirectory() ? newest(p) : statSync(p).mtimeMs);
  }
  return t;
}

export default function setup(): void {
  const built = (() => {
    try {
      return statSync(join(root, "dist", "worker.js")).mtimeMs;
    } catch {
      return 0;
    }
  })();
  if (built >= newest(join(root, "src"))) return;
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  execFileSync(process.execPath, [tsc, "-p", "tsconfig.build.json"], { cwd: root, stdio: "inherit" });
}
