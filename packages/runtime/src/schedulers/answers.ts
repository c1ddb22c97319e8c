/**
 * A batch's answers, request by request: each request's response from its outcome, holding the
 * outputs it asked for and, within a batch of several, only its own rows.
 */
import type { ConnectError } from "@connectrpc/connect";
import type { InferRequest, InferResponse, Parameters, RequestOutcome } from "@trellis/stage";
import { Code, formatShape, StageError } from "@trellis/stage";
import { pickOutputs, toConnectError } from "@trellis/stage/backend";

/**
 * A request's response from its outcome: the outputs it asked for and, answered within a batch
 * of several, only its own rows (dim 0 = its `size`), never another request's. `name` and
 * `version` are the model's, `maxBatchSize` its config's.
 */
export function answerOf(
  name: string,
  version: string,
  maxBatchSize: number,
  request: InferRequest,
  size: number,
  outcome: RequestOutcome,
  shared: boolean,
): InferResponse | ConnectError {
  if (outcome instanceof Error) return toConnectError(outcome, name);
  try {
    if (shared && maxBatchSize > 0) {
      const wrong = outcome.find((t) => t.shape[0] !== size);
      if (wrong) {
        throw new StageError(
          Code.Internal,
          name,
          `output ${wrong.name}: a request of ${size} produced dim 0 = ${wrong.shape[0]} (shape ${formatShape(wrong.shape)})`,
        );
      }
    }
    // The request was checked against the config: an output it asks for and lacks is the model's fault.
    const outputs = pickOutputs(name, request, outcome, true);
    // A backend may give the response's parameters on its outputs (a Python model's InferenceResponse(parameters=…)).
    const { parameters } = outcome as { parameters?: Parameters };
    return {
      id: request.id,
      modelName: name,
      modelVersion: version,
      outputs,
      ...(parameters ? { parameters } : {}),
    };
  } catch (err) {
    return toConnectError(err, name);
  }
}
