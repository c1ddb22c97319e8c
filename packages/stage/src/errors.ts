import { Code, ConnectError } from "@connectrpc/connect";

export { Code };

/**
 * An error raised by a stage. It is a ConnectError, so its code survives
 * every transport unchanged; `stage` names the model that raised it.
 */
export class StageError extends ConnectError {
  readonly stage: string;

  // ConnectError answers instanceof by shape; StageError and its subclasses use the prototype chain.
  static override [Symbol.hasInstance](v: unknown): boolean {
    // biome-ignore lint/complexity/noThisInStatic: `this` is the class instanceof asks about, a subclass too
    return v instanceof Error && Object.prototype.isPrototypeOf.call(this.prototype, v);
  }

  constructor(code: Code, stage: string, message: string, options?: { cause?: unknown }) {
    super(stage ? `${stage}: ${message}` : message, code, undefined, undefined, options?.cause);
    // ConnectError's constructor pins the prototype to ConnectError; restore ours.
    Object.setPrototypeOf(this, new.target.prototype);
    // `name` must stay "ConnectError": Connect recognises its errors by name and shape,
    // and sends any other error as INTERNAL. Pinned, so a subclass that sets its own
    // name fails at once instead of losing its code on the wire.
    Object.defineProperty(this, "name", { value: "ConnectError", writable: false, configurable: false });
    this.stage = stage;
  }
}

/** Shorthands for the codes stages raise most. */
export const invalidArgument = (stage: string, message: string) => new StageError(Code.InvalidArgument, stage, message);
export const notFound = (stage: string, message: string) => new StageError(Code.NotFound, stage, message);
export const unavailable = (stage: string, message: string) => new StageError(Code.Unavailable, stage, message);
export const resourceExhausted = (stage: string, message: string) =>
  new StageError(Code.ResourceExhausted, stage, message);
export const internal = (stage: string, message: string) => new StageError(Code.Internal, stage, message);

/**
 * Turns anything thrown into a ConnectError, keeping its code when it has
 * one. Unknown errors become INTERNAL so nothing leaves a stage untyped.
 */
export function toConnectError(err: unknown, stage = ""): ConnectError {
  if (err instanceof ConnectError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new StageError(Code.Internal, stage, message, { cause: err });
}

/** The protocol's wording of a Connect code, e.g. INVALID_ARGUMENT. */
export function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** How a run ended its instance: its process or thread exited, or its deadline passed and it was stopped. */
export type InstanceEnding = "exited" | "timed out";

/**
 * A backend's error for an execution that ended its instance: the process or thread running it
 * died, or was stopped because it gave no answer in time. Such a run costs a restart (or a whole
 * timeout) rather than an execution, so the runtime's failure isolation never bisects it, and
 * refuses for a while an input whose run alone ended the instance. Throw it from
 * `execute` / `executeRequests`.
 */
export class InstanceEndedError extends StageError {
  constructor(
    code: Code,
    stage: string,
    message: string,
    readonly ending: InstanceEnding,
    /**
     * The index, among the execution's requests, of the request the instance was working on when
     * it ended, where the backend can tell (a Python model reads its requests one at a time).
     * Failure isolation runs that request last: when every other one succeeds alone, it is found
     * without ending the instance a second time.
     */
    readonly suspect?: number,
  ) {
    super(code, stage, message);
  }
}

/** Whether `err` says its execution ended its instance. */
export function endedInstance(err: unknown): err is InstanceEndedError {
  return err instanceof InstanceEndedError;
}
