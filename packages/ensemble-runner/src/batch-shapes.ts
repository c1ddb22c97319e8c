/**
 * Tensors between models that batch and models that do not, as Triton's ensemble scheduler
 * passes them (core src/ensemble_scheduler/ensemble_scheduler.cc, ReshapeTensorDims): each
 * tensor remembers the batch size of the request that made it (0: a model without batching).
 * Going to a model that batches, a tensor from one that does not gets a batch of 1 in front
 * when its shape is the model's dims; going to a model that does not batch, a tensor of a batch
 * of 1 loses that dimension when its shape is not the model's dims. Otherwise it goes as it is.
 */
import type { ModelConfig } from "@trellis/protocol";
import type { Tensor } from "@trellis/stage";

/** Each config's input dims by name, read once per config (not once per request and step). */
const inputDimsByConfig = new WeakMap<ModelConfig, Map<string, number[]>>();

/** The dims `config` declares for input `name`; undefined when it declares no such input. */
export function inputDims(config: ModelConfig, name: string): number[] | undefined {
  let dims = inputDimsByConfig.get(config);
  if (!dims) {
    dims = new Map(config.input.map((c) => [c.name, c.dims.map(Number)]));
    inputDimsByConfig.set(config, dims);
  }
  return dims.get(name);
}

/** Triton's CompareDimsWithWildcard: the same rank, each dim equal or -1 on either side. */
function dimsAgree(config: readonly number[], dims: readonly number[]): boolean {
  return config.length === dims.length && config.every((d, i) => d === -1 || dims[i] === -1 || d === dims[i]);
}

/**
 * The shape `t` is given to a model whose config declares `dims` and batches or not, `batch`
 * being the batch size of the request that made `t` (0: made without batching).
 */
export function shapeFor(
  dims: readonly number[],
  batching: boolean,
  batch: number,
  shape: readonly number[],
): number[] {
  if (batching === (batch !== 0)) return [...shape];
  if (batching) return dimsAgree(dims, shape) ? [1, ...shape] : [...shape];
  return !dimsAgree(dims, shape) && batch === 1 ? shape.slice(1) : [...shape];
}

/** `t` with the shape a model of `dims` (batching or not) takes it in; the same data, never copied. */
export function reshapedFor(t: Tensor, dims: readonly number[] | undefined, batching: boolean, batch: number): Tensor {
  if (!dims) return t;
  const shape = shapeFor(dims, batching, batch, t.shape);
  if (shape.length === t.shape.length && shape.every((d, i) => d === t.shape[i])) return t;
  return { name: t.name, datatype: t.datatype, shape, data: t.data };
}
