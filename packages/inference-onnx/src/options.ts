/**
 * ONNX Runtime session options from config.pbtxt, with the parameter names
 * Triton's onnxruntime backend uses.
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { availableParallelism } from "node:os";
import { dirname, join } from "node:path";
import { type ModelConfig, ModelInstanceGroup_Kind } from "@trellis/protocol";
import { rateLimiterResources } from "@trellis/runtime";
import { Code, configInteger, configParameter, StageError } from "@trellis/stage";
import { groupInstanceCount, instanceGroupsOf, type RateLimiterResource } from "@trellis/stage/backend";

/** One session to create: which execution providers, which device. */
export interface InstancePlan {
  kind: "CPU" | "GPU";
  deviceId: number;
  executionProviders: string[];
  /** The group's rate_limiter: what the instance asks of the server's rate limiter. */
  rateLimiter: { resources: RateLimiterResource[]; priority: number };
}

const LEVELS: Record<string, string> = {
  disabled: "disabled",
  basic: "basic",
  extended: "extended",
  all: "all",
  // Triton's optimization.graph.level: -1 basic, 1 extended, 0 (default) all.
  "-1": "basic",
  "0": "all",
  "1": "extended",
};

const param = configParameter;
const positiveInt = configInteger;

/** The instances instance_group asks for: count per group (× GPUs listed for KIND_GPU); none: Triton's default, 2 on the CPU. */
export function planInstances(config: ModelConfig): InstancePlan[] {
  const groups = instanceGroupsOf(config);
  // Whatever the config names (a library caller may name no backend), this is an onnxruntime model.
  const asOnnxruntime = { ...config, backend: "onnxruntime" } as ModelConfig;
  const explicit = param(config, "execution_providers")
    ?.split(",")
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean);
  const gpuProviders = explicit ?? gpuAcceleratorProviders(config);
  const plans: InstancePlan[] = [];
  for (const g of groups) {
    // Triton's default without a count: 2 CPU instances (its default_cpu_instance_count), 1 per GPU.
    const count = groupInstanceCount(asOnnxruntime, g);
    const rateLimiter = rateLimiterResources(g.rateLimiter);
    if (g.kind === ModelInstanceGroup_Kind.GPU) {
      const gpus = g.gpus.length > 0 ? g.gpus : [0];
      for (const deviceId of gpus) {
        for (let i = 0; i < count; i++)
          plans.push({ kind: "GPU", deviceId, executionProviders: gpuProviders, rateLimiter });
      }
    } else {
      // KIND_AUTO and KIND_MODEL land on the CPU: this build has no GPU to pick automatically.
      for (let i = 0; i < count; i++)
        plans.push({ kind: "CPU", deviceId: 0, executionProviders: explicit ?? ["cpu"], rateLimiter });
    }
  }
  return plans;
}

/** Triton's ORT backend names for optimization.execution_accelerators.gpu_execution_accelerator. */
const GPU_ACCELERATORS = ["tensorrt", "cuda"] as const;

/**
 * The execution providers a GPU instance runs with, from Triton's
 * `optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }`:
 * TensorRT first with CUDA behind it for the nodes TensorRT does not take (Triton's
 * order), or CUDA alone. Asking for an accelerator this onnxruntime-node binary has no
 * provider library for fails the load here, naming it, instead of onnxruntime
 * falling back to the CPU without a word.
 */
function gpuAcceleratorProviders(config: ModelConfig): string[] {
  const asked = (config.optimization?.executionAccelerators?.gpuExecutionAccelerator ?? []).map((a) =>
    a.name.trim().toLowerCase(),
  );
  const unknown = asked.find((name) => !(GPU_ACCELERATORS as readonly string[]).includes(name));
  if (unknown !== undefined) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `gpu_execution_accelerator "${unknown}": expected one of ${GPU_ACCELERATORS.join(", ")}`,
    );
  }
  const providers = asked.includes("tensorrt") ? ["tensorrt", "cuda"] : ["cuda"];
  for (const name of new Set(asked)) {
    const provider = name === "tensorrt" ? providers : ["cuda"];
    const missing = provider.find((p) => !executionProviderInstalled(p));
    if (missing !== undefined) {
      throw new StageError(
        Code.Unavailable,
        config.name,
        `gpu_execution_accelerator "${name}": this onnxruntime-node has no ${missing} execution provider (libonnxruntime_providers_${missing}.so); install its GPU build (see @trellis/inference-onnx's README) or remove the accelerator from config.pbtxt`,
      );
    }
  }
  return providers;
}

/**
 * Whether onnxruntime-node's own folder holds the provider library for this execution
 * provider. Only Linux is known here; elsewhere onnxruntime says so itself at load.
 */
function executionProviderInstalled(provider: string): boolean {
  if (process.platform !== "linux" || provider === "cpu") return true;
  const dist = dirname(createRequire(import.meta.url).resolve("onnxruntime-node"));
  const library = `libonnxruntime_providers_${provider}.so`;
  return existsSync(join(dist, "..", "bin", "napi-v6", "linux", process.arch, library));
}

/** onnxruntime-node SessionOptions, as sent to a session worker. */
export type InstanceSessionOptions = {
  intraOpNumThreads: number;
  interOpNumThreads: number;
  executionMode: "sequential" | "parallel";
  graphOptimizationLevel: string;
  executionProviders: (string | { name: string; deviceId: number })[];
  extra: { session: Record<string, unknown> };
};

/**
 * SessionOptions for one instance. Defaults: the cores split between the
 * CPU instances for intra-op threads (one instance gets them all; more
 * would oversubscribe), one inter-op thread, sequential execution
 * (parallel mode measured 2× slower on this model), all graph optimisations.
 */
export function sessionOptions(config: ModelConfig, plan: InstancePlan, cpuInstances: number): InstanceSessionOptions {
  const intra =
    positiveInt(config, "intra_op_thread_count") ||
    Math.max(1, Math.floor(availableParallelism() / Math.max(1, cpuInstances)));
  const inter = positiveInt(config, "inter_op_thread_count") || 1;
  const modeParam = param(config, "execution_mode")?.toLowerCase();
  let executionMode: "sequential" | "parallel" = "sequential";
  if (modeParam === "1" || modeParam === "parallel") executionMode = "parallel";
  else if (modeParam !== undefined && modeParam !== "0" && modeParam !== "sequential") {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter execution_mode: expected sequential|parallel|0|1, got "${modeParam}"`,
    );
  }
  const levelParam =
    param(config, "graph_optimization_level")?.toLowerCase() ?? String(config.optimization?.graph?.level ?? 0);
  const graphOptimizationLevel = LEVELS[levelParam];
  if (!graphOptimizationLevel) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `graph optimization level "${levelParam}": expected disabled|basic|extended|all (or Triton's -1|0|1)`,
    );
  }
  const executionProviders = plan.executionProviders.map((ep) =>
    ep === "cuda" || ep === "tensorrt" ? { name: ep, deviceId: plan.deviceId } : ep,
  );
  return {
    intraOpNumThreads: intra,
    interOpNumThreads: inter,
    executionMode,
    graphOptimizationLevel,
    executionProviders,
    extra: { session: spinningEntries(config) },
  };
}

/**
 * ORT session config entries (under "session.") for two parameters:
 * `allow_spinning` (default true, ORT's own default): pool threads busy-wait
 * between the parallel loops of a run instead of sleeping, which saves a
 * futex wake per operator (measured: ResNet-50 at batch 1 in 38.5 ms
 * instead of 39-43 ms); `force_spinning_stop` (default true): they stop
 * spinning when the run returns, so between runs they leave the cores to
 * preprocessing, gRPC and the event loop (spinning on after a run cost the
 * server's concurrency-1 p50 about 6 ms, its preprocessing starved).
 */
function spinningEntries(config: ModelConfig): Record<string, unknown> {
  const spin = booleanParameter(config, "allow_spinning", true) ? "1" : "0";
  return {
    intra_op: { allow_spinning: spin },
    inter_op: { allow_spinning: spin },
    force_spinning_stop: booleanParameter(config, "force_spinning_stop", true) ? "1" : "0",
  };
}

/**
 * Parameter `exclusive_cpu`: "auto" (default), "true" or "false". An exclusive
 * instance's runs hold the process-wide CpuGate alone, so image decodes wait
 * for a run to end instead of slowing it (see @trellis/stage's CpuGate).
 * "auto" means: a CPU instance whose intra-op threads cover every core.
 */
export function exclusiveCpu(config: ModelConfig, plan: InstancePlan, intraOpThreads: number): boolean {
  const v = (configParameter(config, "exclusive_cpu") ?? "auto").toLowerCase();
  if (v === "true") return true;
  if (v === "false") return false;
  if (v !== "auto") {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter exclusive_cpu: expected auto, true or false, got "${v}"`,
    );
  }
  return plan.kind === "CPU" && intraOpThreads >= availableParallelism();
}

/**
 * Parameter `exclusive_cpu_max_wait_ms` (default 50): how long an exclusive
 * run waits for decodes in progress before it starts alongside them (a
 * 40-megapixel JPEG takes ~0.13 s to decode).
 */
export function exclusiveCpuMaxWaitMs(config: ModelConfig): number {
  return configInteger(config, "exclusive_cpu_max_wait_ms", 0) ?? 50;
}

/** A "true"/"false" parameter, `fallback` when absent. */
function booleanParameter(config: ModelConfig, key: string, fallback: boolean): boolean {
  const v = (configParameter(config, key) ?? String(fallback)).toLowerCase();
  if (v !== "true" && v !== "false") {
    throw new StageError(Code.InvalidArgument, config.name, `parameter ${key}: expected true or false, got "${v}"`);
  }
  return v === "true";
}
