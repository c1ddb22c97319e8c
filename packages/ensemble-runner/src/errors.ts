/** How the ensemble names a failure: a step's own, or the request's signal firing. */
import { ConnectError } from "@connectrpc/connect";
import { Code, codeName, StageError } from "@trellis/stage";
import { type StepPlan, stepLabel } from "./plan.js";

/** A step's failure, re-raised by the ensemble with the step's own code. */
export class EnsembleStepError extends StageError {
  constructor(
    code: Code,
    ensemble: string,
    readonly step: number,
    readonly model: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(code, ensemble, `${stepLabel(step, model)}: ${codeName(code)}: ${message}`, options);
  }
}

/** Why a request stopped when its signal fired: the signal's code when it carries one. */
export function abortError(name: string, reason: unknown): StageError {
  if (reason instanceof ConnectError) return new StageError(reason.code, name, reason.rawMessage, { cause: reason });
  if (reason instanceof Error && reason.name === "TimeoutError") {
    return new StageError(Code.DeadlineExceeded, name, "deadline exceeded", { cause: reason });
  }
  return new StageError(Code.Canceled, name, "request cancelled", { cause: reason });
}

export function stepError(ensemble: string, step: Pick<StepPlan, "index" | "model">, err: unknown): EnsembleStepError {
  const ce = ConnectError.from(err);
  // Stage errors already start with the model's name; say it once.
  const prefix = `${step.model}: `;
  const text = ce.rawMessage.startsWith(prefix) ? ce.rawMessage.slice(prefix.length) : ce.rawMessage;
  return new EnsembleStepError(ce.code, ensemble, step.index, step.model, text, { cause: err });
}

/** A step's answer that lacks one of the outputs it declares. */
export const missingOutput = (output: string) => new StageError(Code.Internal, "", `returned no output "${output}"`);
