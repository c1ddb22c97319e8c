#!/usr/bin/env node
/**
 * `node scripts/build-runtime.mjs <package>`: builds a workspace package and the workspace packages
 * it needs at run time (its "dependencies", and what those need to build; not the package's own
 * devDependencies), with turbo, so cached builds are reused. `pnpm client` builds the client this way: without the server its tests
 * start, which `turbo build --filter=<package>...` would also build.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));

/** Every workspace package's manifest, by name (pnpm-workspace.yaml's `- "dir"` and `- "dir/*"` entries). */
function workspacePackages() {
  const globs = [...readFileSync(join(root, "pnpm-workspace.yaml"), "utf8").matchAll(/^\s+-\s+"([^"]+)"/gm)];
  const dirs = globs.flatMap(([, glob]) =>
    glob.endsWith("/*")
      ? readdirSync(join(root, glob.slice(0, -2)), { withFileTypes: true })
          .filter((d) => d.isDirectory())
          .map((d) => join(glob.slice(0, -2), d.name))
      : [glob],
  );
  const byName = new Map();
  for (const dir of dirs) {
    const file = join(root, dir, "package.json");
    if (!existsSync(file)) continue;
    const manifest = JSON.parse(readFileSync(file, "utf8"));
    byName.set(manifest.name, manifest);
  }
  return byName;
}

const wanted = process.argv[2];
const packages = workspacePackages();
if (!packages.has(wanted)) {
  console.error(`build-runtime: ${wanted} is not a workspace package`);
  process.exit(2);
}
// The package's runtime dependencies, and all that those need to build (their devDependencies too:
// their task hashes then match a full build's, so what `pnpm start` or `pnpm build` built is reused).
const closure = new Set([wanted]);
const visit = (name) => {
  if (closure.has(name) || !packages.has(name)) return;
  closure.add(name);
  const { dependencies = {}, devDependencies = {} } = packages.get(name);
  for (const dep of [...Object.keys(dependencies), ...Object.keys(devDependencies)]) visit(dep);
};
for (const dep of Object.keys(packages.get(wanted).dependencies ?? {})) visit(dep);
// --only: these packages' tasks and no others; generate and build, in the graph's order among them.
const filters = [...closure].sort().map((name) => `--filter=${name}`);
const turbo = join(root, "node_modules", ".bin", "turbo");
const { status } = spawnSync(turbo, ["run", "generate", "build", "--only", ...filters, "--output-logs=errors-only"], {
  cwd: root,
  stdio: "inherit",
});
process.exit(status ?? 1);
