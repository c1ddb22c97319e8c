/**
 * The control logic both frontends share (src/control.ts): the extension list a server
 * advertises for what it has, shared memory, load/unload parameters, readiness, trace and log
 * settings. Unit-level through the real pieces (a shared memory folder on disk, a stage
 * registry), and black-box through a lone stage served by listenStage over real gRPC.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { type ModelRegistry, stageRegistry } from "@trellis/kserve";
import { SystemSharedMemory } from "@trellis/kserve/wire";
import { GRPCInferenceService } from "@trellis/protocol";
import { Code, type StageError } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  loadOptions,
  logSetting,
  modelReady,
  registerSharedMemory,
  serverExtensions,
  sharedMemoryRegions,
  TRITON_EXTENSIONS,
  traceSetting,
  unloadOptions,
  unregisterSharedMemory,
} from "../src/control.js";
import { listenStage } from "../src/grpc/serve.js";
import type { LogSettings } from "../src/log-settings.js";
import type { TraceSettings } from "../src/trace-settings.js";
import { CLIENT_SHM_DISABLED } from "../src/unsupported.js";
import { echoStage } from "./echo-stage.js";

/** The StageError `fn` throws (sync or async), as [code name, message]. */
async function refusal(fn: () => unknown): Promise<[string, string]> {
  try {
    await fn();
  } catch (err) {
    const e = err as StageError;
    return [Code[e.code], e.rawMessage];
  }
  throw new Error("expected a refusal");
}

describe("serverExtensions: what a server advertises, for what it has", () => {
  it("a server with every ability lists Triton's exact list, in its order", () => {
    const all = serverExtensions({
      classification: true,
      sequence: true,
      repository: true,
      schedulePolicy: true,
      systemSharedMemory: true,
      cudaSharedMemory: true,
      trace: true,
      logging: true,
    });
    expect(all).toEqual([...TRITON_EXTENSIONS]);
    expect(all).toContain("model_repository(unload_dependents)");
  });

  it("a server with nothing extra lists only what every server implements", () => {
    expect(serverExtensions({})).toEqual(["model_configuration", "binary_tensor_data", "parameters", "statistics"]);
    expect(serverExtensions({ repository: true })).toEqual([
      "model_repository",
      "model_repository(unload_dependents)",
      "model_configuration",
      "binary_tensor_data",
      "parameters",
      "statistics",
    ]);
  });
});

describe("a lone stage served by listenStage", () => {
  const stage = echoStage();
  it("advertises only the extensions it implements: no classification, no model_repository", async () => {
    const server = await listenStage(stage);
    try {
      const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.url }));
      const { extensions } = await client.serverMetadata({});
      expect(extensions).toEqual(["model_configuration", "binary_tensor_data", "parameters", "statistics"]);
      // What it does not advertise, it refuses for what it is.
      const load = await rejectionOf(client.repositoryModelLoad({ modelName: "echo" }), ConnectError);
      expect([Code[load.code], load.rawMessage]).toEqual([
        "Unimplemented",
        "this server has no model repository control",
      ]);
      const logs = await rejectionOf(client.logSettings({}), ConnectError);
      expect(Code[logs.code]).toBe("Unimplemented");
    } finally {
      await server.close();
    }
  });

  it("with a repository control, shared memory and tracing: those extensions too", async () => {
    const registry: ModelRegistry = {
      ...stageRegistry(stage),
      repository: { index: () => [], load: async () => {}, unload: async () => {} },
    };
    const tracing = {
      settings: (): TraceSettings => ({ trace_level: ["OFF"] }),
      update: (): TraceSettings => ({ trace_level: ["OFF"] }),
      begin: () => undefined,
    };
    const server = await listenStage(registry, { sharedMemory: new SystemSharedMemory(tmpdir()), tracing });
    try {
      const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.url }));
      expect((await client.serverMetadata({})).extensions).toEqual([
        "model_repository",
        "model_repository(unload_dependents)",
        "model_configuration",
        "system_shared_memory",
        "binary_tensor_data",
        "parameters",
        "statistics",
        "trace",
      ]);
      await client.repositoryModelLoad({ modelName: "echo" });
    } finally {
      await server.close();
    }
  });
});

describe("shared memory calls", () => {
  let dir: string;
  let regions: SystemSharedMemory;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "trellis-control-"));
    writeFileSync(join(dir, "obj"), new Uint8Array(32));
    regions = new SystemSharedMemory(dir);
  });
  afterAll(() => {
    regions.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("with client shared memory off: register and unregister refused as Triton refuses them; status empty", async () => {
    const fields = () => ({ key: "/obj", byteSize: 8n });
    expect(await refusal(() => registerSharedMemory(undefined, "system", "r", fields))).toEqual([
      "Unimplemented",
      CLIENT_SHM_DISABLED,
    ]);
    expect(await refusal(() => unregisterSharedMemory(undefined, "system", "r"))).toEqual([
      "Unimplemented",
      CLIENT_SHM_DISABLED,
    ]);
    expect(sharedMemoryRegions(undefined, "system", "")).toEqual([]);
    expect(await refusal(() => sharedMemoryRegions(undefined, "system", "r"))).toEqual([
      "NotFound",
      "Unable to find system shared memory region: 'r'",
    ]);
  });

  it("register reads byte counts from either wire (JSON numbers, uint64 bigints) and refuses others alike", async () => {
    await registerSharedMemory(regions, "system", "a", () => ({ key: "/obj", offset: 8n, byteSize: 16n }));
    await registerSharedMemory(regions, "system", "b", async () => ({ key: "obj", byteSize: 4 }));
    expect(sharedMemoryRegions(regions, "system", "a")).toEqual([{ name: "a", key: "/obj", offset: 8, byteSize: 16 }]);
    const huge = 2n ** 63n;
    for (const byteSize of [huge, Number(huge), -1, 1.5, "8", undefined]) {
      expect(
        await refusal(() => registerSharedMemory(regions, "system", "c", () => ({ key: "/obj", byteSize }))),
      ).toEqual(["InvalidArgument", "register request: 'byte_size' must be a byte count"]);
    }
    expect(await refusal(() => registerSharedMemory(regions, "system", "c", () => ({ key: 5, byteSize: 1 })))).toEqual([
      "InvalidArgument",
      "register request: 'key' must be a string",
    ]);
    // CUDA: never taken, checked before the fields are read.
    expect(
      await refusal(() =>
        registerSharedMemory(regions, "CUDA", "c", () => {
          throw new Error("fields read");
        }),
      ),
    ).toEqual(["Unimplemented", "CUDA shared memory is not supported by this server: send tensors in the request"]);
    unregisterSharedMemory(regions, "CUDA", "a");
    expect(sharedMemoryRegions(regions, "system", "").map((r) => r.name)).toEqual(["a", "b"]);
    unregisterSharedMemory(regions, "system", "a");
    expect(sharedMemoryRegions(regions, "system", "").map((r) => r.name)).toEqual(["b"]);
  });
});

describe("load and unload parameters", () => {
  const wireBytes = (v: unknown) => (v instanceof Uint8Array ? v : undefined);

  it("config and file overrides, read whatever wire carried them", () => {
    const bytes = new Uint8Array([1, 2, 3]);
    expect(loadOptions({ config: "{}", "file:1/model.onnx": bytes, other: 5n }, wireBytes)).toEqual({
      config: "{}",
      files: { "1/model.onnx": bytes },
    });
    expect(loadOptions({}, wireBytes)).toEqual({});
  });

  it("refuses a config that is not text, a file that is not bytes, a path with a control character", async () => {
    expect(await refusal(() => loadOptions({ config: 5n }, wireBytes))).toEqual([
      "InvalidArgument",
      "load parameter 'config' must be a string (the model config as JSON)",
    ]);
    expect(await refusal(() => loadOptions({ "file:m.onnx": "AAAA" }, wireBytes))).toEqual([
      "InvalidArgument",
      `load parameter 'file:m.onnx' must be the file's content (bytes; base64 in JSON), got "AAAA"`,
    ]);
    expect(await refusal(() => loadOptions({ "file:a\u0001": new Uint8Array(0) }, wireBytes))).toEqual([
      "InvalidArgument",
      "load parameter 'file:a\u0001' contains a control character",
    ]);
  });

  it("unload_dependents: a boolean, else refused naming the value", async () => {
    expect(unloadOptions({})).toEqual({});
    expect(unloadOptions({ unload_dependents: true })).toEqual({ unloadDependents: true });
    expect(await refusal(() => unloadOptions({ unload_dependents: 1n }))).toEqual([
      "InvalidArgument",
      "Unable to parse 'unload_dependents': expected a boolean, got 1",
    ]);
  });
});

describe("readiness, trace and log settings", () => {
  const registry = stageRegistry(echoStage());

  it("model ready: a known model's readiness; an unknown one's lookup error", async () => {
    expect(await modelReady(registry, "echo", "")).toBe(true);
    expect((await refusal(() => modelReady(registry, "nope", "")))[0]).toBe("NotFound");
  });

  it("trace settings: OFF without a control; a model's cleared by an empty update when asked", async () => {
    expect(traceSetting(undefined, registry, undefined, undefined)).toEqual({ trace_level: ["OFF"] });
    expect((await refusal(() => traceSetting(undefined, registry, undefined, { trace_rate: ["5"] })))[0]).toBe(
      "Unimplemented",
    );
    expect((await refusal(() => traceSetting(undefined, registry, "nope", {})))[0]).toBe("NotFound");
    const updates: Record<string, string[]>[] = [];
    const tracing = {
      settings: (): TraceSettings => ({ trace_level: ["TIMESTAMPS"], trace_rate: "1", trace_file: "t.json" }),
      update: (_model: string | undefined, changes: Record<string, string[]>): TraceSettings => {
        updates.push(changes);
        return { trace_level: ["OFF"] };
      },
      begin: () => undefined,
    };
    traceSetting(tracing, registry, "echo", {});
    expect(updates).toEqual([]);
    traceSetting(tracing, registry, "echo", {}, true);
    expect(updates).toEqual([{ trace_level: [], trace_rate: [] }]);
  });

  it("log settings: UNIMPLEMENTED without a control; a value that is no scalar refused", async () => {
    expect(await refusal(() => logSetting(undefined, {}))).toEqual([
      "Unimplemented",
      "log settings are not available on this server",
    ]);
    let settings: LogSettings = { log_info: true };
    const control = {
      get: () => settings,
      update: (changes: LogSettings) => {
        settings = { ...settings, ...changes };
        return settings;
      },
    };
    expect(await refusal(() => logSetting(control, { log_info: { on: true } }))).toEqual([
      "InvalidArgument",
      "log setting 'log_info' must be a boolean, a number or a string, got an object",
    ]);
    expect(logSetting(control, { log_info: false })).toEqual({ log_info: false });
  });
});
