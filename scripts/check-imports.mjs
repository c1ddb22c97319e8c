#!/usr/bin/env node
// The monorepo's import rules, checked in CI (.ci/run) as `pnpm check:imports`; exits 1 naming each breach.
//  1. No import cycles among the workspace packages' sources (packages/*/src, apps/*/src, ...; dpdm). Type-only
//     imports count: a type cycle still ties two modules' declarations together.
//  2. No package reaches into another's internals: `@trellis/x/<subpath>` must be one of x's package.json
//     "exports" (e.g. @trellis/stage/backend), and no relative path may lead into another package's folder.
//  3. The layering: the @trellis packages each package's code (tests and benches aside) and its package.json
//     "dependencies" may name (LAYERS below).
//  4. Contract-level packages pull in neither onnxruntime-node nor sharp, directly or transitively.
//  5. @trellis/stage's main index exports at most 40 names (types included).
// Usage: node scripts/check-imports.mjs [--root DIR]  (DIR defaults to the repository root)
import { existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const ts = require("typescript");
const { parseDependencyTree, parseCircular } = require("dpdm");

const argRoot = process.argv.indexOf("--root");
const root = path.resolve(
  argRoot > 0 ? process.argv[argRoot + 1] : path.join(path.dirname(fileURLToPath(import.meta.url)), ".."),
);

const CONTRACT = ["@trellis/protocol", "@trellis/stage"];
const SERVING = [...CONTRACT, "@trellis/kserve", "@trellis/runtime"];
/** Which workspace packages each package may import / depend on. Packages not listed are not restricted. */
const LAYERS = {
  "@trellis/protocol": [],
  "@trellis/stage": ["@trellis/protocol"],
  "@trellis/kserve": CONTRACT,
  "@trellis/runtime": [...CONTRACT, "@trellis/kserve"],
  // Their friendly factories (createPreprocess, createPostprocess) serve them by the model runtime.
  "@trellis/preprocess": SERVING,
  "@trellis/postprocess": SERVING,
  "@trellis/ensemble-runner": CONTRACT,
  "@trellis/frontends": [...CONTRACT, "@trellis/kserve"],
  "@trellis/inference-onnx": SERVING,
  "@trellis/inference-trt-bridge": SERVING,
  "@trellis/backend-python": SERVING,
  "@trellis/model-repository": [
    ...SERVING,
    "@trellis/backend-python",
    "@trellis/inference-onnx",
    "@trellis/inference-trt-bridge",
    "@trellis/preprocess",
    "@trellis/postprocess",
    "@trellis/ensemble-runner",
  ],
};
/** Packages whose runtime dependencies, followed transitively, must not contain these. */
const NO_NATIVE = [
  "@trellis/stage",
  "@trellis/kserve",
  "@trellis/runtime",
  "@trellis/postprocess",
  "@trellis/ensemble-runner",
  "@trellis/frontends",
];
const NATIVE = ["onnxruntime-node", "sharp"];
const MAX_STAGE_EXPORTS = 40;

const SOURCE = /\.(?:[cm]?ts|tsx|[cm]?js)$/;
const SKIP_DIR = new Set(["node_modules", "dist", ".turbo", "coverage"]);
const rel = (p) => path.relative(root, p).split(path.sep).join("/");
const problems = [];
const report = [];

// ---- the workspace: the folders pnpm-workspace.yaml lists ("dir/*" or "dir"; packages/*, apps/*, tooling without it)
function workspaceGlobs() {
  const file = path.join(root, "pnpm-workspace.yaml");
  if (!existsSync(file)) return ["packages/*", "apps/*", "tooling"];
  const globs = [];
  let inPackages = false;
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (/^\S/.test(line)) inPackages = /^packages:/.test(line);
    const m = inPackages && /^\s+-\s*["']?([^"'#\s]+)/.exec(line);
    if (m) globs.push(m[1]);
  }
  return globs;
}
const packages = [];
for (const glob of workspaceGlobs()) {
  if (!glob.endsWith("/*")) packages.push(path.join(root, glob));
  else if (existsSync(path.join(root, glob.slice(0, -2)))) {
    for (const name of readdirSync(path.join(root, glob.slice(0, -2))).sort())
      packages.push(path.join(root, glob.slice(0, -2), name));
  }
}
const workspace = new Map(); // name → { dir, json }
for (const dir of packages) {
  const file = path.join(dir, "package.json");
  if (!existsSync(file)) continue;
  const json = JSON.parse(readFileSync(file, "utf8"));
  workspace.set(json.name, { dir, json });
}
const packageOf = (file) => {
  let best;
  for (const [name, { dir }] of workspace) {
    if ((file === dir || file.startsWith(dir + path.sep)) && (!best || dir.length > best.dir.length))
      best = { name, dir };
  }
  return best;
};
const exportKeys = (json) =>
  json.exports === undefined
    ? null
    : typeof json.exports === "string" || !Object.keys(json.exports).some((k) => k.startsWith("."))
      ? ["."]
      : Object.keys(json.exports);
const exportTarget = (entry) =>
  typeof entry === "string" ? entry : entry && (entry.import ?? entry.default ?? exportTarget(entry.node));

function walk(dir, out) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) {
      // generated code (src/gen) is not ours to check
      if (!SKIP_DIR.has(entry.name) && !(entry.name === "gen" && path.basename(dir) === "src")) walk(p, out);
    } else if (SOURCE.test(entry.name) && !entry.name.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

// ---- 1. cycles (dpdm), with every workspace package's exports mapped to its sources
const paths = {};
for (const [name, { dir, json }] of workspace) {
  for (const key of exportKeys(json) ?? ["."]) {
    const target = key === "." && !json.exports ? json.main : exportTarget(json.exports?.[key] ?? json.exports);
    const src = typeof target === "string" && target.replace(/^\.\/dist\//, "src/").replace(/\.js$/, ".ts");
    if (src && existsSync(path.join(dir, src))) paths[name + key.slice(1)] = [path.join(dir, src)];
  }
}
const scratch = mkdtempSync(path.join(tmpdir(), "check-imports-"));
const tsconfig = path.join(scratch, "tsconfig.json");
writeFileSync(
  tsconfig,
  JSON.stringify({ compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", allowJs: true, paths } }),
);
const entries = [...workspace.values()]
  .filter(({ dir }) => existsSync(path.join(dir, "src")))
  .map(({ dir }) => `${rel(dir)}/src/**/*.{ts,mts,js,mjs}`);
try {
  const tree = await parseDependencyTree(entries, {
    cwd: root,
    context: root,
    tsconfig,
    transform: false, // keep type-only imports
    exclude: /node_modules|[\\/]dist[\\/]|[\\/]src[\\/]gen[\\/]/,
  });
  const analysed = Object.entries(tree).filter(([, deps]) => deps !== null).length;
  const cycles = parseCircular(tree);
  for (const found of cycles) {
    const start = found.indexOf([...found].sort()[0]); // start each cycle at its first file by name: stable output
    const cycle = [...found.slice(start), ...found.slice(0, start)];
    problems.push(`import cycle: ${[...cycle, cycle[0]].join(" -> ")}`);
  }
  report.push(`import cycles: ${cycles.length} among ${analysed} source files`);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}

// ---- 2 + 3. deep imports and layering, read from every source file's import specifiers
let files = 0;
for (const [name, { dir, json }] of workspace) {
  const allowed = LAYERS[name];
  for (const file of walk(dir, [])) {
    files++;
    const relFile = path.relative(dir, file).split(path.sep).join("/");
    const production =
      relFile.startsWith("src/") && !/\.(test|spec)\.[cm]?[jt]s$/.test(relFile) && !/\/bench\//.test(relFile);
    for (const { fileName: spec } of ts.preProcessFile(readFileSync(file, "utf8"), true, true).importedFiles) {
      if (spec.startsWith(".")) {
        const owner = packageOf(path.resolve(path.dirname(file), spec));
        if (owner && owner.name !== name) {
          problems.push(`${rel(file)} imports "${spec}": reaches into ${owner.name}'s files (import "${owner.name}")`);
        }
        continue;
      }
      const m = /^(@trellis\/[^/]+)(\/.*)?$/.exec(spec);
      if (!m) continue;
      const [, target, sub = ""] = m;
      const other = workspace.get(target);
      if (!other) continue;
      const keys = exportKeys(other.json);
      if (target !== name && keys && !keys.includes(`.${sub}`)) {
        problems.push(`${rel(file)} imports "${spec}": not in ${target}'s package.json "exports" (${keys.join(", ")})`);
      } else if (target !== name && !keys && sub) {
        problems.push(`${rel(file)} imports "${spec}": another package's internals (import "${target}")`);
      }
      if (production && allowed && target !== name && !allowed.includes(target)) {
        problems.push(
          `${rel(file)} imports ${target}: ${name} may import only ${allowed.join(", ") || "no workspace package"}`,
        );
      }
    }
  }
  if (allowed) {
    for (const dep of Object.keys(json.dependencies ?? {})) {
      if (workspace.has(dep) && dep !== name && !allowed.includes(dep)) {
        problems.push(
          `${rel(path.join(dir, "package.json"))} depends on ${dep}: ${name} may depend only on ${allowed.join(", ") || "no workspace package"}`,
        );
      }
    }
  }
}
report.push(`deep imports and layering: ${files} files read`);

// ---- 4. runtime dependency closure (package.json "dependencies", workspace and installed ones)
function findInstalled(fromDir, dep) {
  for (let dir = fromDir; ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, "node_modules", dep);
    if (existsSync(path.join(candidate, "package.json"))) return realpathSync(candidate);
    if (path.dirname(dir) === dir) return null;
  }
}
function closure(start) {
  const seen = new Map(); // name → chain that reached it
  const queue = [{ dir: workspace.get(start).dir, chain: [start] }];
  while (queue.length > 0) {
    const { dir, chain } = queue.shift();
    const json = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
    const deps = [
      ...Object.keys(json.dependencies ?? {}).map((d) => [d, false]),
      ...Object.keys(json.optionalDependencies ?? {}).map((d) => [d, true]),
    ];
    for (const [dep, optional] of deps) {
      const next = [...chain, dep];
      if (seen.has(dep)) continue;
      seen.set(dep, next);
      const depDir = workspace.get(dep)?.dir ?? findInstalled(dir, dep);
      if (depDir) queue.push({ dir: depDir, chain: next });
      else if (!optional) problems.push(`${chain.at(-1)} depends on ${dep}, which is not installed (pnpm install)`);
    }
  }
  return seen;
}
for (const name of NO_NATIVE) {
  if (!workspace.has(name)) continue;
  const deps = closure(name);
  const found = NATIVE.filter((native) => deps.has(native));
  for (const native of found) problems.push(`${name} pulls in ${native}: ${deps.get(native).join(" -> ")}`);
  report.push(
    `${name}: ${deps.size} runtime dependencies, ${found.length ? `including ${found.join(", ")}` : `none of ${NATIVE.join(", ")}`}`,
  );
}

// ---- 5. the contract's index stays small
const stage = workspace.get("@trellis/stage");
const stageIndex = stage && path.join(stage.dir, "src/index.ts");
if (stageIndex && existsSync(stageIndex)) {
  const program = ts.createProgram([stageIndex], {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    noEmit: true,
    noLib: true, // names only: no need to parse the standard library
    types: [],
  });
  const checker = program.getTypeChecker();
  const moduleSymbol = checker.getSymbolAtLocation(program.getSourceFile(stageIndex));
  const names = moduleSymbol ? checker.getExportsOfModule(moduleSymbol).map((s) => s.name) : [];
  if (names.length > MAX_STAGE_EXPORTS) {
    problems.push(
      `@trellis/stage's index exports ${names.length} names (at most ${MAX_STAGE_EXPORTS}): ${names.join(", ")}`,
    );
  }
  report.push(`@trellis/stage index: ${names.length} exported names (at most ${MAX_STAGE_EXPORTS})`);
}

for (const line of report) console.log(line);
if (problems.length > 0) {
  console.error(`\n${problems.length} import rule breach(es):`);
  for (const p of problems) console.error(`  ${p}`);
  process.exit(1);
}
console.log("import rules: ok");
