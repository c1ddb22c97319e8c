/**
 * First start on a fresh machine: the seed repository ships configs but no
 * weights. If resnet50_inference has no model.onnx (or postprocess no
 * labels), fetch them; offline, tooling writes the synthetic stand-in, and
 * we say so loudly.
 */
import { hasSeedArtifacts, isSeedRepository } from "@trellis/tooling/paths";
import type { Logger } from "../server.js";

export async function ensureSeedModels(repositories: string[], logger: Logger): Promise<void> {
  for (const repository of repositories) {
    if (!(await isSeedRepository(repository)) || (await hasSeedArtifacts(repository))) continue;
    logger.info({ repository }, "ResNet-50 weights or labels missing; fetching them (pnpm models:fetch)");
    // Loaded only now: a normal start never pays for the rest of the tooling.
    const { ensureModels } = await import("@trellis/tooling");
    const result = await ensureModels({
      repository,
      progress: false,
      log: (line) => logger.info({ repository }, line),
      warn: (line) => logger.warn({ repository }, line),
    });
    if (result.source === "synthetic") {
      const banner =
        "!!! OFFLINE: serving a SYNTHETIC ResNet-50 with random weights. Classifications are meaningless. Run `pnpm models:fetch` when online, then restart. !!!";
      logger.warn({ repository, model: result.modelPath }, banner);
      process.stderr.write(`\n${banner}\n\n`);
    } else {
      logger.info({ repository, model: result.modelPath, source: result.source }, "model weights ready");
    }
  }
}
