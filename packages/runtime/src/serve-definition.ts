/**
 * A stage package's definition as a ready Stage, for a pipeline of one's own: the same model
 * runtime the repository loader gives it (request checks, dynamic batching, instances as the
 * config says, statistics), without a server.
 */
import type { StageDefinition, StageLogger } from "@trellis/stage";
import {
  createModelRuntime,
  definitionBackend,
  instanceCount,
  type ModelRuntime,
  type ModelRuntimeOptions,
} from "./model-runtime.js";
import type { BatchingStrategy } from "./schedulers/dynamic/batcher.js";

export interface ServeDefinitionOptions {
  /** `<repository>/<model>`: where sequence_batching's initial_state files are read. */
  modelDir?: string;
  /** The dynamic batcher's strategy; default: the config's parameter dynamic_batching_strategy, else "delay" (Triton's). */
  strategy?: BatchingStrategy;
  /** A queue bound for a config that sets no max_queue_size; 0 or absent: none. */
  defaultMaxQueueSize?: number;
  logger?: StageLogger;
}

/**
 * How many executions a TypeScript definition runs at once, as Triton would: instance_group's
 * count when the config has instance_group or dynamic_batching (one instance by default, so
 * batches form); with neither, as many as arrive (the stage bounds its own work).
 */
export function definitionInstances(definition: StageDefinition): number {
  const { config } = definition;
  const counted = config.instanceGroup.length > 0 || config.schedulingChoice.case === "dynamicBatching";
  return definition.instances ?? (counted ? instanceCount(config) : Number.POSITIVE_INFINITY);
}

/**
 * `definition` served by the model runtime: a Stage that checks each request against the
 * config, batches as its dynamic_batching says and runs on its instances. Closing it closes the
 * definition; if making it fails, the definition is closed too.
 */
export function serveDefinition(
  definition: StageDefinition,
  options: ServeDefinitionOptions = {},
): Promise<ModelRuntime> {
  const runtimeOptions: ModelRuntimeOptions = {
    config: definition.config,
    version: definition.version ?? "1",
    backend: definitionBackend(definition, definitionInstances(definition)),
    ...options,
  };
  return createModelRuntime(runtimeOptions);
}
