/**
 * A foreign client: @grpc/grpc-js with our grpc_service.proto loaded at
 * runtime by @grpc/proto-loader, the way a user outside this repository
 * talks to a Trellis server (snake_case fields, int64 as numbers).
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { protoDir } from "./paths.js";

export interface GrpcJsTensor {
  name: string;
  datatype: string;
  shape: number[];
  parameters?: Record<string, unknown>;
}

export interface GrpcJsInferRequest {
  model_name: string;
  model_version?: string;
  id?: string;
  inputs: GrpcJsTensor[];
  outputs?: { name: string; parameters?: Record<string, unknown> }[];
  parameters?: Record<string, unknown>;
  raw_input_contents?: Buffer[];
}

export interface GrpcJsInferResponse {
  model_name: string;
  model_version: string;
  id: string;
  outputs: GrpcJsTensor[];
  parameters: Record<string, unknown>;
  raw_output_contents: Buffer[];
}

export interface GrpcJsModelMetadata {
  name: string;
  versions: string[];
  platform: string;
  inputs: GrpcJsTensor[];
  outputs: GrpcJsTensor[];
}

/** Promise wrappers for the KServe v2 calls tests make; failures reject with grpc-js's ServiceError. */
export interface GrpcJsInferenceClient {
  serverLive(): Promise<{ live: boolean }>;
  serverReady(): Promise<{ ready: boolean }>;
  modelReady(request: { name: string; version?: string }): Promise<{ ready: boolean }>;
  modelMetadata(request: { name: string; version?: string }): Promise<GrpcJsModelMetadata>;
  modelInfer(request: GrpcJsInferRequest): Promise<GrpcJsInferResponse>;
  /** A ModelStreamInfer stream: write requests, read answers (each with error_message and infer_response). */
  modelStreamInfer(): grpc.ClientDuplexStream<GrpcJsInferRequest, GrpcJsStreamResponse>;
  close(): void;
}

export interface GrpcJsStreamResponse {
  error_message: string;
  infer_response: GrpcJsInferResponse;
}

type Unary = (request: object, callback: (err: grpc.ServiceError | null, response: unknown) => void) => void;

let service: grpc.ServiceClientConstructor | undefined;

function inferenceService(): grpc.ServiceClientConstructor {
  if (!service) {
    const definition = protoLoader.loadSync("grpc_service.proto", {
      includeDirs: [protoDir],
      keepCase: true,
      longs: Number,
      defaults: true,
    });
    const pkg = grpc.loadPackageDefinition(definition) as unknown as {
      inference: { GRPCInferenceService: grpc.ServiceClientConstructor };
    };
    service = pkg.inference.GRPCInferenceService;
  }
  return service;
}

/** A grpc-js client of inference.GRPCInferenceService at `address` ("host:port"), insecure. */
export function grpcJsInferenceClient(address: string): GrpcJsInferenceClient {
  const client = new (inferenceService())(address, grpc.credentials.createInsecure());
  const call =
    <Req extends object, Res>(method: string) =>
    (request: Req): Promise<Res> =>
      new Promise((resolve, reject) =>
        (client[method] as Unary).call(client, request, (err, response) =>
          err ? reject(err) : resolve(response as Res),
        ),
      );
  return {
    serverLive: () => call<object, { live: boolean }>("ServerLive")({}),
    serverReady: () => call<object, { ready: boolean }>("ServerReady")({}),
    modelReady: call("ModelReady"),
    modelMetadata: call("ModelMetadata"),
    modelInfer: call("ModelInfer"),
    modelStreamInfer: () =>
      (client.ModelStreamInfer as () => grpc.ClientDuplexStream<GrpcJsInferRequest, GrpcJsStreamResponse>).call(client),
    close: () => client.close(),
  };
}

/** Sends `requests` on one ModelStreamInfer stream, half-closes it, and resolves with every answer once the server ends it. */
export function streamAll(
  client: GrpcJsInferenceClient,
  requests: GrpcJsInferRequest[],
): Promise<GrpcJsStreamResponse[]> {
  const stream = client.modelStreamInfer();
  const answers: GrpcJsStreamResponse[] = [];
  const done = new Promise<GrpcJsStreamResponse[]>((resolve, reject) => {
    stream.on("data", (a: GrpcJsStreamResponse) => answers.push(a));
    stream.on("end", () => resolve(answers));
    stream.on("error", reject);
  });
  for (const r of requests) stream.write(r);
  stream.end();
  return done;
}
