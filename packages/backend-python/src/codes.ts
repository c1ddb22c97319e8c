/**
 * Triton's error codes (pb_utils.TritonError's, TRITONSERVER_Error_Code's order) and the server's
 * codes, both ways: a model's `TritonError(msg, TritonError.NOT_FOUND)` reaches its client as
 * NOT_FOUND / 404, and a BLS callee's error reaches the model with Triton's code for it.
 */
import { Code } from "@trellis/stage";

const TO_CODE: readonly Code[] = [
  Code.Unknown, // UNKNOWN
  Code.Internal, // INTERNAL
  Code.NotFound, // NOT_FOUND
  Code.InvalidArgument, // INVALID_ARG
  Code.Unavailable, // UNAVAILABLE
  Code.Unimplemented, // UNSUPPORTED
  Code.AlreadyExists, // ALREADY_EXISTS
  Code.Canceled, // CANCELLED
];

/** The server's code for a TritonError code (anything unknown: INTERNAL). */
export function codeOfTriton(tritonCode: unknown): Code {
  return typeof tritonCode === "number" && Number.isInteger(tritonCode)
    ? (TO_CODE[tritonCode] ?? Code.Internal)
    : Code.Internal;
}

/** TritonError's code for a server code; a full queue (RESOURCE_EXHAUSTED) is UNAVAILABLE, as Triton says it. */
export function tritonCodeOf(code: Code): number {
  if (code === Code.ResourceExhausted || code === Code.DeadlineExceeded) return 4;
  const at = TO_CODE.indexOf(code);
  return Math.max(at, 0);
}
