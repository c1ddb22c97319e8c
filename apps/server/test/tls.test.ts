/**
 * gRPC over TLS, as tritonserver's --grpc-use-ssl / --grpc-use-ssl-mutual
 * flags set it up, checked with a C-core client (grpcio, as tritonclient.grpc
 * with ssl=True); and ensemble steps reached over https:// --endpoints.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create, fromJson, toJson } from "@bufbuild/protobuf";
import { ModelInferRequestSchema, ModelInferResponseSchema } from "@trellis/protocol";
import {
  type PythonGrpcCall,
  pythonGrpcCalls,
  pythonGrpcRequired,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
  TLS_CERT_PATH,
  TLS_KEY_PATH,
} from "@trellis/testing";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CHAIN_CONFIG, echoConfig, floats, makeRepository } from "./helpers.js";

const f32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);

const inferCall = (model: string, input: string): PythonGrpcCall => ({
  method: "ModelInfer",
  request: toJson(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: model,
      inputs: [{ name: input, datatype: "FP32", shape: [1n, 4n] }],
      rawInputContents: [f32([1, 2, 3, 4])],
    }),
  ),
});

const outputValues = (response: unknown) => [
  ...floats(fromJson(ModelInferResponseSchema, response as never).rawOutputContents[0] as Uint8Array),
];

let repo: string;
const servers: ServerProcess[] = [];
const start = async (args: string[]) => {
  const server = await startServerProcess(["--model-repository", repo, ...args]);
  servers.push(server);
  return server;
};

beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    chain: { config: CHAIN_CONFIG },
  });
});
afterEach(async () => {
  for (const s of servers.splice(0)) expect(await s.stop()).toBe(0);
});
afterAll(() => removeDir(repo));

const TLS_FLAGS = ["--grpc-use-ssl", "--grpc-server-cert", TLS_CERT_PATH, "--grpc-server-key", TLS_KEY_PATH];

describe.runIf(pythonGrpcRequired())("gRPC over TLS, with a C-core client", () => {
  it("--grpc-use-ssl: serves a client that trusts its CA, not a cleartext one", async () => {
    const server = await start(TLS_FLAGS);
    expect(server.grpc).toMatch(/^https:/);
    expect(server.logs.find((l) => l.msg === "listening" && l.protocol === "grpc")?.tls).toBe(true);
    const address = `127.0.0.1:${server.grpcPort}`;
    const [live, infer] = await pythonGrpcCalls(address, [{ method: "ServerLive" }, inferCall("chain", "IN")], {
      rootCert: TLS_CERT_PATH,
    });
    expect(live?.response).toEqual({ live: true });
    expect(outputValues(infer?.response)).toEqual([10, 20, 30, 40]);
    const [cleartext] = await pythonGrpcCalls(address, [{ method: "ServerLive", timeout: 5 }]);
    expect(cleartext?.error?.code).toBe("UNAVAILABLE");
  });

  it("--grpc-use-ssl-mutual: serves only clients presenting a certificate that chains to --grpc-root-cert", async () => {
    const server = await start([...TLS_FLAGS, "--grpc-use-ssl-mutual", "--grpc-root-cert", TLS_CERT_PATH]);
    const address = `127.0.0.1:${server.grpcPort}`;
    const [withCert] = await pythonGrpcCalls(address, [inferCall("echo10", "INPUT")], {
      rootCert: TLS_CERT_PATH,
      cert: TLS_CERT_PATH,
      key: TLS_KEY_PATH,
    });
    expect(outputValues(withCert?.response)).toEqual([10, 20, 30, 40]);
    const [without] = await pythonGrpcCalls(address, [{ method: "ServerLive", timeout: 5 }], {
      rootCert: TLS_CERT_PATH,
    });
    expect(without?.error?.code).toBe("UNAVAILABLE");
  });
});

describe("TLS set-up", () => {
  it("reaches https:// --endpoints through --endpoints-root-cert; without it the ensemble says why it cannot load", async () => {
    const steps = await start(["--load-model", "echo", "--model-control-mode", "explicit", ...TLS_FLAGS]);
    const endpoints = join(repo, `endpoints-${steps.grpcPort}.json`);
    await writeFile(endpoints, JSON.stringify({ echo: steps.grpc }));
    const explicit = ["--model-control-mode", "explicit", "--load-model", "chain", "--endpoints", endpoints];

    const front = await start([...explicit, "--endpoints-root-cert", TLS_CERT_PATH]);
    const res = await fetch(`${front.http}/v2/models/chain/infer`, {
      method: "POST",
      body: JSON.stringify({ inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { outputs: { data: number[] }[] }).outputs[0]?.data).toEqual([10, 20, 30, 40]);

    // It serves on, not ready, with the failed model listed (as Triton's --exit-on-error=false).
    const untrusting = await start([...explicit, "--exit-on-error=false"]);
    const index = (await (
      await fetch(`${untrusting.http}/v2/repository/index`, { method: "POST", body: "{}" })
    ).json()) as { name: string; state?: string; reason?: string }[];
    const chain = index.find((m) => m.name === "chain");
    expect(chain?.state).toBe("UNAVAILABLE");
    expect(chain?.reason).toMatch(/certificate/i);
  });

  it("refuses to start without the files TLS needs, saying which", async () => {
    const missing = await startupRefusal(["--model-repository", repo, "--grpc-use-ssl"]);
    expect(String(missing)).toContain("trellis-server: --grpc-server-cert is required with --grpc-use-ssl");
    const unreadable = await startupRefusal([
      "--model-repository",
      repo,
      ...TLS_FLAGS.slice(0, 3),
      "--grpc-server-key",
      "/nonexistent/key.pem",
    ]);
    expect(String(unreadable)).toMatch(/--grpc-server-key \/nonexistent\/key\.pem: ENOENT/);
  });
});
