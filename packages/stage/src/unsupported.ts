/**
 * Triton's shared-memory and trace extensions, which Trellis does not
 * implement, answered the same over gRPC and HTTP: reads say nothing is
 * there, changes that would need them are refused by name. tritonclient's
 * examples unregister shared memory first and read trace settings; those
 * work, and nothing is silently accepted and then ignored.
 */
import { Code, StageError } from "./errors.js";

export type SharedMemoryKind = "system" | "CUDA";

/** No region is ever registered: the list is empty, and a named region is not found. */
export function sharedMemoryStatus(kind: SharedMemoryKind, region: string): [] {
  if (region) throw new StageError(Code.NotFound, "", `Unable to find ${kind} shared memory region: '${region}'`);
  return [];
}

export function refuseSharedMemoryRegister(kind: SharedMemoryKind): never {
  throw new StageError(
    Code.Unimplemented,
    "",
    `${kind} shared memory is not supported by this server: send tensors in the request`,
  );
}

/** The only trace setting there is. */
const TRACE_SETTINGS: Readonly<Record<string, string[]>> = { trace_level: ["OFF"] };

/** Trace settings: reading, or setting trace_level to OFF (or clearing it), answers them; anything else is refused. */
export function answerTraceSettings(changes: Record<string, string[]>): Record<string, string[]> {
  for (const [key, value] of Object.entries(changes)) {
    const off = key === "trace_level" && value.every((v) => v === "OFF");
    if (!off) throw new StageError(Code.Unimplemented, "", `tracing is not supported by this server (setting ${key})`);
  }
  return { ...TRACE_SETTINGS };
}
