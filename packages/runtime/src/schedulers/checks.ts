/**
 * What every scheduler checks a request against before it queues or runs it: the model still
 * loaded, the config's checks, the items it carries (dim 0, against max_batch_size), an input that
 * ended an instance before, a cancellation already made.
 */
import { ConnectError } from "@connectrpc/connect";
import type { InferRequest } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import { requestRefusal, tritonMessages } from "@trellis/stage/backend";
import type { FailureIsolation } from "./dynamic/isolation.js";

/** A scheduler's checks, made once (see scheduledSize). */
export interface SchedulingChecks {
  name: string;
  maxBatchSize: number;
  validate?: ((request: InferRequest) => void) | undefined;
  isolation?: FailureIsolation | undefined;
}

/** A request's checks, in the order above: gives its items; throws what refuses it. */
export function scheduledSize(
  checks: SchedulingChecks,
  closed: boolean,
  request: InferRequest,
  signal?: AbortSignal,
): number {
  const { name } = checks;
  if (closed) throw new StageError(Code.Unavailable, name, "model is unloading");
  checks.validate?.(request);
  const size = requestSize(name, checks.maxBatchSize, request);
  const refusal = checks.isolation?.refusal(request);
  if (refusal) throw refusal;
  if (signal?.aborted) throw abortError(name, signal);
  return size;
}

/** Items this request carries, checking every input agrees on dim 0. */
export function requestSize(name: string, maxBatchSize: number, request: InferRequest): number {
  if (maxBatchSize <= 0) return 1;
  const first = request.inputs[0];
  if (!first) return 1;
  let size: number | undefined;
  for (const t of request.inputs) {
    if (t.shape.length === 0) throw requestRefusal(tritonMessages.noBatchDimension(request.id, name, t.name));
    const b = t.shape[0]!;
    if (size === undefined) size = b;
    else if (b !== size) {
      throw requestRefusal(tritonMessages.batchMismatch(request.id, name, t.name), `${b}, not ${size}`);
    }
  }
  if (size !== undefined && size > maxBatchSize) {
    throw requestRefusal(tritonMessages.batchTooLarge(request.id, name, maxBatchSize), `got ${size}`);
  }
  if (size === undefined || size < 1) {
    throw requestRefusal(`batch size must be at least 1 for '${name}', got ${size}`);
  }
  return size;
}

/** Why a request cancelled before it ran is refused: the signal's reason, or "cancelled while queued". */
export function abortError(name: string, signal: AbortSignal): ConnectError {
  const reason: unknown = signal.reason;
  if (reason instanceof ConnectError) return reason;
  const text = reason instanceof Error ? reason.message : reason === undefined ? "" : String(reason);
  return new StageError(Code.Canceled, name, `request cancelled while queued${text ? `: ${text}` : ""}`);
}
