#!/usr/bin/env node
// The public API of every published package, pinned as API Extractor reports (<package>/etc/*.api.md).
//   pnpm api:check   (CI) fails when a built package's exports differ from its committed report, naming the
//                    exports that changed and how to fix it.
//   pnpm api:update  rewrites the reports from the built packages (run `pnpm build` first).
// A package is public when its package.json is not "private"; every "exports" entry with a "types" condition
// gets a report: "." as etc/<name>.api.md, "./backend" as etc/<name>-backend.api.md. All packages run in this
// one process; the entries of one package share one TypeScript program. Settings: api-extractor.base.json.
// Usage: node scripts/api-report.mjs [--update] [--root DIR] [@trellis/name ...]
//   DIR defaults to the repository root; names limit the run to those packages (default: every public one).
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { CompilerState, Extractor, ExtractorConfig, ExtractorLogLevel } from "@microsoft/api-extractor";

const update = process.argv.includes("--update");
const argRoot = process.argv.indexOf("--root");
const root = path.resolve(
  argRoot > 0 ? process.argv[argRoot + 1] : path.join(path.dirname(fileURLToPath(import.meta.url)), ".."),
);
const baseConfigPath = path.join(root, "api-extractor.base.json");
const onlyPackages = process.argv.slice(2).filter((arg, i, args) => arg.startsWith("@") && args[i - 1] !== "--root");

/** The workspace folders (pnpm-workspace.yaml's "packages" globs, of the form `dir` or `dir/*`). */
function workspaceFolders() {
  const globs = [...readFileSync(path.join(root, "pnpm-workspace.yaml"), "utf8").matchAll(/^\s+-\s+"([^"]+)"/gm)];
  const folders = [];
  for (const [, glob] of globs) {
    if (!glob.endsWith("/*")) {
      folders.push(path.join(root, glob));
      continue;
    }
    const parent = path.join(root, glob.slice(0, -2));
    if (!existsSync(parent)) continue;
    for (const entry of readdirSync(parent, { withFileTypes: true })) {
      if (entry.isDirectory()) folders.push(path.join(parent, entry.name));
    }
  }
  return folders.filter((folder) => existsSync(path.join(folder, "package.json"))).sort();
}

/** Each public package with its typed entry points: { folder, name, packageJsonPath, entries: [{ subpath, dts, reportName }] }. */
function publicPackages() {
  const packages = [];
  for (const folder of workspaceFolders()) {
    const packageJsonPath = path.join(folder, "package.json");
    const manifest = JSON.parse(readFileSync(packageJsonPath, "utf8"));
    if (manifest.private === true || !manifest.exports) continue;
    const unscoped = manifest.name.replace(/^@[^/]+\//, "");
    const entries = [];
    for (const [subpath, target] of Object.entries(manifest.exports)) {
      const types = typeof target === "object" && target !== null ? target.types : undefined;
      if (typeof types !== "string" || !types.endsWith(".d.ts")) continue;
      const suffix = subpath === "." ? "" : `-${subpath.replace(/^\.\//, "").replace(/[^A-Za-z0-9]+/g, "-")}`;
      entries.push({ subpath, dts: path.join(folder, types), reportName: `${unscoped}${suffix}` });
    }
    if (entries.length > 0) packages.push({ folder, name: manifest.name, packageJsonPath, entries });
  }
  return packages;
}

function prepareConfig(pkg, entry) {
  const configObject = ExtractorConfig.loadFile(baseConfigPath);
  configObject.projectFolder = pkg.folder;
  configObject.mainEntryPointFilePath = entry.dts;
  configObject.apiReport = { ...configObject.apiReport, reportFileName: entry.reportName };
  return ExtractorConfig.prepare({
    configObject,
    configObjectFullPath: path.join(pkg.folder, "api-extractor.json"),
    packageJsonFullPath: pkg.packageJsonPath,
  });
}

const relative = (file) => path.relative(root, file);

const DECLARATION =
  /^(?:export\s+)?(?:declare\s+)?(?:default\s+)?(?:abstract\s+)?(?:function|class|interface|type|const|let|var|enum|namespace)\s+([A-Za-z_$][\w$]*)/;

/** A report's top-level declarations by name (overloads joined; an import or re-export line is its own entry). */
function declarations(reportFile) {
  const text = readFileSync(reportFile, "utf8");
  const body = text.slice(text.indexOf("```ts") + 5, text.lastIndexOf("```"));
  const byName = new Map();
  let current;
  let leadingComments = [];
  for (const line of body.split("\n")) {
    if (line.trim() === "") continue;
    const declared = DECLARATION.exec(line)?.[1] ?? (/^(?:import|export\s*\{)/.test(line) ? line : undefined);
    if (declared !== undefined) {
      current = declared;
      byName.set(current, `${byName.get(current) ?? ""}${leadingComments.join("\n")}${line}\n`);
      leadingComments = [];
    } else if (line.startsWith("//")) {
      leadingComments.push(line); // the release tag and warnings of the next declaration
    } else if (current !== undefined) {
      byName.set(current, `${byName.get(current)}${line}\n`);
    }
  }
  return byName;
}

/** Which declarations were removed, added or changed between the committed report and the built one. */
function describeChange(committed, built) {
  const before = declarations(committed);
  const after = declarations(built);
  const names = [];
  for (const [name, text] of before) {
    if (!after.has(name)) names.push(`removed: ${name}`);
    else if (after.get(name) !== text) names.push(`changed: ${name}`);
  }
  for (const name of after.keys()) if (!before.has(name)) names.push(`added:   ${name}`);
  const diff = spawnSync("git", ["diff", "--no-index", "--no-color", "-U0", "--", committed, built], {
    encoding: "utf8",
  });
  const changed = diff.stdout.split("\n").filter((line) => /^[-+](?![-+])/.test(line));
  return { changed, names };
}

/** Runs one entry point; returns a problem description (string) or undefined when the report matches. */
function runEntry(pkg, entry, compilerState) {
  const extractorConfig = prepareConfig(pkg, entry);
  const printed = [];
  const result = Extractor.invoke(extractorConfig, {
    localBuild: update,
    compilerState,
    messageCallback(message) {
      message.handled = true;
      // console-* messages narrate the report files; this script says the same in one line per entry point.
      if (message.messageId.startsWith("console-")) return;
      if (message.logLevel === ExtractorLogLevel.Error || message.logLevel === ExtractorLogLevel.Warning) {
        const where = message.sourceFilePath ? `${relative(message.sourceFilePath)}:${message.sourceFileLine}: ` : "";
        printed.push(`  ${message.logLevel} ${where}(${message.messageId}) ${message.text}`);
      }
    },
  });
  const label = `${pkg.name}${entry.subpath === "." ? "" : entry.subpath.slice(1)}`;
  const report = relative(extractorConfig.reportFilePath);
  for (const line of printed) console.error(line);
  if (result.errorCount > 0) return `${label}: API Extractor reported ${result.errorCount} error(s) (above)`;
  if (!result.apiReportChanged) {
    console.log(`ok       ${label}  (${report})`);
    return undefined;
  }
  if (update) {
    console.log(`updated  ${label}  (${report})`);
    return undefined;
  }
  if (!existsSync(extractorConfig.reportFilePath)) return `${label}: no committed report ${report}`;
  const { changed, names } = describeChange(extractorConfig.reportFilePath, extractorConfig.reportTempFilePath);
  const lines = [`${label}: its exports differ from ${report}`];
  for (const name of names) lines.push(`    ${name}`);
  lines.push("  report lines (- committed, + built):", ...changed.slice(0, 40).map((line) => `    ${line}`));
  if (changed.length > 40) lines.push(`    ... ${changed.length - 40} more`);
  return lines.join("\n");
}

/** Reports in etc/ that no entry point writes any more (an entry point removed or renamed). */
function staleReports(pkg) {
  const etc = path.join(pkg.folder, "etc");
  if (!existsSync(etc)) return [];
  const expected = new Set(pkg.entries.map((entry) => `${entry.reportName}.api.md`));
  return readdirSync(etc)
    .filter((file) => file.endsWith(".api.md") && !expected.has(file))
    .map((file) => path.join(etc, file));
}

function main() {
  const problems = [];
  const packages = publicPackages();
  const unknown = onlyPackages.filter((name) => !packages.some((pkg) => pkg.name === name));
  if (unknown.length > 0) {
    console.error(`not a public workspace package: ${unknown.join(", ")}`);
    process.exitCode = 2;
    return;
  }
  for (const pkg of packages.filter((p) => onlyPackages.length === 0 || onlyPackages.includes(p.name))) {
    const missing = pkg.entries.filter((entry) => !existsSync(entry.dts));
    if (missing.length > 0) {
      problems.push(`${pkg.name}: ${missing.map((e) => relative(e.dts)).join(", ")} missing; build it first`);
      continue;
    }
    if (update) mkdirSync(path.join(pkg.folder, "etc"), { recursive: true });
    const compilerState = CompilerState.create(prepareConfig(pkg, pkg.entries[0]), {
      additionalEntryPoints: pkg.entries.map((entry) => entry.dts),
    });
    for (const entry of pkg.entries) {
      const problem = runEntry(pkg, entry, compilerState);
      if (problem) problems.push(problem);
    }
    for (const stale of staleReports(pkg)) {
      if (update) {
        rmSync(stale);
        console.log(`removed  ${relative(stale)} (no such entry point)`);
      } else problems.push(`${pkg.name}: ${relative(stale)} belongs to no entry point in "exports"`);
    }
  }
  if (problems.length === 0) return;
  console.error(`\nThe public API changed:\n\n${problems.join("\n\n")}\n`);
  console.error(
    "If the change is intended: run `pnpm build && pnpm api:update`, commit the etc/*.api.md reports, and add a\n" +
      "changeset (`pnpm changeset`) saying what changed and how to migrate (RELEASING.md). If not, restore the export.",
  );
  process.exitCode = 1;
}

main();
