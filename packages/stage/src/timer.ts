/** Node's timers hold at most 2^31-1 ms (24.8 days); a longer delay fires at once, with a TimeoutOverflowWarning. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * A timer that calls `fire` after `ms`, or none when `ms` is longer than a
 * timer can hold: a client's deadline that far off is no deadline, not an
 * immediate one.
 */
export function deadlineTimer(ms: number, fire: () => void): NodeJS.Timeout | undefined {
  return ms <= MAX_TIMER_MS ? setTimeout(fire, ms) : undefined;
}
