/**
 * The control calls both KServe frontends answer (gRPC in grpc/service.ts, HTTP/REST in http/routes.ts):
 * the extension list, readiness, statistics lookup, shared memory, repository load/unload with
 * their parameters, trace and log settings. Written once here, so both answer with the same
 * messages and codes; each frontend only translates its wire (JSON, paths and status codes, or
 * protobuf messages and gRPC codes) to and from these calls. Values come in as the wire decoded
 * them (a JSON value, or a protobuf parameter's value: bigint, string, boolean, bytes) and are
 * checked here.
 */

import type {
  ModelIndexEntry,
  ModelLoadLimits,
  ModelLoadOptions,
  ModelRegistry,
  ModelRepositoryControl,
  ModelUnloadOptions,
} from "@trellis/kserve";
import {
  checkFileOverridePath,
  checkModelName,
  clientMessage,
  shownValue,
  tooManyLoadBytes,
  tooManyLoadFiles,
} from "@trellis/kserve";
import type { SharedMemoryRegion, SystemSharedMemory } from "@trellis/kserve/wire";
import type { Stage } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import { answerLogSettings, type LogSettings, type LogSettingsControl } from "./log-settings.js";
import { answerTraceSettings, type TraceControl, type TraceSettings } from "./trace-settings.js";
import {
  refuseClientSharedMemory,
  refuseSharedMemoryRegister,
  type SharedMemoryKind,
  sharedMemoryStatus,
} from "./unsupported.js";

export type { SharedMemoryKind } from "./unsupported.js";

// ---------------------------------------------------------------------------------------------
// Extensions

/** What a server has, which decides the extensions its metadata lists (see serverExtensions). */
export interface ServerAbilities {
  /** The classification parameter on requested outputs (the Trellis server's model runtime). */
  classification?: boolean;
  /** Sequence batching: sequence_id / sequence_start / sequence_end honoured. */
  sequence?: boolean;
  /** A model repository control: load, unload (with unload_dependents) and index. */
  repository?: boolean;
  /** Request priority and timeout honoured by a scheduler. */
  schedulePolicy?: boolean;
  /** The system shared memory calls (refused as Triton refuses them while client shm is off). */
  systemSharedMemory?: boolean;
  /** The CUDA shared memory calls, answered as Triton answers them without a region. */
  cudaSharedMemory?: boolean;
  /** A trace control (TraceSetting, request tracing). */
  trace?: boolean;
  /** A log settings control (LogSettings). */
  logging?: boolean;
}

/** Each of Triton's extensions in its metadata order, with the ability it needs (none: every server has it). */
const EXTENSION_NEEDS: readonly (readonly [string, keyof ServerAbilities | undefined])[] = [
  ["classification", "classification"],
  ["sequence", "sequence"],
  ["model_repository", "repository"],
  ["model_repository(unload_dependents)", "repository"],
  ["schedule_policy", "schedulePolicy"],
  ["model_configuration", undefined],
  ["system_shared_memory", "systemSharedMemory"],
  ["cuda_shared_memory", "cudaSharedMemory"],
  ["binary_tensor_data", undefined],
  // Request parameters reach the model (and forwarded headers join them).
  ["parameters", undefined],
  ["statistics", undefined],
  ["trace", "trace"],
  ["logging", "logging"],
];

/**
 * The extensions Triton's server metadata lists, always, in its order (core src/server.cc,
 * with statistics, trace and logging built in): what a server with every ability lists.
 */
export const TRITON_EXTENSIONS: readonly string[] = EXTENSION_NEEDS.map(([name]) => name);

/** The extensions a server with `has` implements, in Triton's order: clients probe them before using one. */
export function serverExtensions(has: ServerAbilities): string[] {
  return EXTENSION_NEEDS.filter(([, need]) => need === undefined || has[need] === true).map(([name]) => name);
}

// ---------------------------------------------------------------------------------------------
// Readiness and statistics

/** Server readiness: the registry's own answer, else every loaded stage ready. */
export async function serverReady(registry: ModelRegistry): Promise<boolean> {
  if (registry.isReady) return registry.isReady();
  const all = await Promise.all(registry.list().map((s) => s.isReady()));
  return all.every(Boolean);
}

/**
 * Whether `name` (`version`) is ready; a model or version the registry cannot find throws its
 * error (NOT_FOUND, or UNAVAILABLE), which HTTP answers with and gRPC reads as not ready.
 */
export async function modelReady(registry: ModelRegistry, name: string, version: string | undefined): Promise<boolean> {
  return registry.resolve(name, version || undefined).isReady();
}

/**
 * The stage whose statistics a request for `name` (and `version`) asks, refused as Triton's core
 * refuses it (src/tritonserver.cc TRITONSERVER_ServerModelStatistics): INVALID_ARGUMENT when
 * the model or the version has no ready version to report on.
 */
export function statisticsStage(registry: ModelRegistry, name: string, version: string | undefined): Stage {
  try {
    return registry.resolve(name, version || undefined);
  } catch (err) {
    // Which of Triton's two refusals: the model has no ready version, or not this one.
    let modelReady = false;
    if (version) {
      try {
        registry.resolve(name);
        modelReady = true;
      } catch {}
    }
    throw new StageError(
      Code.InvalidArgument,
      "",
      modelReady
        ? `requested model version is not available for model '${name}'`
        : `requested model '${name}' is not available`,
      { cause: err },
    );
  }
}

// ---------------------------------------------------------------------------------------------
// Shared memory

/** The regions a status call lists: every one, or the one named (NOT_FOUND when it is not registered). */
export function sharedMemoryRegions(
  regions: SystemSharedMemory | undefined,
  kind: SharedMemoryKind,
  name: string,
): SharedMemoryRegion[] {
  if (!regions || kind === "CUDA") return sharedMemoryStatus(kind, name);
  return regions.status(name);
}

/** What a register call names: the object's key, and where the region lies in it. */
export interface RegisterFields {
  key?: unknown;
  offset?: unknown;
  byteSize?: unknown;
}

const registerInvalid = (message: string) => new StageError(Code.InvalidArgument, "", `register request: ${message}`);

/** A byte count from either wire (a JSON number, or a protobuf uint64 as bigint). */
function byteCount(value: unknown, field: string): number {
  const n = typeof value === "bigint" && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
    throw registerInvalid(`'${field}' must be a byte count`);
  }
  return n;
}

/**
 * Registers region `name`. As Triton: with client shared memory off (no `regions`), register
 * is refused (UNIMPLEMENTED), CUDA's too; CUDA shared memory is never taken. `fields` are read
 * only once those checks pass (HTTP reads its body then).
 */
export async function registerSharedMemory(
  regions: SystemSharedMemory | undefined,
  kind: SharedMemoryKind,
  name: string,
  fields: () => RegisterFields | Promise<RegisterFields>,
): Promise<void> {
  if (!regions) refuseClientSharedMemory();
  if (kind === "CUDA") refuseSharedMemoryRegister(kind);
  const { key, offset, byteSize } = await fields();
  if (typeof key !== "string") throw registerInvalid("'key' must be a string");
  regions.register(name, key, byteCount(offset ?? 0, "offset"), byteCount(byteSize, "byte_size"));
}

/**
 * Unregisters region `name` (every region when it is empty); a name not registered is not an
 * error. Refused with client shared memory off, as register; no CUDA region is ever registered.
 */
export function unregisterSharedMemory(
  regions: SystemSharedMemory | undefined,
  kind: SharedMemoryKind,
  name: string,
): void {
  if (!regions) refuseClientSharedMemory();
  if (kind === "system") regions.unregister(name);
}

// ---------------------------------------------------------------------------------------------
// Model repository

/** The registry's repository control, or UNIMPLEMENTED on a server without one. */
export function repositoryOf(registry: ModelRegistry): ModelRepositoryControl {
  if (!registry.repository) {
    throw new StageError(Code.Unimplemented, "", "this server has no model repository control");
  }
  return registry.repository;
}

/** The repository's models; a load failure's reason says where the server looked: the client gets it without the paths. */
export async function repositoryIndex(registry: ModelRegistry, readyOnly: boolean): Promise<ModelIndexEntry[]> {
  const rows = await repositoryOf(registry).index(readyOnly);
  return rows.map((m) => ({ ...m, reason: m.reason && clientMessage(m.reason) }));
}

/** A repository request's parameters as the wire decoded them (JSON values, or protobuf parameters' values). */
export type RepositoryParameters = Record<string, unknown>;

/**
 * A load request's parameters, as Triton's: "config" (the model config as JSON text) and
 * "file:<path>" overrides (the file's content: `fileBytes` reads it as the wire carries bytes,
 * undefined when the value is not that). Other parameters are ignored. With `limits` (and the
 * model's `name` for the refusals), the files are counted before any is read, and their bytes
 * summed as they are.
 */
export function loadOptions(
  parameters: RepositoryParameters,
  fileBytes: (value: unknown) => Uint8Array | undefined,
  limits?: ModelLoadLimits,
  name = "",
): ModelLoadOptions {
  if (limits) {
    let count = 0;
    for (const key in parameters) if (key.startsWith("file:")) count++;
    if (count > limits.maxFiles) throw tooManyLoadFiles(name, count, limits.maxFiles);
  }
  let total = 0;
  const options: ModelLoadOptions = {};
  // Filled in place: a load may carry thousands of files (the registry bounds how many).
  const files: Record<string, Uint8Array> = {};
  for (const [key, value] of Object.entries(parameters)) {
    if (key.startsWith("file:")) {
      const path = key.slice("file:".length);
      checkFileOverridePath(path);
      const bytes = fileBytes(value);
      if (!bytes) {
        throw new StageError(
          Code.InvalidArgument,
          "",
          `load parameter '${key}' must be the file's content (bytes; base64 in JSON), got ${shownValue(value)}`,
        );
      }
      total += bytes.byteLength;
      if (limits && total > limits.maxBytes) throw tooManyLoadBytes(name, total, limits.maxBytes);
      files[path] = bytes;
      options.files = files;
    } else if (key === "config") {
      if (typeof value !== "string") {
        throw new StageError(
          Code.InvalidArgument,
          "",
          "load parameter 'config' must be a string (the model config as JSON)",
        );
      }
      options.config = value;
    }
  }
  return options;
}

/** An unload request's parameters: Triton's "unload_dependents", a boolean. */
export function unloadOptions(parameters: RepositoryParameters): ModelUnloadOptions {
  const flag = parameters.unload_dependents;
  if (flag === undefined) return {};
  if (typeof flag !== "boolean") {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `Unable to parse 'unload_dependents': expected a boolean, got ${shownValue(flag)}`,
    );
  }
  return { unloadDependents: flag };
}

/** Loads (or reloads) model `name` with the request's parameters (see loadOptions). */
export async function loadModel(
  registry: ModelRegistry,
  name: string,
  parameters: RepositoryParameters,
  fileBytes: (value: unknown) => Uint8Array | undefined,
): Promise<void> {
  checkModelName(name);
  const repository = repositoryOf(registry);
  await repository.load(name, loadOptions(parameters, fileBytes, repository.loadLimits, name));
}

/** Unloads model `name` with the request's parameters (see unloadOptions). */
export async function unloadModel(
  registry: ModelRegistry,
  name: string,
  parameters: RepositoryParameters,
): Promise<void> {
  checkModelName(name);
  const repository = repositoryOf(registry);
  await repository.unload(name, unloadOptions(parameters));
}

// ---------------------------------------------------------------------------------------------
// Trace and log settings

/**
 * A trace setting call: `changes` undefined (or empty) reads, else updates (a setting given an
 * empty list clears it). `clearModel`: an update naming a model and no setting clears all of the
 * model's own settings (the trace extension's POST with an empty object); trace_file is the
 * server's alone, so not among them.
 */
export function traceSetting(
  control: TraceControl | undefined,
  registry: ModelRegistry,
  model: string | undefined,
  changes: Record<string, string[]> | undefined,
  clearModel = false,
): TraceSettings {
  let asked = changes ?? {};
  if (model && clearModel && Object.keys(asked).length === 0 && control) {
    registry.resolve(model, "");
    asked = Object.fromEntries(
      Object.keys(control.settings(model))
        .filter((k) => k !== "trace_file")
        .map((k) => [k, []]),
    );
  }
  return answerTraceSettings(control, model, asked, registry);
}

/**
 * A log settings call: a read when `changes` is empty, else an update; each value a boolean,
 * number or string (or JSON's null, which the control answers for: log_file reads it as none).
 */
export function logSetting(control: LogSettingsControl | undefined, changes: Record<string, unknown>): LogSettings {
  for (const [key, value] of Object.entries(changes)) {
    if (typeof value === "object" && value !== null) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `log setting '${key}' must be a boolean, a number or a string, got ${shownValue(value)}`,
      );
    }
  }
  return answerLogSettings(control, changes as LogSettings);
}
