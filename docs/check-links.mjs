#!/usr/bin/env node
/**
 * Checks the relative links of the project's Markdown files: the file (or folder) each names
 * exists, and a `#anchor` matches a heading of the Markdown file it points into (GitHub's slugs).
 * Run from the repository root: node docs/check-links.mjs [FILE.md ...] (default: every tracked
 * or new Markdown file outside node_modules). Exits 1 listing the broken links.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const files =
  process.argv.length > 2
    ? process.argv.slice(2)
    : execFileSync("git", ["ls-files", "--cached", "--others", "--exclude-standard", "*.md"], { encoding: "utf8" })
        .split("\n")
        .filter((f) => f && !f.includes("node_modules/") && existsSync(f));

/** GitHub's heading ids: lower case, punctuation dropped, spaces to dashes, repeats numbered. */
function anchors(file) {
  const seen = new Map();
  const ids = new Set();
  let fence = false;
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (/^\s*(```|~~~)/.test(line)) fence = !fence;
    const m = !fence && /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const text = m[1].replace(/\[([^\]]*)\]\([^)]*\)/g, "$1");
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, "")
      .replace(/\s/g, "-");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    ids.add(n ? `${base}-${n}` : base);
  }
  return ids;
}

const broken = [];
for (const file of files) {
  let fence = false;
  readFileSync(file, "utf8")
    .split("\n")
    .forEach((line, i) => {
      if (/^\s*(```|~~~)/.test(line)) fence = !fence;
      if (fence) return;
      for (const m of line.replace(/`[^`]*`/g, "").matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
        const target = m[1];
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
        const [path, anchor] = target.split("#");
        const to = path ? resolve(dirname(file), decodeURIComponent(path)) : resolve(file);
        const where = `${file}:${i + 1}: ${target}`;
        if (!existsSync(to)) broken.push(`${where} (no such file)`);
        else if (anchor && to.endsWith(".md") && statSync(to).isFile() && !anchors(to).has(anchor))
          broken.push(`${where} (no heading #${anchor} in ${relative(process.cwd(), to) || join(".", file)})`);
      }
    });
}
if (broken.length) {
  console.log(broken.join("\n"));
  process.exit(1);
}
console.log(`${files.length} Markdown files, every relative link resolves`);
