/**
 * Triton's shared-memory extensions, which Trellis does not implement,
 * answered the same over gRPC and HTTP: reads say nothing is there,
 * registering is refused by name. tritonclient's examples unregister shared
 * memory first; that works, and nothing is silently accepted and then ignored.
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
    kind === "system"
      ? "system shared memory is not enabled on this server: send tensors in the request"
      : "CUDA shared memory is not supported by this server: send tensors in the request",
  );
}
