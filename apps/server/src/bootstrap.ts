/**
 * First start on a fresh machine: the seed repository ships configs but no
 * weights. If resnet50_inference has no model.onnx, fetch it; offline, write
 * the synthetic stand-in and say so loudly.
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "./server.js";

const exists = async (path: string) => (await stat(path).catch(() => undefined))?.isFile() ?? false;

interface Tooling {
  fetchModels(options: { repository: string; logger?: unknown }): Promise<unknown>;
  synthesizeResNet50(options: { repository: string; logger?: unknown }): Promise<unknown>;
}

// Loaded only when weights are missing: the common start path never pays for it.
const TOOLING = "@trellis/tooling";

export async function ensureSeedModels(repositories: string[], logger: Logger): Promise<void> {
  for (const repository of repositories) {
    const config = join(repository, "resnet50_inference", "config.pbtxt");
    const weights = join(repository, "resnet50_inference", "1", "model.onnx");
    if (!(await exists(config)) || (await exists(weights))) continue;
    logger.info({ repository, missing: weights }, "ResNet-50 weights missing; fetching them");
    const tooling = (await import(TOOLING)) as Tooling;
    try {
      await tooling.fetchModels({ repository, logger });
      logger.info({ repository }, "model fetch complete");
    } catch (err) {
      logger.warn(
        { repository, err: err instanceof Error ? err.message : String(err) },
        "!!! could not fetch the ResNet-50 weights (offline?): writing a SYNTHETIC ResNet-50 with random weights. The server will run, but its classifications are meaningless. Run `pnpm models:fetch` when online. !!!",
      );
      await tooling.synthesizeResNet50({ repository, logger });
    }
  }
}
