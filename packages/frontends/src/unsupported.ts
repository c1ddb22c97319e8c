/**
 * Triton's shared-memory extensions where Trellis holds no region (CUDA shared
 * memory, and system shared memory without --allow-client-shm), answered the
 * same over gRPC and HTTP: reads say nothing is there; with client shared memory
 * off, registering and unregistering are refused as Triton refuses them
 * (UNIMPLEMENTED / 501, src/http_server.cc and src/grpc/grpc_server.cc), so
 * nothing is silently accepted and then ignored.
 */
import { Code, StageError } from "@trellis/stage";

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

/** Triton's words (src/common.h kClientShmDisabledErrorStr) for shared memory asked of a server without client shm. */
export const CLIENT_SHM_DISABLED =
  "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

/** Register or unregister of shared memory (system or CUDA) while client shared memory is off. */
export function refuseClientSharedMemory(): never {
  throw new StageError(Code.Unimplemented, "", CLIENT_SHM_DISABLED);
}
