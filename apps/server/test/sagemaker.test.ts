/**
 * Triton's SageMaker endpoint, black-box: --allow-sagemaker serves GET /ping
 * and POST /invocations for the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
 * names, with JSON tensors and with SageMaker's binary content type; and the
 * multi-model endpoint's /models routes, loading SageMaker's model folders
 * (a model's own folder, or a repository with an ensemble and its steps).
 */
import { cp, mkdir, mkdtemp, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addModel, CHAIN_CONFIG, COUNTDOWN_CONFIG, echoConfig, floats, makeRepository, postJson } from "./helpers.js";

const BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size=";

let repo: string;
let server: ServerProcess;
let base: string;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo", { params: { scale: "2" } }) } });
  // The server process inherits the environment SageMaker would set.
  process.env.SAGEMAKER_TRITON_DEFAULT_MODEL_NAME = "echo";
  try {
    server = await startServerProcess([
      ...["--model-repository", repo, "--allow-sagemaker", "--sagemaker-port", "0"],
      ...["--sagemaker-model-root", tmpdir()],
    ]);
  } finally {
    delete process.env.SAGEMAKER_TRITON_DEFAULT_MODEL_NAME;
  }
  const listening = server.logs.find((l) => l.msg === "listening" && l.protocol === "sagemaker");
  base = `http://127.0.0.1:${listening?.port}`;
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

it("answers GET /ping 200 once the server is ready", async () => {
  const res = await fetch(`${base}/ping`);
  expect(res.status).toBe(200);
});

it("infers with the default model on POST /invocations, JSON in and out", async () => {
  const res = await fetch(`${base}/invocations`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
  });
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toBe("application/json");
  const json = (await res.json()) as { model_name: string; outputs: { data: number[] }[] };
  expect(json.model_name).toBe("echo");
  expect(json.outputs[0]?.data).toEqual([2, 4, 6, 8]);
});

it("takes and gives binary tensors with the JSON header's length in SageMaker's content type", async () => {
  const header = new TextEncoder().encode(
    JSON.stringify({
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], parameters: { binary_data_size: 16 } }],
      outputs: [{ name: "OUTPUT", parameters: { binary_data: true } }],
    }),
  );
  const res = await fetch(`${base}/invocations`, {
    method: "POST",
    headers: { "content-type": `${BINARY}${header.byteLength}` },
    body: Buffer.concat([header, new Uint8Array(new Float32Array([5, 6, 7, 8]).buffer)]),
  });
  expect(res.status).toBe(200);
  const type = res.headers.get("content-type") ?? "";
  expect(type.startsWith(BINARY)).toBe(true);
  expect(res.headers.get("inference-header-content-length")).toBeNull();
  const length = Number(type.slice(BINARY.length));
  const body = new Uint8Array(await res.arrayBuffer());
  const json = JSON.parse(new TextDecoder().decode(body.subarray(0, length))) as { outputs: { name: string }[] };
  expect(json.outputs[0]?.name).toBe("OUTPUT");
  expect([...floats(body.subarray(length))]).toEqual([10, 12, 14, 16]);
});

it("says what is wrong: a bad request to the model, an unparsable header size, a route it does not serve", async () => {
  const bad = await fetch(`${base}/invocations`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ inputs: [] }),
  });
  expect(bad.status).toBe(400);
  // Refused by the model runtime's checks (Triton's words), before the stage runs.
  expect(((await bad.json()) as { error: string }).error).toMatch(
    /expected 1 inputs but got 0 inputs for model 'echo'/,
  );
  const size = await fetch(`${base}/invocations`, {
    method: "POST",
    headers: { "content-type": `${BINARY}lots` },
    body: "{}",
  });
  expect(size.status).toBe(400);
  expect(((await size.json()) as { error: string }).error).toBe("Unable to parse inference header size, got: lots");
  const other = await fetch(`${base}/predictions`);
  expect(other.status).toBe(400);
  expect(((await other.json()) as { error: string }).error).toBe(
    "GET /predictions: this SageMaker endpoint serves GET /ping, POST /invocations and /models",
  );
  // Loading a model needs explicit model control, as in Triton.
  const load = await postJson(`${base}/models`, { model_name: "m", url: repo });
  expect(load.status).toBe(400);
  expect(load.json.error).toBe("repository registration is not allowed if model control mode is not EXPLICIT");
});

describe("multi-model endpoint (/models)", () => {
  let work: string;
  let mme: ServerProcess;
  let url: string;
  /** --http-restricted-api model-repository guards the /models routes but invoke. */
  const admin = { "admin-key": "secret" };
  const call = (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
    fetch(`${url}${path}`, {
      method,
      headers: { ...admin, "content-type": "application/json", ...headers },
      ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
    });
  const infer = (name: string, values: number[], headers: Record<string, string> = {}) =>
    call(
      "POST",
      `/models/${name}/invoke`,
      { inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: values }] },
      headers,
    );
  const index = async () => {
    const res = await fetch(`${mme.http}/v2/repository/index`, { method: "POST", headers: admin, body: "{}" });
    return ((await res.json()) as { name: string; state?: string }[]).map((m) => `${m.name}:${m.state ?? ""}`);
  };

  beforeAll(async () => {
    work = await mkdtemp(join(tmpdir(), "trellis-sagemaker-mme-"));
    // As SageMaker unpacks archives: /opt/ml/models/<hash>/model.
    // a1b2: the model's own folder (its config names it "doubler"; it is served as the archive's name).
    await mkdir(join(work, "a1b2"));
    await addModel(join(work, "a1b2"), "model", {
      config: echoConfig("doubler", { params: { scale: "2" } })
        .replace(/"INPUT"/, '"IN"')
        .replace(/"OUTPUT"/, '"OUT"'),
    });
    // c3d4: a repository holding an ensemble and its two steps.
    await mkdir(join(work, "c3d4", "model"), { recursive: true });
    for (const [name, config] of [
      ["chain", CHAIN_CONFIG],
      ["echo", echoConfig("echo")],
      ["echo10", echoConfig("echo10", { params: { scale: "10" } })],
    ] as const) {
      await addModel(join(work, "c3d4", "model"), name, { config });
    }
    // e5f6: a model whose load runs out of memory; g7h8: one that fails otherwise; empty: nothing.
    await mkdir(join(work, "e5f6"));
    await addModel(join(work, "e5f6"), "model", {
      config: echoConfig("oom", { params: { module: join(work, "e5f6", "model", "oom.js") } }),
      files: {
        "oom.js": 'export function createStage() { throw new Error("Failed to allocate memory for the weights"); }\n',
      },
    });
    await mkdir(join(work, "g7h8"));
    await addModel(join(work, "g7h8"), "model", {
      config: echoConfig("broken", { params: { module: "./missing.js" } }),
    });
    await mkdir(join(work, "empty", "model"), { recursive: true });
    await writeFile(join(work, "empty", "model", "README"), "no model here");
    // The server's own repository starts empty, as SageMaker's does.
    await mkdir(join(work, "repository"));
    mme = await startServerProcess([
      ...["--model-repository", join(work, "repository"), "--model-control-mode", "explicit"],
      ...["--allow-sagemaker", "--sagemaker-port", "0", "--http-restricted-api", "model-repository:admin-key=secret"],
      ...["--sagemaker-model-root", work],
    ]);
    const listening = mme.logs.find((l) => l.msg === "listening" && l.protocol === "sagemaker");
    url = `http://127.0.0.1:${listening?.port}`;
  });
  afterAll(async () => {
    expect(await mme.stop()).toBe(0);
    await removeDir(work);
  });

  it("loads a model's own folder under the target model's name, lists it and invokes it", async () => {
    const load = await call(
      "POST",
      "/models",
      { model_name: "a1b2", url: join(work, "a1b2", "model") },
      { "x-amzn-sagemaker-target-model": "doubler.tar.gz" },
    );
    expect(load.status).toBe(200);
    expect(await (await call("GET", "/models")).json()).toEqual({
      models: [{ modelName: "a1b2", modelUrl: join(work, "a1b2") }],
    });
    expect(await (await call("GET", "/models/a1b2")).json()).toEqual({
      modelName: "a1b2",
      modelUrl: join(work, "a1b2"),
    });
    const answer = await infer("a1b2", [1, 2, 3, 4], { "x-amzn-sagemaker-target-model": "doubler.tar.gz" });
    expect(answer.status).toBe(200);
    const json = (await answer.json()) as { model_name: string; outputs: { data: number[] }[] };
    expect(json.model_name).toBe("doubler.tar.gz");
    expect(json.outputs[0]?.data).toEqual([2, 4, 6, 8]);
    // The same model, by that name, over KServe v2.
    expect((await fetch(`${mme.http}/v2/models/doubler.tar.gz/ready`)).status).toBe(200);
  });

  it("loads a repository's ensemble with its steps, and unloads them all with it", async () => {
    const load = await call("POST", "/models", { model_name: "c3d4", url: join(work, "c3d4", "model") });
    expect(load.status).toBe(200);
    expect(await index()).toEqual(["c3d4:READY", "doubler.tar.gz:READY", "echo:READY", "echo10:READY"]);
    const answer = await infer("c3d4", [1, 2, 3, 4]);
    expect(((await answer.json()) as { outputs: { data: number[] }[] }).outputs[0]?.data).toEqual([10, 20, 30, 40]);
    // SageMaker's model_name is loaded once.
    const again = await call("POST", "/models", { model_name: "c3d4", url: join(work, "c3d4", "model") });
    expect(again.status).toBe(409);
    expect(((await again.json()) as { error: string }).error).toBe("model 'c3d4' is already loaded");

    expect((await call("DELETE", "/models/c3d4")).status).toBe(200);
    expect(await index()).toEqual(["doubler.tar.gz:READY"]);
    expect((await infer("c3d4", [1, 2, 3, 4])).status).toBe(404);
    expect((await call("GET", "/models/c3d4")).status).toBe(404);
    expect((await call("DELETE", "/models/c3d4")).status).toBe(404);
    expect(await (await call("GET", "/models")).json()).toEqual({
      models: [{ modelName: "a1b2", modelUrl: join(work, "a1b2") }],
    });
    // Loaded again from the same folder, it serves again.
    expect((await call("POST", "/models", { model_name: "c3d4", url: join(work, "c3d4", "model") })).status).toBe(200);
    expect((await infer("c3d4", [1, 1, 1, 1])).status).toBe(200);
  });

  it("serves two archives whose ensembles have steps of the same names; deleting one leaves the other whole", async () => {
    // i9j0 is c3d4's repository again: its ensemble, served as i9j0, calls the steps already loaded.
    expect((await call("POST", "/models", { model_name: "i9j0", url: join(work, "c3d4", "model") })).status).toBe(409);
    await cp(join(work, "c3d4"), join(work, "i9j0"), { recursive: true });
    expect((await call("POST", "/models", { model_name: "i9j0", url: join(work, "i9j0", "model") })).status).toBe(200);
    const both = async () => Promise.all(["c3d4", "i9j0"].map(async (n) => (await infer(n, [1, 2, 3, 4])).status));
    expect(await both()).toEqual([200, 200]);
    expect((await call("DELETE", "/models/i9j0")).status).toBe(200);
    expect((await infer("c3d4", [1, 2, 3, 4])).status).toBe(200);
    expect(await index()).toEqual(["c3d4:READY", "doubler.tar.gz:READY", "echo:READY", "echo10:READY"]);
    expect((await call("DELETE", "/models/c3d4")).status).toBe(200);
    expect(await index()).toEqual(["doubler.tar.gz:READY"]);
    expect((await call("POST", "/models", { model_name: "c3d4", url: join(work, "c3d4", "model") })).status).toBe(200);
  });

  it("says why a load fails: out of memory 507, otherwise 400, leaving nothing behind", async () => {
    const oom = await call("POST", "/models", { model_name: "e5f6", url: join(work, "e5f6", "model") });
    expect(oom.status).toBe(507);
    expect(((await oom.json()) as { error: string }).error).toContain("Failed to allocate memory for the weights");
    const broken = await call("POST", "/models", { model_name: "g7h8", url: join(work, "g7h8", "model") });
    expect(broken.status).toBe(400);
    expect(((await broken.json()) as { error: string }).error).toContain("missing.js");
    const empty = await call("POST", "/models", { model_name: "empty", url: join(work, "empty", "model") });
    expect(empty.status).toBe(400);
    expect(((await empty.json()) as { error: string }).error).toBe(
      `url ${join(work, "empty", "model")}: no model in it (a folder with config.pbtxt, or a repository of them)`,
    );
    const proc = await call("POST", "/models", { model_name: "p", url: "/proc/self" });
    expect(proc.status).toBe(400);
    expect(((await proc.json()) as { error: string }).error).toBe(
      "url /proc/self: cannot start with /dev/, /proc/ or /sys/",
    );
    // Only folders under --sagemaker-model-root: a url is a client's word, the code in the folder would run.
    await symlink(tmpdir(), join(work, "link-out"));
    const outsides = [
      tmpdir(),
      join(work, ".."),
      join(work, "a1b2", "model", "..", "..", ".."),
      join(work, "link-out"),
    ];
    for (const outside of outsides) {
      const refused = await call("POST", "/models", { model_name: "o", url: outside });
      expect(refused.status).toBe(400);
      expect(((await refused.json()) as { error: string }).error).toBe(
        `url ${outside}: not under the multi-model endpoint's model root (--sagemaker-model-root)`,
      );
    }
    const notJson = await call("POST", "/models", "model_name=x");
    expect(notJson.status).toBe(400);
    expect(((await notJson.json()) as { error: string }).error).toMatch(/^load request: not JSON/);
    const noUrl = await call("POST", "/models", { model_name: "x" });
    expect(((await noUrl.json()) as { error: string }).error).toBe(
      'load request: expected {"model_name": "<name>", "url": "<path>"}',
    );
    // The failed loads left no model and no repository behind: the index is as before.
    expect(await index()).toEqual(["c3d4:READY", "doubler.tar.gz:READY", "echo:READY", "echo10:READY"]);
    expect((await call("GET", "/models/e5f6")).status).toBe(404);
  });

  it("guards the /models routes with the model-repository restriction, but not invoke", async () => {
    const listed = await fetch(`${url}/models`);
    expect(listed.status).toBe(403);
    expect(((await listed.json()) as { error: string }).error).toBe(
      "This API is restricted, expecting header 'admin-key' (the model-repository endpoints)",
    );
    const invoked = await fetch(`${url}/models/a1b2/invoke`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ inputs: [{ name: "IN", datatype: "FP32", shape: [1, 4], data: [1, 1, 1, 1] }] }),
    });
    expect(invoked.status).toBe(200);
  });
});

describe("SAGEMAKER_TRITON_INFERENCE_TYPE", () => {
  it("runs /invocations as generate_stream when it says so, and refuses at start a type it does not know", async () => {
    const llm = await makeRepository({ countdown: { config: COUNTDOWN_CONFIG } });
    const args = ["--model-repository", llm, "--allow-sagemaker", "--sagemaker-port", "0"];
    try {
      const streaming = await startServerProcess(args, {
        env: { SAGEMAKER_TRITON_DEFAULT_MODEL_NAME: "countdown", SAGEMAKER_TRITON_INFERENCE_TYPE: "generate_stream" },
      });
      try {
        const port = streaming.logs.find((l) => l.msg === "listening" && l.protocol === "sagemaker")?.port;
        const res = await fetch(`http://127.0.0.1:${port}/invocations`, { method: "POST", body: '{"IN": 2}' });
        expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
        expect(await res.text()).toBe(
          'data: {"model_name":"countdown","model_version":"1","OUT":2}\n\ndata: {"model_name":"countdown","model_version":"1","OUT":1}\n\n',
        );
      } finally {
        expect(await streaming.stop()).toBe(0);
      }
      const refused = await startupRefusal(args, { env: { SAGEMAKER_TRITON_INFERENCE_TYPE: "chat" } });
      expect(refused).toContain(
        "--allow-sagemaker: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE=chat: expected infer, generate, generate_stream",
      );
    } finally {
      await removeDir(llm);
    }
  });
});
