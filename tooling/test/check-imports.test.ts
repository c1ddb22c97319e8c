// scripts/check-imports.mjs (`pnpm check:imports`, run by .ci/run): the repository passes it, and each rule
// fails on a small repository that breaks it (a clean copy of that repository passes, so the edit is the cause).
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const script = path.join(repo, "scripts/check-imports.mjs");
const scratch = mkdtempSync(path.join(tmpdir(), "check-imports-test-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

function check(root: string): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, [script, "--root", root], { encoding: "utf8" });
  return { status: r.status, out: r.stdout + r.stderr };
}

type Files = Record<string, string>;
const pkg = (name: string, deps: string[] = [], exports = ["."]) =>
  JSON.stringify({
    name,
    type: "module",
    exports: Object.fromEntries(exports.map((k) => [k, { default: `./dist/${k === "." ? "index" : k.slice(2)}.js` }])),
    dependencies: Object.fromEntries(deps.map((d) => [d, d.startsWith("@trellis/") ? "workspace:*" : "1.0.0"])),
  });
/** A small workspace laid out like ours: protocol ← stage ← kserve, ensemble-runner on the contract. */
const base: Files = {
  "packages/protocol/package.json": pkg("@trellis/protocol"),
  "packages/protocol/src/index.ts": "export const version = 1;\n",
  "packages/stage/package.json": pkg("@trellis/stage", ["@trellis/protocol"], [".", "./backend"]),
  "packages/stage/src/index.ts": 'export { tensor, type Tensor } from "./tensor.js";\n',
  "packages/stage/src/tensor.ts":
    'import { version } from "@trellis/protocol";\nexport type Tensor = { v: number };\nexport const tensor = (): Tensor => ({ v: version });\n',
  "packages/stage/src/backend.ts": 'export { tensor as makeTensor } from "./tensor.js";\n',
  "packages/kserve/package.json": pkg("@trellis/kserve", ["@trellis/stage"]),
  "packages/kserve/src/index.ts":
    'import { tensor } from "@trellis/stage";\nimport { makeTensor } from "@trellis/stage/backend";\nexport const both = [tensor(), makeTensor()];\n',
  "packages/ensemble-runner/package.json": pkg("@trellis/ensemble-runner", ["@trellis/stage", "@trellis/protocol"]),
  "packages/ensemble-runner/src/index.ts": 'export { tensor } from "@trellis/stage";\n',
  "packages/preprocess/package.json": pkg("@trellis/preprocess", ["@trellis/stage", "sharp"]),
  "packages/preprocess/src/index.ts": 'export { tensor } from "@trellis/stage";\n',
  "node_modules/sharp/package.json": JSON.stringify({ name: "sharp", version: "1.0.0" }),
};

let n = 0;
function repoWith(edits: Files): string {
  const root = path.join(scratch, `repo-${n++}`);
  for (const [file, text] of Object.entries({ ...base, ...edits })) {
    mkdirSync(path.dirname(path.join(root, file)), { recursive: true });
    writeFileSync(path.join(root, file), text);
  }
  return root;
}

describe("check-imports", () => {
  it("passes on this repository: no cycles, no deep imports, layering kept, small contract", () => {
    const { status, out } = check(repo);
    expect(out).toMatch(/import cycles: 0 among \d+ source files/);
    expect(out).toMatch(/@trellis\/ensemble-runner: \d+ runtime dependencies, none of onnxruntime-node, sharp/);
    const names = Number(/@trellis\/stage index: (\d+) exported names/.exec(out)?.[1]);
    expect(names).toBeGreaterThan(0);
    expect(names).toBeLessThanOrEqual(40);
    expect(out).toContain("import rules: ok");
    expect(status).toBe(0);
  });

  it("passes on the small clean repository the cases below break", () => {
    const { status, out } = check(repoWith({}));
    expect(out).toContain("import cycles: 0 among 7 source files");
    expect(out).toContain("@trellis/stage index: 2 exported names");
    expect(status).toBe(0);
  });

  it("fails on a cycle between two files of a package, naming it", () => {
    const { status, out } = check(
      repoWith({
        "packages/stage/src/a.ts": 'import { b } from "./b.js";\nexport const a = () => b;\n',
        "packages/stage/src/b.ts": 'import { a } from "./a.js";\nexport const b = () => a;\n',
      }),
    );
    expect(out).toContain(
      "import cycle: packages/stage/src/a.ts -> packages/stage/src/b.ts -> packages/stage/src/a.ts",
    );
    expect(status).toBe(1);
  });

  it("counts a cycle made of type-only imports", () => {
    const { status, out } = check(
      repoWith({
        "packages/stage/src/a.ts": 'import type { B } from "./b.js";\nexport type A = { b?: B };\n',
        "packages/stage/src/b.ts": 'import type { A } from "./a.js";\nexport type B = { a?: A };\n',
      }),
    );
    expect(out).toContain(
      "import cycle: packages/stage/src/a.ts -> packages/stage/src/b.ts -> packages/stage/src/a.ts",
    );
    expect(status).toBe(1);
  });

  it("fails on a cycle across packages (through their indexes) and on the contract importing kserve", () => {
    const { status, out } = check(
      repoWith({
        "packages/stage/src/tensor.ts":
          'import type { both } from "@trellis/kserve";\nexport type Tensor = { v: number; b?: typeof both };\nexport const tensor = (): Tensor => ({ v: 1 });\n',
      }),
    );
    expect(out).toContain(
      "import cycle: packages/kserve/src/index.ts -> packages/stage/src/index.ts -> packages/stage/src/tensor.ts -> packages/kserve/src/index.ts",
    );
    expect(out).toContain(
      "packages/stage/src/tensor.ts imports @trellis/kserve: @trellis/stage may import only @trellis/protocol",
    );
    expect(status).toBe(1);
  });

  it("fails on imports of another package's src/ or dist/, by name or by relative path", () => {
    const { status, out } = check(
      repoWith({
        "packages/kserve/src/deep.ts":
          'import { tensor } from "@trellis/stage/src/tensor.js";\nexport { version } from "@trellis/protocol/dist/index.js";\nexport const t = tensor;\n',
        "packages/kserve/test/rel.test.ts":
          'import { tensor } from "../../stage/src/tensor.js";\nexport const t = tensor;\n',
      }),
    );
    expect(out).toContain(
      `packages/kserve/src/deep.ts imports "@trellis/stage/src/tensor.js": not in @trellis/stage's package.json "exports" (., ./backend)`,
    );
    expect(out).toContain(`packages/kserve/src/deep.ts imports "@trellis/protocol/dist/index.js"`);
    expect(out).toContain(
      `packages/kserve/test/rel.test.ts imports "../../stage/src/tensor.js": reaches into @trellis/stage's files`,
    );
    expect(status).toBe(1);
  });

  it("fails when ensemble-runner depends, even transitively, on a package that brings sharp", () => {
    const { status, out } = check(
      repoWith({
        "packages/ensemble-runner/package.json": pkg("@trellis/ensemble-runner", [
          "@trellis/stage",
          "@trellis/preprocess",
        ]),
      }),
    );
    expect(out).toContain(
      "packages/ensemble-runner/package.json depends on @trellis/preprocess: @trellis/ensemble-runner may depend only on @trellis/protocol, @trellis/stage",
    );
    expect(out).toContain(
      "@trellis/ensemble-runner pulls in sharp: @trellis/ensemble-runner -> @trellis/preprocess -> sharp",
    );
    expect(status).toBe(1);
  });

  it("fails when @trellis/stage's index exports more than 40 names", () => {
    const many = Array.from({ length: 39 }, (_, i) => `export const name${i} = ${i};`).join("\n");
    const { status, out } = check(
      repoWith({ "packages/stage/src/index.ts": `${base["packages/stage/src/index.ts"]}${many}\n` }),
    );
    expect(out).toContain("@trellis/stage's index exports 41 names (at most 40)");
    expect(status).toBe(1);
  });
});
