/**
 * Triton's Vertex AI endpoint, black-box: --allow-vertex-ai serves the health
 * and predict routes Vertex AI gives in AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE,
 * predictions going to the default model (JSON, or binary tensors with the
 * header length in Vertex AI's content type), and redirects to other endpoints
 * through X-Vertex-Ai-Triton-Redirect; a default model it cannot find stops it at start;
 * shutdown closes its listener.
 */
import net from "node:net";
import { modelLoader, RepositoryManager } from "@trellis/model-repository";
import { removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startServer } from "../src/server.js";
import { echoConfig, floats, makeRepository } from "./helpers.js";

const BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size=";
const ROUTES = { AIP_PREDICT_ROUTE: "/v1/endpoints/e1/deployedModels/m1:predict", AIP_HEALTH_ROUTE: "/health" };
const ROUTES_OPTIONS = { predictRoute: ROUTES.AIP_PREDICT_ROUTE, healthRoute: ROUTES.AIP_HEALTH_ROUTE };

/** Runs `start` with Vertex AI's environment set, as the platform sets it for the container. */
async function withRoutes<T>(start: () => Promise<T>, env: Record<string, string> = ROUTES): Promise<T> {
  Object.assign(process.env, env);
  try {
    return await start();
  } finally {
    for (const key of Object.keys(env)) delete process.env[key];
  }
}
const startWithRoutes = (args: string[]) => withRoutes(() => startServerProcess(args));
const refusalWithRoutes = (args: string[], env?: Record<string, string>) => withRoutes(() => startupRefusal(args), env);

let repo: string;
let server: ServerProcess;
let base: string;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo", { params: { scale: "2" } }) } });
  server = await startWithRoutes(["--model-repository", repo, "--allow-vertex-ai", "--vertex-ai-port", "0"]);
  const listening = server.logs.find((l) => l.msg === "listening" && l.protocol === "vertex-ai");
  base = `http://127.0.0.1:${listening?.port}`;
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

const predict = (body: string | Buffer, headers: Record<string, string>) =>
  fetch(`${base}${ROUTES.AIP_PREDICT_ROUTE}`, { method: "POST", headers, body });

it("answers the health route 200 once the server is ready", async () => {
  expect((await fetch(`${base}/health`)).status).toBe(200);
});

it("predicts with the one model loaded, JSON and binary tensors", async () => {
  const json = await predict(
    JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
    { "content-type": "application/json" },
  );
  expect(json.status).toBe(200);
  expect(((await json.json()) as { outputs: { data: number[] }[] }).outputs[0]?.data).toEqual([2, 4, 6, 8]);

  const header = new TextEncoder().encode(
    JSON.stringify({
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], parameters: { binary_data_size: 16 } }],
      outputs: [{ name: "OUTPUT", parameters: { binary_data: true } }],
    }),
  );
  const binary = await predict(Buffer.concat([header, new Uint8Array(new Float32Array([1, 1, 2, 3]).buffer)]), {
    "content-type": `${BINARY}${header.byteLength}`,
  });
  expect(binary.status).toBe(200);
  const type = binary.headers.get("content-type") ?? "";
  expect(type.startsWith(BINARY)).toBe(true);
  const length = Number(type.slice(BINARY.length));
  const body = new Uint8Array(await binary.arrayBuffer());
  expect([...floats(body.subarray(length))]).toEqual([2, 2, 4, 6]);
});

it("redirects a POST to the predict route to the endpoint X-Vertex-Ai-Triton-Redirect names", async () => {
  const redirect = (to: string, body = "") =>
    predict(body, { "x-vertex-ai-triton-redirect": to, "content-type": "application/json" });
  const config = await redirect("v2/models/echo/config");
  expect(config.status).toBe(200);
  expect(((await config.json()) as { name: string }).name).toBe("echo");
  const index = await redirect("v2/repository/index", "{}");
  expect(((await index.json()) as { name: string }[]).map((m) => m.name)).toEqual(["echo"]);
  // The generate extension's routes are POSTs too.
  const generated = await redirect("v2/models/echo/generate", JSON.stringify({ INPUT: [1, 2, 3, 4] }));
  expect(await generated.json()).toEqual({ model_name: "echo", model_version: "1", OUTPUT: [2, 4, 6, 8] });
  const metrics = await redirect("metrics");
  expect(await metrics.text()).toContain('nv_inference_request_success{model="echo",version="1"}');
  expect((await redirect("nowhere")).status).toBe(400);
  expect((await fetch(`${base}/elsewhere`)).status).toBe(400);
});

it("stops at start without Vertex AI's routes, or without a default model it can find", async () => {
  const noRoutes = await refusalWithRoutes(["--model-repository", repo, "--allow-vertex-ai"], {});
  expect(String(noRoutes)).toContain(
    "trellis-server: --allow-vertex-ai: AIP_PREDICT_ROUTE is not defined for the Vertex AI endpoint",
  );
  const two = await makeRepository({ a: { config: echoConfig("a") }, b: { config: echoConfig("b") } });
  try {
    const vague = await refusalWithRoutes(["--model-repository", two, "--allow-vertex-ai", "--vertex-ai-port", "0"]);
    expect(String(vague)).toContain(
      "--allow-vertex-ai: with 2 models loaded, name the one predictions go to: --vertex-ai-default-model <name>",
    );
    const missing = await refusalWithRoutes([
      ...["--model-repository", two, "--allow-vertex-ai", "--vertex-ai-port", "0"],
      ...["--vertex-ai-default-model", "c"],
    ]);
    expect(String(missing)).toContain("--allow-vertex-ai: the default model 'c' is not loaded");
    const named = await startWithRoutes([
      ...["--model-repository", two, "--allow-vertex-ai", "--vertex-ai-port", "0"],
      ...["--vertex-ai-default-model", "b"],
    ]);
    expect(await named.stop()).toBe(0);
  } finally {
    await removeDir(two);
  }
});

/** How a TCP connection to `port` on loopback ends: "connected", or the error's code. */
function tcpConnect(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve("connected");
    });
    socket.once("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

it("closes the Vertex AI listener at shutdown, with the others", async () => {
  const quiet = { info() {}, warn() {}, error() {}, debug() {} };
  const manager = new RepositoryManager({ repositories: [repo], loader: modelLoader(), logger: quiet });
  await manager.start();
  const running = await startServer(manager, {
    ...{ httpPort: 0, grpcPort: 0, metricsPort: 0, logger: quiet },
    vertexAi: { port: 0, options: { ...ROUTES_OPTIONS, ready: () => manager.isReady(), model: () => "echo" } },
  });
  const port = running.vertexAiPort as number;
  expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200);
  expect(await tcpConnect(port)).toBe("connected");
  expect(await running.shutdown(5_000)).toEqual({ timedOut: false });
  expect(await tcpConnect(port)).toBe("ECONNREFUSED");
  expect(await tcpConnect(running.httpPort as number)).toBe("ECONNREFUSED");
});
