/**
 * An execution that ended its instance: the process or thread running it died, or was stopped
 * because it gave no answer in time. Such a run costs a restart (or a whole timeout) rather than
 * an execution, so failure isolation treats it apart (see bisection.ts): it never runs a request
 * again once that request ended its instance alone, and refuses the same input for a while.
 */
import { Code, StageError } from "@trellis/stage";

/** How the run ended its instance: its process or thread exited, or its deadline passed and it was stopped. */
export type InstanceEnding = "exited" | "timed out";

/** A backend's error for an execution that ended its instance (throw it from execute/executeRequests). */
export class InstanceEndedError extends StageError {
  constructor(
    stage: string,
    message: string,
    readonly ending: InstanceEnding,
    code: Code = Code.Unavailable,
  ) {
    super(code, stage, message);
  }
}

/** Whether `err` says its execution ended its instance. */
export function endedInstance(err: unknown): err is InstanceEndedError {
  return err instanceof InstanceEndedError;
}
