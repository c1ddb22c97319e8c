/**
 * Triton's SageMaker endpoint, black-box: --allow-sagemaker serves GET /ping
 * and POST /invocations for the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
 * names, with JSON tensors and with SageMaker's binary content type.
 */
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { echoConfig, floats, makeRepository } from "./helpers.js";

const BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size=";

let repo: string;
let server: ServerProcess;
let base: string;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo", { params: { scale: "2" } }) } });
  // The server process inherits the environment SageMaker would set.
  process.env.SAGEMAKER_TRITON_DEFAULT_MODEL_NAME = "echo";
  try {
    server = await startServerProcess(["--model-repository", repo, "--allow-sagemaker", "--sagemaker-port", "0"]);
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
  expect(((await bad.json()) as { error: string }).error).toBe("echo: no input");
  const size = await fetch(`${base}/invocations`, {
    method: "POST",
    headers: { "content-type": `${BINARY}lots` },
    body: "{}",
  });
  expect(size.status).toBe(400);
  expect(((await size.json()) as { error: string }).error).toBe("Unable to parse inference header size, got: lots");
  const models = await fetch(`${base}/models`);
  expect(models.status).toBe(400);
  expect(((await models.json()) as { error: string }).error).toBe(
    "GET /models: this SageMaker endpoint serves GET /ping and POST /invocations",
  );
});
