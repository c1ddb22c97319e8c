/** What the HTTP/REST frontend is given (RestContext), and the one exchange each route answers. */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { ModelRegistry } from "@trellis/kserve";
import type { DecompressionBudget, SystemSharedMemory } from "@trellis/kserve/wire";
import type { BytesInFlight } from "../bytes-in-flight.js";
import { loggingWithheld } from "../infer.js";
import type { LogSettingsControl } from "../log-settings.js";
import type { ApiRestrictions } from "../restrictions.js";
import type { TraceControl } from "../trace-settings.js";
import { type BodyLimits, DEFAULT_HTTP_MAX_INPUT_BYTES, readBody, type Withheld } from "./body.js";

export interface RestContext {
  registry: ModelRegistry;
  serverName: string;
  serverVersion: string;
  extensions: string[];
  /** Failed requests at debug; error detail withheld from a client (paths, addresses) at warn. */
  logger: { debug(obj: object, msg?: string): void; warn?(obj: object, msg?: string): void };
  /** Largest request body accepted (default DEFAULT_HTTP_MAX_INPUT_BYTES). */
  maxInputBytes?: number;
  /**
   * Largest infer answer compressed when the client accepts gzip or deflate (default
   * DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES); a larger one goes uncompressed, as HTTP allows:
   * compressing costs about 35 ns of CPU per incompressible byte (gzip level 1), so a client asking for large
   * answers would otherwise spend the server's cores at will. 0: never compress.
   */
  maxCompressedAnswerBytes?: number;
  /** The server-wide bound on decompressed bodies held at once (--max-inflight-decompressed-bytes); past it, 429. */
  decompressionBudget?: DecompressionBudget;
  /** The server-wide bound on BYTES tensors in flight (--max-inflight-bytes-tensor-bytes); past it, 429. */
  bytesInFlight?: BytesInFlight;
  /** The logging extension (/v2/logging); without it the route answers 501. */
  logSettings?: LogSettingsControl;
  /** Endpoint groups that require a header (tritonserver's --http-restricted-api); refused with 403. */
  restrictions?: ApiRestrictions;
  /** The trace extension (/v2[/models/m]/trace/setting) and request tracing; without it tracing stays OFF. */
  tracing?: TraceControl;
  /** System shared memory regions clients may register (--allow-client-shm); without it, none can be. */
  sharedMemory?: SystemSharedMemory;
  /** Headers of infer requests whose names match become request parameters (--http-header-forward-pattern). */
  forwardHeaders?: RegExp;
  /**
   * The binary tensor extension's JSON header length travels in the content type, `<binaryMime><n>`,
   * both ways, instead of Inference-Header-Content-Length: as the SageMaker and Vertex AI endpoints
   * take it, those platforms passing bodies through without Triton's own header.
   */
  binaryMime?: string;
}

/** A REST frontend's context with what every route derives from it: body limits, the withheld-detail log. */
export class RestFrontend {
  readonly registry: ModelRegistry;
  readonly limits: BodyLimits;
  readonly withheld: Withheld;

  constructor(readonly ctx: RestContext) {
    this.registry = ctx.registry;
    this.limits = { maxBytes: ctx.maxInputBytes ?? DEFAULT_HTTP_MAX_INPUT_BYTES, budget: ctx.decompressionBudget };
    this.withheld = loggingWithheld(ctx.logger);
  }

  /** The request's body, within the frontend's limits. */
  body(req: IncomingMessage): Promise<Buffer> {
    return readBody(req, this.limits);
  }
}

/** One request a route answers: the frontend, the request and response, and the path's captured groups. */
export interface Exchange {
  rest: RestFrontend;
  req: IncomingMessage;
  res: ServerResponse;
  /** The route pattern's groups (index 1 on), each percent-decoded whole. */
  match: RegExpExecArray;
}
