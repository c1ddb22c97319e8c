/** Small in-test stages: plain objects implementing the Stage contract around a function. */
import { type ModelConfig, parseModelConfig } from "@trellis/protocol";
import { defineStage, type InferRequest, type Stage, type Tensor } from "@trellis/stage";

export const cfg = (text: string): ModelConfig => parseModelConfig(text);

export interface Call {
  request: InferRequest;
  signal: AbortSignal | undefined;
}

export interface FnStage extends Stage {
  calls: Call[];
  active: number;
  maxActive: number;
  closed: boolean;
}

type Fn = (inputs: Record<string, Tensor>, signal: AbortSignal | undefined) => Tensor[] | Promise<Tensor[]>;

/** A stage computing `fn` over its inputs (by name); records every call and its concurrency. */
export function fnStage(config: ModelConfig, fn: Fn, version = "1"): FnStage {
  const probe = { calls: [] as Call[], active: 0, maxActive: 0, closed: false };
  const inner = defineStage({
    config,
    version,
    async compute(request, options) {
      probe.calls.push({ request, signal: options?.signal });
      probe.active += 1;
      probe.maxActive = Math.max(probe.maxActive, probe.active);
      try {
        return await fn(Object.fromEntries(request.inputs.map((t) => [t.name, t])), options?.signal);
      } finally {
        probe.active -= 1;
      }
    },
    close: () => {
      probe.closed = true;
    },
  });
  return Object.assign(probe, inner);
}

/** Resolves when `signal` aborts; lets a test stage "work" until told to stop. */
export const untilAborted = (signal: AbortSignal | undefined): Promise<never> =>
  new Promise((_, reject) => {
    if (!signal) return;
    if (signal.aborted) reject(signal.reason);
    signal.addEventListener("abort", () => reject(signal.reason), { once: true });
  });

export function deferred<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** A one-input, one-output FP32 model config. */
export function unaryConfig(
  name: string,
  opts: { input?: string; output?: string; dims?: string; mbs?: number; datatype?: string } = {},
) {
  const dims = opts.dims ?? "[ 4 ]";
  const dt = opts.datatype ?? "TYPE_FP32";
  return cfg(`
    name: "${name}"
    backend: "typescript"
    max_batch_size: ${opts.mbs ?? 8}
    input [ { name: "${opts.input ?? "IN"}" data_type: ${dt} dims: ${dims} } ]
    output [ { name: "${opts.output ?? "OUT"}" data_type: ${dt} dims: ${dims} } ]
  `);
}

/** Elementwise map over an FP32 tensor. */
export const mapF32 = (t: Tensor, name: string, f: (x: number) => number): Tensor => ({
  name,
  datatype: "FP32",
  shape: [...t.shape],
  data: (t.data as Float32Array).map(f),
});
