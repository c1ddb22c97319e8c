#!/usr/bin/env node
// CLI: pnpm models:fetch [--repository DIR] [--base-url URL] [--force]
import { Command } from "commander";
import { ChecksumError, fetchModels, OfflineError } from "./fetch.js";
import { DEFAULT_REPOSITORY } from "./paths.js";

const program = new Command("models:fetch")
  .description("download the real ResNet-50 (ONNX Model Zoo) and ImageNet labels into the model repository")
  .option("--repository <dir>", "model repository root", DEFAULT_REPOSITORY)
  .option("--base-url <url>", "fetch every file from <url>/<file name> (a mirror)")
  .option("--force", "download again even when a verified copy exists", false)
  .parse();
const opts = program.opts<{ repository: string; baseUrl?: string; force: boolean }>();
try {
  await fetchModels({ repository: opts.repository, baseUrl: opts.baseUrl, force: opts.force, progress: true });
} catch (err) {
  if (err instanceof OfflineError || err instanceof ChecksumError) {
    console.error(`models:fetch: ${err.message}`);
    process.exit(1);
  }
  throw err;
}
