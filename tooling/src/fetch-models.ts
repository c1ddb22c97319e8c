#!/usr/bin/env node
// CLI: pnpm models:fetch [--repository DIR] [--base-url URL] [--force]
import { Command } from "commander";
import { scriptArgv } from "./argv.js";
import { ChecksumError, DownloadError, fetchModels, OfflineError } from "./fetch.js";
import { DEFAULT_REPOSITORY } from "./paths.js";

// pnpm runs scripts in tooling/; paths on the command line mean the caller's directory.
if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);

const program = new Command("models:fetch")
  .description("download the real ResNet-50 (ONNX Model Zoo) and ImageNet labels into the model repository")
  .option("--repository <dir>", "model repository root", DEFAULT_REPOSITORY)
  .option("--base-url <url>", "fetch every file from <url>/<file name> (a mirror)")
  .option("--force", "download again even when a verified copy exists", false)
  .parse(scriptArgv());
const opts = program.opts<{ repository: string; baseUrl?: string; force: boolean }>();
try {
  await fetchModels({ repository: opts.repository, baseUrl: opts.baseUrl, force: opts.force, progress: true });
} catch (err) {
  if (err instanceof OfflineError || err instanceof ChecksumError || err instanceof DownloadError) {
    console.error(`models:fetch: ${err.message}${err instanceof OfflineError && err.detail ? ` (${err.detail})` : ""}`);
    process.exit(1);
  }
  throw err;
}
