/**
 * Hostile model loads (explicit mode, the repository API reachable), black-box:
 * a model name that climbs out of the upload folder, a config override that
 * names a file outside the model's folder, uploaded code and a client-chosen
 * endpoint. Each is refused with its reason, touches nothing, and a good
 * request right after still answers.
 */
import { existsSync } from "node:fs";
import { mkdtemp, readdir } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { Code, ConnectError, type createClient } from "@connectrpc/connect";
import { parseRestriction } from "@trellis/frontends";
import type { GRPCInferenceService } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { repositoryApiWarnings } from "../src/cli/cli.js";
import { ECHO_STAGE, echoConfig, explicitModels, grpcClientOf, makeRepository, postJson } from "./helpers.js";

const stringParam = (value: string) => ({ parameterChoice: { case: "stringParam" as const, value } });
const bytesParam = (value: Uint8Array) => ({ parameterChoice: { case: "bytesParam" as const, value } });

/** The echo model's config as Triton's JSON, with `output` fields added. */
const echoJson = (extra: Record<string, unknown> = {}, parameters: Record<string, string> = { module: ECHO_STAGE }) =>
  JSON.stringify({
    name: "echo",
    backend: "typescript",
    max_batch_size: 8,
    input: [{ name: "INPUT", data_type: "TYPE_FP32", dims: [4] }],
    output: [{ name: "OUTPUT", data_type: "TYPE_FP32", dims: [4], ...extra }],
    parameters: Object.fromEntries(Object.entries(parameters).map(([k, v]) => [k, { string_value: v }])),
  });

/** A model.js that proves it ran by writing `marker`. */
const markerStage = (marker: string) =>
  new TextEncoder().encode(`import { writeFileSync } from "node:fs";
writeFileSync(${JSON.stringify(marker)}, "ran");
export function createStage() { throw new Error("not a real stage"); }
`);

/** POST with the path exactly as given (fetch and curl without --path-as-is would resolve the '..'). */
function postRawPath(port: number, path: string, body: unknown): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(
      { host: "127.0.0.1", port, path, method: "POST", headers: { "content-type": "application/json" } },
      (res) => {
        let text = "";
        res.on("data", (c) => {
          text += c;
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
      },
    );
    req.on("error", reject);
    req.end(data);
  });
}

async function echoWorks(server: ServerProcess): Promise<void> {
  const res = await postJson(`${server.http}/v2/models/echo/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
  });
  expect(res.status, JSON.stringify(res.json)).toBe(200);
  expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4]);
}

describe("hostile model loads", () => {
  let repo: string;
  let victim: string;
  let server: ServerProcess;
  let client: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  beforeAll(async () => {
    repo = await makeRepository({ echo: { config: echoConfig("echo") } });
    // Beside the server's upload folders (tmpdir()/trellis-load-*): one '..' away from a model's folder there.
    victim = await mkdtemp(join(tmpdir(), "trellis-victim-"));
    server = await startServerProcess(explicitModels(repo, "echo"));
    client = grpcClientOf(server);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
    await removeDir(victim);
  });

  it("refuses a model name that leaves the upload folder (gRPC), writing nothing, valid config or not", async () => {
    for (const config of [echoJson(), "{ not json"]) {
      const err = await client
        .repositoryModelLoad({
          modelName: `../${basename(victim)}`,
          parameters: { config: stringParam(config), "file:proof.txt": bytesParam(new TextEncoder().encode("x")) },
        })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.InvalidArgument);
      expect((err as ConnectError).rawMessage).toBe(
        `invalid model name '../${basename(victim)}', model name must not contain path traversal characters`,
      );
      expect(await readdir(victim)).toEqual([]);
    }
    // A NUL is refused the same way, not as an internal error.
    const nul = await client.repositoryModelLoad({ modelName: "echo\u0000x" }).catch((e: unknown) => e);
    expect((nul as ConnectError).code).toBe(Code.InvalidArgument);
    await echoWorks(server);
  });

  it("refuses '..' as a model name over HTTP (a path sent as is), writing nothing", async () => {
    const proof = `trellis-proof-${process.pid}-${Date.now()}.txt`;
    const res = await postRawPath(server.httpPort, "/v2/repository/models/../load", {
      parameters: { config: echoJson(), [`file:${proof}`]: Buffer.from("x").toString("base64") },
    });
    expect(res.status).toBe(400);
    expect(res.text).toContain("invalid model name '..', model name must not contain path traversal characters");
    expect(existsSync(join(tmpdir(), proof))).toBe(false);
    await echoWorks(server);
  });

  it("refuses a config override whose label_filename leaves the model's folder", async () => {
    const res = await postJson(`${server.http}/v2/repository/models/echo/load`, {
      parameters: { config: echoJson({ label_filename: "../../../../etc/passwd" }) },
    });
    expect(res.status, JSON.stringify(res.json)).toBe(400);
    expect(res.json.error).toContain(
      'label_filename "../../../../etc/passwd" must name a file inside the model\'s folder',
    );
    // The repository's echo is still the one loaded, and classification gives no passwd lines.
    const infer = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [4, 3, 2, 1] }],
      outputs: [{ name: "OUTPUT", parameters: { classification: 1 } }],
    });
    expect(infer.status, JSON.stringify(infer.json)).toBe(200);
    expect(infer.json.outputs[0].data).toEqual(["4.000000:0"]);
  });

  it("refuses an uploaded model whose default_model_filename leaves its version folder", async () => {
    const config = {
      name: "peek",
      platform: "onnxruntime_onnx",
      max_batch_size: 0,
      input: [{ name: "x", data_type: "TYPE_FP32", dims: [1] }],
      output: [{ name: "y", data_type: "TYPE_FP32", dims: [1] }],
      default_model_filename: "../../../../../../etc/hostname",
    };
    const err = await client
      .repositoryModelLoad({
        modelName: "peek",
        parameters: {
          config: stringParam(JSON.stringify(config)),
          "file:1/placeholder.txt": bytesParam(new TextEncoder().encode("x")),
        },
      })
      .catch((e: unknown) => e);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toContain(
      'default_model_filename "../../../../../../etc/hostname" must name a file inside the model\'s folder',
    );
    await echoWorks(server);
  });

  it("refuses uploaded model code without running it, and the endpoint a client picks without connecting", async () => {
    const marker = join(victim, "ran.txt");
    const code = await client
      .repositoryModelLoad({
        modelName: "uploaded",
        parameters: {
          config: stringParam(JSON.stringify({ name: "uploaded", backend: "typescript" })),
          "file:1/model.js": bytesParam(markerStage(marker)),
        },
      })
      .catch((e: unknown) => e);
    expect((code as ConnectError).code).toBe(Code.PermissionDenied);
    expect((code as ConnectError).rawMessage).toContain("file override 'file:1/model.js' is executable code");
    expect((code as ConnectError).rawMessage).toContain("--allow-unsafe-load-overrides");
    expect(existsSync(marker)).toBe(false);

    let connections = 0;
    const listener = net.createServer((s) => {
      connections++;
      s.destroy();
    });
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    try {
      const endpoint = `http://127.0.0.1:${(listener.address() as net.AddressInfo).port}`;
      const res = await postJson(`${server.http}/v2/repository/models/echo/load`, {
        parameters: { config: echoJson({}, { module: "@trellis/inference-trt-bridge", endpoint }) },
      });
      expect(res.status, JSON.stringify(res.json)).toBe(403);
      expect(res.json.error).toContain('changes the model\'s parameters "module", "endpoint"');
      expect(JSON.stringify(res.json)).not.toContain(endpoint);
      expect(connections).toBe(0);
    } finally {
      listener.close();
    }
    // An override that leaves the parameters as they are still loads (Triton's everyday use).
    const same = await postJson(`${server.http}/v2/repository/models/echo/load`, {
      parameters: { config: echoJson() },
    });
    expect(same.status, JSON.stringify(same.json)).toBe(200);
    await echoWorks(server);
  });
});

describe("--allow-unsafe-load-overrides", () => {
  it("lets an operator who opted in upload model code", async () => {
    const repo = await makeRepository({});
    const dir = await mkdtemp(join(tmpdir(), "trellis-optin-"));
    const server = await startServerProcess([...explicitModels(repo), "--allow-unsafe-load-overrides"]);
    try {
      expect(
        server.logs.some((l) => String(l.msg).includes("--allow-unsafe-load-overrides: model load requests")),
      ).toBe(true);
      const marker = join(dir, "ran.txt");
      const res = await postJson(`${server.http}/v2/repository/models/uploaded/load`, {
        parameters: {
          config: JSON.stringify({ name: "uploaded", backend: "typescript" }),
          "file:1/model.js": Buffer.from(markerStage(marker)).toString("base64"),
        },
      });
      // The code ran (its factory then fails the load, as it is written to).
      expect(existsSync(marker)).toBe(true);
      expect(res.status).toBe(400);
    } finally {
      expect(await server.stop()).toBe(0);
      await removeDir(repo);
      await removeDir(dir);
    }
  });
});

describe("start-up warning for an open repository API", () => {
  const flags = { modelControlMode: "explicit" as const, allowHttp: true, allowGrpc: true, host: "0.0.0.0" };
  const key = () => parseRestriction("model-repository:x-api-key=secret");
  const open = (warnings: string[]) => warnings.filter((w) => w.includes("model repository API open to the network"));

  it("warns in explicit mode on a non-loopback address without a model-repository key, per port", () => {
    const both = open(repositoryApiWarnings({ ...flags, allowUnsafeLoadOverrides: false }, undefined, undefined));
    expect(both).toHaveLength(1);
    expect(both[0]).toContain("HTTP (--http-restricted-api) and gRPC (--grpc-restricted-protocol)");
    const grpcOnly = open(repositoryApiWarnings({ ...flags, allowUnsafeLoadOverrides: false }, key(), undefined));
    expect(grpcOnly[0]).not.toContain("HTTP");
    expect(grpcOnly[0]).toContain("gRPC (--grpc-restricted-protocol)");
    const httpAddress = open(
      repositoryApiWarnings(
        { ...flags, host: "127.0.0.1", httpAddress: "10.0.0.5", allowUnsafeLoadOverrides: false },
        undefined,
        undefined,
      ),
    );
    expect(httpAddress[0]).toContain("on HTTP (--http-restricted-api):");
  });

  it("stays quiet on loopback, with keys on both ports, or outside explicit mode", () => {
    const quiet = { ...flags, allowUnsafeLoadOverrides: false };
    expect(open(repositoryApiWarnings({ ...quiet, host: "127.0.0.1" }, undefined, undefined))).toEqual([]);
    expect(open(repositoryApiWarnings({ ...quiet, host: "::1" }, undefined, undefined))).toEqual([]);
    expect(open(repositoryApiWarnings({ ...quiet, modelControlMode: "none" }, undefined, undefined))).toEqual([]);
    expect(open(repositoryApiWarnings(quiet, key(), key()))).toEqual([]);
    expect(open(repositoryApiWarnings({ ...quiet, allowGrpc: false }, key(), undefined))).toEqual([]);
  });
});
