/**
 * The README stays true to the command line: every flag `--help` lists is in
 * apps/server/README.md, so a flag added without its documentation fails here.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { expect, it } from "vitest";

const SERVER = join(import.meta.dirname, "..");

it("documents every flag --help lists", () => {
  const help = execFileSync(process.execPath, [join(SERVER, "dist", "main.js"), "--help"], { encoding: "utf8" });
  const flags = new Set([...help.matchAll(/^\s+(?:-[a-zA-Z], )?(--[a-z0-9-]+)/gm)].map((m) => m[1] as string));
  flags.delete("--help");
  flags.delete("--version");
  expect(flags.size).toBeGreaterThan(60);
  const readme = readFileSync(join(SERVER, "README.md"), "utf8");
  const missing = [...flags].filter((flag) => !readme.includes(`\`${flag}`));
  expect(missing).toEqual([]);
});
