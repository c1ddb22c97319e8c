import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type GrpcJsInferenceClient, grpcJsInferenceClient, protoDir } from "../src/index.js";

// A minimal grpc-js server of the same proto: enough to prove the client's
// wrappers send and decode real messages and surface gRPC errors.
let server: grpc.Server;
let client: GrpcJsInferenceClient;

beforeAll(async () => {
  const def = protoLoader.loadSync("grpc_service.proto", { includeDirs: [protoDir], keepCase: true, longs: Number });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    inference: { GRPCInferenceService: grpc.ServiceClientConstructor };
  };
  server = new grpc.Server();
  server.addService(pkg.inference.GRPCInferenceService.service, {
    ServerLive: (_call: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { live: true }),
    ModelMetadata: (call: grpc.ServerUnaryCall<{ name: string }, object>, cb: grpc.sendUnaryData<object>) =>
      cb({ code: grpc.status.NOT_FOUND, details: `no model ${call.request.name}` }),
    ModelInfer: (call: grpc.ServerUnaryCall<Record<string, unknown>, object>, cb: grpc.sendUnaryData<object>) => {
      const req = call.request as { model_name: string; id: string; inputs: object[]; raw_input_contents: Buffer[] };
      cb(null, {
        model_name: req.model_name,
        model_version: "7",
        id: req.id,
        outputs: req.inputs,
        raw_output_contents: req.raw_input_contents.map((b) => Buffer.from(b).reverse()),
      });
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  client = grpcJsInferenceClient(`127.0.0.1:${port}`);
});

afterAll(() => {
  client?.close();
  server?.forceShutdown();
});

describe("grpcJsInferenceClient", () => {
  it("sends requests and decodes responses with snake_case fields and numeric shapes", async () => {
    expect(await client.serverLive()).toEqual({ live: true });
    const res = await client.modelInfer({
      model_name: "m",
      id: "x1",
      inputs: [{ name: "IN", datatype: "UINT8", shape: [1, 3] }],
      raw_input_contents: [Buffer.from([1, 2, 3])],
    });
    expect(res.model_name).toBe("m");
    expect(res.model_version).toBe("7");
    expect(res.id).toBe("x1");
    expect(res.outputs.map((o) => [o.name, o.datatype, o.shape])).toEqual([["IN", "UINT8", [1, 3]]]);
    expect([...(res.raw_output_contents[0] as Buffer)]).toEqual([3, 2, 1]);
  });

  it("rejects with the server's gRPC status", async () => {
    const err = (await client.modelMetadata({ name: "nope" }).catch((e: unknown) => e)) as grpc.ServiceError;
    expect(err.code).toBe(grpc.status.NOT_FOUND);
    expect(err.details).toBe("no model nope");
  });
});
