/**
 * Batch forming for the dynamic batcher: the key requests must share to merge, and which queued
 * requests make the next batch (preferred sizes, the queue delay, the quarantine lane's turn).
 */
import type { InferRequest } from "@trellis/stage";
import { nowNs } from "@trellis/stage";
import type { FailureIsolation } from "./isolation.js";
import type { Pending } from "./queue.js";

/** The next batch to run now (`lane`: a quarantined request, alone), the time to wait for more requests, or nothing queued. */
export type NextBatch = { batch: Pending[]; lane?: boolean } | { waitNs: number } | undefined;

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
