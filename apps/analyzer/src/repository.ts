/**
 * The user's repository, read once and never written: the ensemble's config and its steps'.
 * Candidates are served from temp repositories holding only the ensemble and its steps (the
 * steps' files hard-linked, so a 100 MB model costs nothing per candidate); the winner is
 * written as a full copy of the user's repository with the tuned steps' config.pbtxt rewritten.
 */
import {
  copyFile,
  cp,
  link,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  realpath,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { toText } from "@bufbuild/protobuf/txtpb";
import { type ModelConfig, ModelConfigSchema, parseModelConfig } from "@trellis/protocol";
import { applySettings, type Candidate, describeSettings, readSettings } from "./space.js";

export interface EnsembleRepository {
  root: string;
  ensemble: string;
  /** The ensemble's own config. */
  ensembleConfig: ModelConfig;
  /** Each local step's config, in step order (a step repeated is listed once). */
  steps: { name: string; config: ModelConfig }[];
  /** The shipped config: every step's settings as the repository has them. */
  shipped: Candidate;
}

async function readConfig(root: string, model: string): Promise<ModelConfig> {
  const path = join(root, model, "config.pbtxt");
  return parseModelConfig(await readFile(path, "utf8"), path);
}

/** Reads the ensemble `ensemble` of repository `root` and its steps' configs. */
export async function readEnsemble(root: string, ensemble: string): Promise<EnsembleRepository> {
  const absolute = resolve(root);
  const ensembleConfig = await readConfig(absolute, ensemble);
  const scheduling = ensembleConfig.schedulingChoice;
  if (ensembleConfig.platform !== "ensemble" || scheduling.case !== "ensembleScheduling") {
    throw new Error(`${ensemble} is not an ensemble (platform "${ensembleConfig.platform}")`);
  }
  const names = [...new Set(scheduling.value.step.map((s) => s.modelName))];
  const steps = await Promise.all(names.map(async (name) => ({ name, config: await readConfig(absolute, name) })));
  const shipped = Object.fromEntries(steps.map((s) => [s.name, readSettings(s.config)]));
  return { root: absolute, ensemble, ensembleConfig, steps, shipped };
}

/** A config as text config.pbtxt, with a header saying where it came from. */
export function configText(config: ModelConfig, note: string): string {
  return `# ${note}\n${toText(ModelConfigSchema, config)}`;
}

/**
 * Every file under `from` hard-linked (copied across file systems) under `to`. Symbolic links
 * are followed, to files and to folders (model files often live on a shared volume): what a
 * link points at is linked in its place, so the candidate's own files are never the user's links,
 * and nothing is ever written through one. A folder reached twice (a link cycle) is skipped.
 */
async function linkTree(from: string, to: string, seen = new Set<string>()): Promise<void> {
  const real = await realpath(from);
  if (seen.has(real)) return;
  seen.add(real);
  await mkdir(to, { recursive: true });
  for (const entry of await readdir(from, { withFileTypes: true })) {
    const [src, dst] = [join(from, entry.name), join(to, entry.name)];
    // A dangling link is left out, as the server would find nothing there either.
    const info = entry.isSymbolicLink() ? await stat(src).catch(() => undefined) : entry;
    if (info?.isDirectory()) await linkTree(src, dst, seen);
    else if (info?.isFile()) {
      const target = entry.isSymbolicLink() ? await realpath(src) : src;
      await link(target, dst).catch(() => copyFile(target, dst));
    }
  }
}

/** A temp repository serving `candidate`: the ensemble and its steps only. Remove it with `removeRepository`. */
export async function candidateRepository(repo: EnsembleRepository, candidate: Candidate): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-analyze-"));
  for (const model of [repo.ensemble, ...repo.steps.map((s) => s.name)]) {
    await linkTree(join(repo.root, model), join(dir, model));
  }
  for (const step of repo.steps) {
    const settings = candidate[step.name];
    if (!settings) continue;
    const path = join(dir, step.name, "config.pbtxt");
    // Replace the link, never write through it: the user's file must stay as it is.
    await rm(path);
    await writeFile(path, configText(applySettings(step.config, settings), "candidate of trellis analyze"));
  }
  return dir;
}

export const removeRepository = (dir: string) => rm(dir, { recursive: true, force: true });

/**
 * The whole user repository copied to `out` (which must not exist or be empty of models),
 * with each step whose settings the winner changes given a rewritten config.pbtxt.
 * Returns the steps rewritten.
 */
export async function writeTunedCopy(repo: EnsembleRepository, winner: Candidate, out: string): Promise<string[]> {
  const target = resolve(out);
  if (target === repo.root || target.startsWith(`${repo.root}/`)) {
    throw new Error(`--output ${out} is inside the repository analysed: the analyzer never writes there`);
  }
  await cp(repo.root, target, { recursive: true, force: true });
  const rewritten: string[] = [];
  for (const step of repo.steps) {
    const settings = winner[step.name];
    const shipped = repo.shipped[step.name];
    if (!settings || !shipped || describeSettings(settings) === describeSettings(shipped)) continue;
    const note = `tuned by trellis analyze (${describeSettings(settings)}; shipped: ${describeSettings(shipped)})`;
    const folder = join(target, step.name);
    // The copy keeps the user's links as links: a linked model folder becomes a folder of its
    // own (else the write below would land in the user's), a linked config is replaced.
    if ((await lstat(folder)).isSymbolicLink()) {
      await rm(folder);
      await cp(join(repo.root, step.name), folder, { recursive: true, dereference: true });
    }
    const path = join(folder, "config.pbtxt");
    await rm(path, { force: true });
    await writeFile(path, configText(applySettings(step.config, settings), note));
    rewritten.push(step.name);
  }
  return rewritten;
}
