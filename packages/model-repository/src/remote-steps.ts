/**
 * An ensemble's remote step (--endpoints) that does not answer yet: in a split deployment the
 * services start in any order, so the front may come up before its steps. Connecting is tried
 * again until the step answers; meanwhile the ensemble stays loading (not ready, nothing
 * failed), and it loads, and turns ready, once its steps answer.
 */
import { Code, type Stage, StageError, type StageLogger } from "@trellis/stage";

/**
 * Codes of a connection that may succeed later: the step's server is not reachable (not
 * started, its Service has no endpoint yet: UNAVAILABLE), does not answer in time
 * (DEADLINE_EXCEEDED), or is up without the model loaded yet (NOT_FOUND).
 */
const NOT_YET: ReadonlySet<Code> = new Set([Code.Unavailable, Code.DeadlineExceeded, Code.NotFound]);

/**
 * Node's (OpenSSL's) codes for a TLS handshake that failed: an untrusted or expired certificate,
 * a name mismatch, TLS spoken to a cleartext port. Waiting does not fix them: reported at once.
 */
const TLS_FAILURE = /CERT|SELF_SIGNED|UNABLE_TO_|^ERR_TLS_|^ERR_SSL_|^EPROTO$/;

function tlsFailure(err: unknown): boolean {
  const seen = new Set<unknown>();
  for (let e = err; e instanceof Error && !seen.has(e); e = (e as { cause?: unknown }).cause) {
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && TLS_FAILURE.test(code)) return true;
  }
  return false;
}

/** A failure that may pass by waiting; anything else (TLS refused, a bad config) is final. */
const mayPass = (err: unknown): err is StageError =>
  err instanceof StageError && NOT_YET.has(err.code) && !tlsFailure(err);

export const REMOTE_RETRY_FIRST_MS = 250;
export const REMOTE_RETRY_MAX_MS = 5_000;

/**
 * Connects with `connect` until it succeeds, waiting between tries (from REMOTE_RETRY_FIRST_MS,
 * doubling up to REMOTE_RETRY_MAX_MS). The first failure and the eventual success are logged
 * once each, not every try. Rejects with a failure that cannot pass by waiting, or when `signal`
 * aborts (the server is shutting down).
 */
export async function connectWhenReachable(
  connect: () => Promise<Stage>,
  step: string,
  logger: StageLogger,
  signal: AbortSignal,
): Promise<Stage> {
  let waitMs = REMOTE_RETRY_FIRST_MS;
  let tries = 0;
  for (;;) {
    if (signal.aborted) throw stopped(step);
    try {
      const stage = await connect();
      if (tries > 0) logger.info({ model: step, tries: tries + 1 }, "remote step answering: loading what uses it");
      return stage;
    } catch (err) {
      if (!mayPass(err)) throw err;
      if (tries === 0) {
        logger.warn(
          { model: step, reason: err.rawMessage },
          "remote step not answering yet: what uses it stays loading, not ready, until it does",
        );
      }
    }
    tries++;
    await pause(waitMs, signal);
    waitMs = Math.min(waitMs * 2, REMOTE_RETRY_MAX_MS);
  }
}

function stopped(step: string): StageError {
  return new StageError(Code.Unavailable, step, `remote model ${step}: no longer waited for, the server is stopping`);
}

/** Waits `ms`, or less if `signal` aborts first. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
