/**
 * The HTTP and gRPC frontends answer every control call alike (issue 19): the same message text,
 * and corresponding codes (400 ↔ INVALID_ARGUMENT, 404 ↔ NOT_FOUND, 500 ↔ INTERNAL,
 * 501 ↔ UNIMPLEMENTED, 503 ↔ UNAVAILABLE), since both call the control logic of @trellis/kserve.
 * Black-box: one server process, the same request sent to each port.
 */
import { rmSync, writeFileSync } from "node:fs";
import { Code, ConnectError, type createClient } from "@connectrpc/connect";
import type { GRPCInferenceService } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, explicitModels, grpcClientOf, makeRepository } from "./helpers.js";

let repo: string;
let server: ServerProcess;
let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
const shmKey = `/trellis-agree-${process.pid}`;
const shmFile = `/dev/shm${shmKey}`;

beforeAll(async () => {
  writeFileSync(shmFile, new Uint8Array(64));
  repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  server = await startServerProcess([...explicitModels(repo, "echo"), "--allow-client-shm", "true"]);
  grpc = grpcClientOf(server);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  rmSync(shmFile, { force: true });
  await removeDir(repo);
});

/**
 * The HTTP status that answers for a gRPC code, as Triton maps one to the other (http_server.cc
 * HttpCodeFromError: ALREADY_EXISTS is a 400 too).
 */
const STATUS_OF_CODE: Record<string, number> = {
  OK: 200,
  [Code[Code.InvalidArgument]]: 400,
  [Code[Code.AlreadyExists]]: 400,
  [Code[Code.NotFound]]: 404,
  [Code[Code.Internal]]: 500,
  [Code[Code.Unimplemented]]: 501,
  [Code[Code.Unavailable]]: 503,
};

interface HttpAnswer {
  status: number;
  message?: string;
}

interface Answer {
  code: string;
  message?: string;
}

async function http(path: string, body?: unknown): Promise<HttpAnswer> {
  const res = await fetch(`${server.http}${path}`, {
    method: body === undefined ? "GET" : "POST",
    ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
  });
  const text = await res.text();
  if (res.status === 200) return { status: 200 };
  return { status: res.status, message: text ? (JSON.parse(text) as { error?: string }).error : undefined };
}

async function rpc(call: Promise<unknown>): Promise<Answer> {
  try {
    await call;
    return { code: "OK" };
  } catch (err) {
    if (!(err instanceof ConnectError)) throw err;
    return { code: Code[err.code], message: err.rawMessage };
  }
}

/**
 * Both frontends' answers, expected to carry the same message with corresponding codes (each
 * difference reported, the test going on); returns the gRPC answer for further checks.
 */
async function agree(httpAnswer: Promise<HttpAnswer>, grpcAnswer: Promise<Answer>): Promise<Answer> {
  const [h, g] = await Promise.all([httpAnswer, grpcAnswer]);
  expect.soft({ status: h.status, message: h.message }).toEqual({ status: STATUS_OF_CODE[g.code], message: g.message });
  return g;
}

describe("HTTP and gRPC frontends agree on control calls", () => {
  it("shared memory register with bad arguments: the same refusal", async () => {
    // A key that names a path, not a shared memory object.
    const path = await agree(
      http("/v2/systemsharedmemory/region/r1/register", { key: "/a/b", offset: 0, byte_size: 8 }),
      rpc(grpc.systemSharedMemoryRegister({ name: "r1", key: "/a/b", offset: 0n, byteSize: 8n })),
    );
    expect(path.code).toBe("InvalidArgument");
    // An object that does not exist.
    const missing = await agree(
      http("/v2/systemsharedmemory/region/r1/register", { key: `${shmKey}-none`, byte_size: 8 }),
      rpc(grpc.systemSharedMemoryRegister({ name: "r1", key: `${shmKey}-none`, byteSize: 8n })),
    );
    // Triton's answer for an object it cannot open: INTERNAL "Unable to open shared memory region".
    expect(missing.code).toBe("Internal");
    expect(missing.message).toContain("Unable to open shared memory region");
    expect(missing.message).not.toContain("/dev/shm");
    // A byte size past what a byte count can be (2^63): refused for what it is on both.
    const huge = await agree(
      http("/v2/systemsharedmemory/region/r1/register", { key: shmKey, byte_size: 2 ** 63 }),
      rpc(grpc.systemSharedMemoryRegister({ name: "r1", key: shmKey, byteSize: 2n ** 63n })),
    );
    expect(huge).toEqual({ code: "InvalidArgument", message: "register request: 'byte_size' must be a byte count" });
    // Past the object's 64 bytes.
    const past = await agree(
      http("/v2/systemsharedmemory/region/r1/register", { key: shmKey, offset: 60, byte_size: 8 }),
      rpc(grpc.systemSharedMemoryRegister({ name: "r1", key: shmKey, offset: 60n, byteSize: 8n })),
    );
    expect(past.code).toBe("InvalidArgument");
    // CUDA shared memory: not supported, on either.
    const cuda = await agree(
      http("/v2/cudasharedmemory/region/c1/register", { raw_handle: { b64: "" }, device_id: 0, byte_size: 8 }),
      rpc(grpc.cudaSharedMemoryRegister({ name: "c1", rawHandle: new Uint8Array(0), deviceId: 0n, byteSize: 8n })),
    );
    expect(cuda.code).toBe("Unimplemented");
  });

  it("shared memory status: an unknown region is NOT_FOUND alike; a registered one listed alike", async () => {
    const unknown = await agree(
      http("/v2/systemsharedmemory/region/nope/status"),
      rpc(grpc.systemSharedMemoryStatus({ name: "nope" })),
    );
    expect(unknown).toEqual({ code: "NotFound", message: "Unable to find system shared memory region: 'nope'" });
    await agree(http("/v2/cudasharedmemory/region/nope/status"), rpc(grpc.cudaSharedMemoryStatus({ name: "nope" })));
    expect(
      (await http("/v2/systemsharedmemory/region/one/register", { key: shmKey, offset: 8, byte_size: 16 })).status,
    ).toBe(200);
    const overHttp = await (await fetch(`${server.http}/v2/systemsharedmemory/region/one/status`)).json();
    const overGrpc = (await grpc.systemSharedMemoryStatus({ name: "one" })).regions;
    expect(overHttp).toEqual([{ name: "one", key: shmKey, offset: 8, byte_size: 16 }]);
    expect(
      Object.values(overGrpc).map((r) => ({
        name: r.name,
        key: r.key,
        offset: Number(r.offset),
        byte_size: Number(r.byteSize),
      })),
    ).toEqual(overHttp);
    // Registering it again is refused alike; unregistering an unknown region is no error on either.
    const again = await agree(
      http("/v2/systemsharedmemory/region/one/register", { key: shmKey, byte_size: 8 }),
      rpc(grpc.systemSharedMemoryRegister({ name: "one", key: shmKey, byteSize: 8n })),
    );
    expect(again.message).toBe("shared memory region 'one' already in manager");
    await agree(
      http("/v2/systemsharedmemory/region/nope/unregister", {}),
      rpc(grpc.systemSharedMemoryUnregister({ name: "nope" })),
    );
    expect((await http("/v2/systemsharedmemory/region/one/unregister", {})).status).toBe(200);
  });

  it("load with bad parameters, unload of an unknown model: the same refusal", async () => {
    const config = await agree(
      http("/v2/repository/models/echo/load", { parameters: { config: 5 } }),
      rpc(
        grpc.repositoryModelLoad({
          modelName: "echo",
          parameters: { config: { parameterChoice: { case: "int64Param", value: 5n } } },
        }),
      ),
    );
    expect(config).toEqual({
      code: "InvalidArgument",
      message: "load parameter 'config' must be a string (the model config as JSON)",
    });
    const file = await agree(
      http("/v2/repository/models/echo/load", { parameters: { config: "{}", "file:1/model.onnx": 5 } }),
      rpc(
        grpc.repositoryModelLoad({
          modelName: "echo",
          parameters: {
            config: { parameterChoice: { case: "stringParam", value: "{}" } },
            "file:1/model.onnx": { parameterChoice: { case: "int64Param", value: 5n } },
          },
        }),
      ),
    );
    expect(file.code).toBe("InvalidArgument");
    const dependents = await agree(
      http("/v2/repository/models/echo/unload", { parameters: { unload_dependents: "yes" } }),
      rpc(
        grpc.repositoryModelUnload({
          modelName: "echo",
          parameters: { unload_dependents: { parameterChoice: { case: "stringParam", value: "yes" } } },
        }),
      ),
    );
    expect(dependents.code).toBe("InvalidArgument");
    const name = await agree(
      http("/v2/repository/models/a%01b/load", {}),
      rpc(grpc.repositoryModelLoad({ modelName: "a\u0001b" })),
    );
    expect(name.code).toBe("InvalidArgument");
    const unknown = await agree(
      http("/v2/repository/models/nope/unload", {}),
      rpc(grpc.repositoryModelUnload({ modelName: "nope" })),
    );
    expect(unknown.code).not.toBe("Internal");
    const notInRepository = await agree(
      http("/v2/repository/models/nope/load", {}),
      rpc(grpc.repositoryModelLoad({ modelName: "nope" })),
    );
    expect(notInRepository.code).toBe("Internal");
  });

  it("trace and log settings with bad values: the same refusal", async () => {
    const rate = await agree(
      http("/v2/trace/setting", { trace_rate: "often" }),
      rpc(grpc.traceSetting({ settings: { trace_rate: { value: ["often"] } } })),
    );
    expect(rate.code).toBe("InvalidArgument");
    const level = await agree(
      http("/v2/trace/setting", { trace_level: ["LOUD"] }),
      rpc(grpc.traceSetting({ settings: { trace_level: { value: ["LOUD"] } } })),
    );
    expect(level.code).toBe("InvalidArgument");
    const model = await agree(
      http("/v2/models/nope/trace/setting", { trace_rate: "5" }),
      rpc(grpc.traceSetting({ modelName: "nope", settings: { trace_rate: { value: ["5"] } } })),
    );
    expect(model.code).toBe("NotFound");
    const verbose = await agree(
      http("/v2/logging", { log_verbose_level: "loud" }),
      rpc(
        grpc.logSettings({
          settings: { log_verbose_level: { parameterChoice: { case: "stringParam", value: "loud" } } },
        }),
      ),
    );
    expect(verbose.code).toBe("InvalidArgument");
    const info = await agree(
      http("/v2/logging", { log_info: 3 }),
      rpc(grpc.logSettings({ settings: { log_info: { parameterChoice: { case: "uint32Param", value: 3 } } } })),
    );
    expect(info.code).toBe("InvalidArgument");
    const unknown = await agree(
      http("/v2/logging", { log_colour: true }),
      rpc(grpc.logSettings({ settings: { log_colour: { parameterChoice: { case: "boolParam", value: true } } } })),
    );
    expect(unknown.code).toBe("InvalidArgument");
  });

  it("model ready: one answer from the control logic, read by each wire as Triton's clients expect", async () => {
    expect(await http("/v2/models/echo/ready")).toEqual({ status: 200 });
    expect((await grpc.modelReady({ name: "echo" })).ready).toBe(true);
    // HTTP answers an unknown model with its error (Triton's HandleModelReady); gRPC's ModelReady
    // answers ready: false, as tritonclient's is_model_ready pollers expect (qa/L0_lifecycle).
    expect(await http("/v2/models/nope/ready")).toEqual({
      status: 404,
      message: "Request for unknown model: 'nope' is not found",
    });
    expect((await grpc.modelReady({ name: "nope" })).ready).toBe(false);
    expect(await http("/v2/models/echo/versions/7/ready")).toEqual({
      status: 404,
      message: "Request for unknown model: 'echo' version 7 is not found",
    });
    expect((await grpc.modelReady({ name: "echo", version: "7" })).ready).toBe(false);
  });
});
