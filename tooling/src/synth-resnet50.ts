#!/usr/bin/env node
// CLI: pnpm models:synth [--seed N] [--repository DIR] [--out FILE]
import { join } from "node:path";
import { Command } from "commander";
import { scriptArgv } from "./argv.js";
import { DEFAULT_REPOSITORY, INFERENCE_MODEL, LABELS_FILE } from "./paths.js";
import { synthesizeResNet50, writeSyntheticLabels } from "./synth.js";

// pnpm runs scripts in tooling/; paths on the command line mean the caller's directory.
if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);

const program = new Command("models:synth")
  .description("write a SYNTHETIC ResNet-50 v1.5 ONNX model (seeded random weights) into the model repository")
  .option("--seed <n>", "PRNG seed", "0")
  .option("--repository <dir>", "model repository root", DEFAULT_REPOSITORY)
  .option("--out <file>", "model file (default <repository>/resnet50_inference/1/model.onnx)")
  .parse(scriptArgv());
const opts = program.opts<{ seed: string; repository: string; out?: string }>();
const seed = Number(opts.seed);
if (!Number.isInteger(seed)) program.error(`--seed must be an integer, got ${opts.seed}`);

const r = await synthesizeResNet50({ seed, path: opts.out ?? join(opts.repository, INFERENCE_MODEL) });
console.log(
  `wrote SYNTHETIC ResNet-50 to ${r.path}: ${r.parameters.toLocaleString("en")} parameters, ${(r.bytes / 1e6).toFixed(1)} MB, seed ${r.seed}, sha256 ${r.sha256}, ${Math.round(r.ms)} ms`,
);
console.log(
  "its predictions are meaningless (metadata trellis.synthetic=true); run `pnpm models:fetch` for the real model",
);
const labels = join(opts.repository, LABELS_FILE);
if (await writeSyntheticLabels(labels)) {
  console.warn(
    `WARNING: ${labels} was missing: wrote 1000 PLACEHOLDER labels synthetic_class_<i>. Run \`pnpm models:fetch\` for the real ImageNet labels.`,
  );
}
