/** Assertions on failures, shared by the packages' tests. */

/**
 * The error `promise` rejects with, after checking that it is an instance of
 * `type`; throws (failing the test) if the promise resolves or rejects with
 * anything else.
 */
export async function rejectionOf<E extends Error>(
  promise: Promise<unknown>,
  type: abstract new (...args: never[]) => E,
): Promise<E> {
  const outcome = await promise.then(
    (value: unknown) => ({ rejected: false as const, value }),
    (error: unknown) => ({ rejected: true as const, error }),
  );
  if (!outcome.rejected) throw new Error(`expected a rejection with ${type.name}, but it resolved`);
  if (outcome.error instanceof type) return outcome.error;
  const got =
    outcome.error instanceof Error ? `${outcome.error.name}: ${outcome.error.message}` : String(outcome.error);
  throw new Error(`expected a rejection with ${type.name}, got ${got}`);
}
