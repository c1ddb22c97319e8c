/**
 * The tracing interceptor: a traced request's start and end as Triton stamps them
 * (REQUEST_START, REQUEST_END), its inputs as queued and its outputs as the model gave them
 * (trace level TENSORS). The scheduler stamps the queue and compute times in between.
 */

import type { InferRequest } from "@trellis/stage";
import { type InferResponse, nowNs, type RequestTrace } from "@trellis/stage";
import type { ModelInterceptor } from "./chain.js";

/** A traced request's start: its timestamp and (trace level TENSORS) its inputs as queued. */
function traceRequestStart(trace: RequestTrace, request: InferRequest): void {
  trace.stamp("REQUEST_START", nowNs());
  for (const input of request.inputs) trace.tensor("TENSOR_QUEUE_INPUT", input);
}

/** A traced response's outputs as the model gave them; returns the response. */
function traceOutputs(trace: RequestTrace, response: InferResponse): InferResponse {
  for (const output of response.outputs) trace.tensor("TENSOR_BACKEND_OUTPUT", output);
  return response;
}

export const tracingInterceptor: ModelInterceptor = {
  name: "trace",
  infer: (next) => async (request, options) => {
    const trace = options?.trace;
    if (!trace) return next(request, options);
    traceRequestStart(trace, request);
    try {
      return traceOutputs(trace, await next(request, options));
    } finally {
      trace.stamp("REQUEST_END", nowNs());
    }
  },
  inferStream: (next) =>
    async function* (request, options) {
      const trace = options?.trace;
      if (!trace) return yield* next(request, options);
      traceRequestStart(trace, request);
      try {
        for await (const response of next(request, options)) yield traceOutputs(trace, response);
      } finally {
        trace.stamp("REQUEST_END", nowNs());
      }
    },
};
