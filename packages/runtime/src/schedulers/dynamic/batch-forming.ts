/**
 * Batch forming for the dynamic batcher: the items a request carries (dim 0, checked against
 * max_batch_size), the key requests must share to merge, and which queued requests make the next
 * batch (preferred sizes, the queue delay, the quarantine lane's turn).
 */
import type { InferRequest } from "@trellis/stage";
import { Code, nowNs, StageError } from "@trellis/stage";
import { requestRefusal, tritonMessages } from "@trellis/stage/backend";
import type { FailureIsolation } from "./isolation.js";
import { abortError, type Pending } from "./queue.js";

/** What a scheduler checks a request against before it queues or runs it (see scheduledSize); made once. */
export interface SchedulingChecks {
  name: string;
  maxBatchSize: number;
  validate?: ((request: InferRequest) => void) | undefined;
  isolation?: FailureIsolation | undefined;
}

/**
 * A request's checks before any scheduler takes it, the same for every one: the model still
 * loaded, its checks, its items (dim 0), an input that ended an instance before refused, a
 * cancellation already made. Gives its items; throws what refuses it.
 */
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

/** The next batch to run now (`lane`: a quarantined request, alone), the time to wait for more requests, or nothing queued. */
export type NextBatch = { batch: Pending[]; lane?: boolean } | { waitNs: number } | undefined;

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

/** Requests merge only when every input has the same name, datatype and non-batch dims. */
export function batchKey(batching: boolean, request: InferRequest): string {
  if (!batching) return "";
  return request.inputs
    .map((t) => `${t.name}\u0000${t.datatype}\u0000${t.shape.slice(1).join(",")}`)
    .sort()
    .join("\u0001");
}

/**
 * The next batch to run now, the time to wait for more requests, or nothing queued, from the
 * `queued` requests in order. A quarantined request (isolation.ts) joins no batch: it runs
 * alone, on the lane's turn. `batching`: requests merge; `delayNs`: how long a batch short of a
 * preferred size waits for more.
 */
export function formBatch(
  queued: Iterable<Pending>,
  batching: boolean,
  maxBatchSize: number,
  preferred: Set<number>,
  delayNs: number,
  isolation: FailureIsolation | undefined,
): NextBatch {
  const batch: Pending[] = [];
  let total = 0;
  let bestPreferred = 0;
  let full = false;
  let quarantined: Pending | undefined;
  for (const p of queued) {
    if (isolation && (p.deferred || (batching && isolation.isSuspect(p.request)))) {
      quarantined ??= p;
      continue;
    }
    if (batch.length === 0) {
      batch.push(p);
      total = p.size;
      if (!batching) return { batch };
    } else if (p.key !== batch[0]!.key || total + p.size > maxBatchSize) {
      // The batch cannot grow past this request without reordering the queue.
      full = true;
      break;
    } else {
      batch.push(p);
      total += p.size;
    }
    if (preferred.has(total)) bestPreferred = batch.length;
    if (total === maxBatchSize) {
      full = true;
      break;
    }
  }
  if (quarantined && isolation?.laneTurn()) return { batch: [quarantined], lane: true };
  if (batch.length === 0) return quarantined && isolation ? { waitNs: isolation.laneWaitNs() } : undefined;
  if (total === maxBatchSize) return { batch };
  if (bestPreferred > 0) return { batch: batch.slice(0, bestPreferred) };
  if (full) return { batch };
  const oldest = Math.min(...batch.map((p) => p.enqueuedNs));
  const waitNs = oldest + delayNs - nowNs();
  return waitNs <= 0 ? { batch } : { waitNs };
}
