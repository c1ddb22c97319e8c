/** A stage module for the worker-instance tests, written to a temp folder, and its config. */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseModelConfig } from "@trellis/protocol";

const STAGE = import.meta.resolve("@trellis/stage");

/**
 * OUT = IN, THREAD = the thread's id. IN[0] = -1: an uncaught error in the thread (it crashes);
 * -2: StageError(FAILED_PRECONDITION); -3: never answers. Config parameter fail_factory: the
 * factory throws. The factory logs "loaded" with whether it was given `models`. A decoupled
 * config: IN[0] = N sends N responses, OUT = N, N-1, ..., 1.
 */
const MODULE = `import { threadId } from "node:worker_threads";
import { Code, defineStage, StageError } from "${STAGE}";
export function createStage({ config, version, logger, models }) {
  if (config.parameters.fail_factory) throw new StageError(Code.InvalidArgument, config.name, "factory refused");
  logger.info({ threadId, given: models !== undefined }, "loaded");
  if (config.modelTransactionPolicy?.decoupled) return defineStage({ config, version, async *computeStream(request) {
    for (let n = Number(request.inputs[0].data[0]); n > 0; n--) yield [{ name: "OUT", datatype: "FP32", shape: [1], data: Float32Array.of(n) }];
  } });
  return defineStage({ config, version, async compute(request) {
    const x = request.inputs[0];
    const v = Number(x.data[0]);
    if (v === -1) { setImmediate(() => { throw new Error("worker blew up"); }); return new Promise(() => {}); }
    if (v === -2) throw new StageError(Code.FailedPrecondition, config.name, "not now");
    if (v === -3) return new Promise(() => {});
    return [
      { name: "OUT", datatype: x.datatype, shape: x.shape, data: x.data },
      { name: "THREAD", datatype: "INT32", shape: [1], data: Int32Array.of(threadId) },
    ];
  } });
}
`;

export async function stageModule(): Promise<{ specifier: string; dir: string; remove: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-worker-"));
  const path = join(dir, "model.mjs");
  await writeFile(path, MODULE);
  return { specifier: pathToFileURL(path).href, dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

export const workerConfig = (name: string, extra = "") =>
  parseModelConfig(
    `name: "${name}"
backend: "typescript"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "THREAD" data_type: TYPE_INT32 dims: [ 1 ] } ]
${extra}`,
    "(test config)",
  );
