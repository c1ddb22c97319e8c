/**
 * Shadow mode for a migration: runs the seed's Python models and their TypeScript replacements on
 * a folder of images and prints each output's agreement (max |Δ|, mismatching elements, strings
 * exact). Exit code 1 when any output disagrees.
 * Run: pnpm --filter @trellis/server shadow <python repository> <typescript repository> <image folder> [python3]
 */
import { readdir, readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { formatAgreement, shadowCompare } from "./shadow-compare.js";

const [pythonRepository, typescriptRepository, folder, pythonExecutable] = process.argv.slice(2);
if (!pythonRepository || !typescriptRepository || !folder) {
  console.error("usage: shadow <python repository> <typescript repository> <image folder> [python executable]");
  process.exit(2);
}
// pnpm runs scripts in the package's folder; INIT_CWD is where it was run from.
const base = process.env.INIT_CWD ?? process.cwd();
const dir = resolve(base, folder);
const names = (await readdir(dir)).filter((n) => /\.(jpe?g|png)$/i.test(n)).sort();
const images = await Promise.all(names.map((n) => readFile(join(dir, n))));
const rows = await shadowCompare({
  pythonRepository: resolve(base, pythonRepository),
  typescriptRepository: resolve(base, typescriptRepository),
  images,
  ...(pythonExecutable ? { pythonExecutable } : {}),
});
console.log(`${images.length} images from ${folder}`);
console.log(formatAgreement(rows));
process.exit(rows.every((r) => r.mismatching === 0 && !r.oneFailed) ? 0 : 1);
