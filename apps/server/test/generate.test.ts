/**
 * Triton's generate extension, black-box over HTTP: /generate and
 * /generate_stream (Server-Sent Events) for a model answering once and for a
 * decoupled one, the request's fields mapped to inputs and parameters, and
 * what is refused.
 */
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { COUNTDOWN_CONFIG, echoConfig, makeRepository, postJson } from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    doubler: { config: echoConfig("doubler", { params: { scale: "2" } }) },
    // Answers with the request's parameters as JSON text.
    reflect: {
      config: echoConfig("reflect", { datatype: "TYPE_STRING", dims: [1], params: { reflect_parameters: "1" } }),
    },
    countdown: { config: COUNTDOWN_CONFIG },
  });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

/** The events of a Server-Sent Events body, each "data:" line parsed. */
async function events(res: Response): Promise<unknown[]> {
  const text = await res.text();
  return text
    .split("\n\n")
    .filter((e) => e.length > 0)
    .map((e) => {
      expect(e.startsWith("data: ")).toBe(true);
      return JSON.parse(e.slice("data: ".length));
    });
}

const post = (model: string, action: string, body: unknown) =>
  fetch(`${server.http}/v2/models/${model}/${action}`, { method: "POST", body: JSON.stringify(body) });

describe("generate", () => {
  it("maps fields named after inputs to them, the rest (and 'parameters') to parameters, and answers outputs by name", async () => {
    const doubled = await postJson(`${server.http}/v2/models/doubler/generate`, { INPUT: [1, 2, 3, 4] });
    expect(doubled.status).toBe(200);
    expect(doubled.json).toEqual({ model_name: "doubler", model_version: "1", OUTPUT: [2, 4, 6, 8] });
    const reflected = await postJson(`${server.http}/v2/models/reflect/generate`, {
      INPUT: "text in",
      max_tokens: 5,
      parameters: { temperature: 0.5, stream: false },
    });
    expect(reflected.status).toBe(200);
    // One element answers as a value: here the parameters the model was given, as JSON text.
    expect(JSON.parse(reflected.json.OUTPUT)).toEqual({ max_tokens: 5, temperature: 0.5, stream: false });
  });

  it("answers a decoupled model's one response, and refuses one that sends several", async () => {
    const one = await postJson(`${server.http}/v2/models/countdown/generate`, { IN: 1 });
    expect(one.json).toEqual({ model_name: "countdown", model_version: "1", OUT: 1 });
    const three = await postJson(`${server.http}/v2/models/countdown/generate`, { IN: 3 });
    expect(three.status).toBe(400);
    expect(three.json.error).toBe(
      "countdown: generate answers with one response, and the model sent 3: use generate_stream",
    );
  });

  it("says what is wrong with a request: a missing input, values the shape cannot hold, a field of the wrong kind", async () => {
    const missing = await postJson(`${server.http}/v2/models/doubler/generate`, { text_input: "hello" });
    expect(missing.status).toBe(400);
    expect(missing.json.error).toBe(
      "the generate request has no field for input 'INPUT' (the model's inputs are INPUT)",
    );
    const count = await postJson(`${server.http}/v2/models/doubler/generate`, { INPUT: [1, 2, 3] });
    expect(count.status).toBe(400);
    expect(count.json.error).toBe("input 'INPUT': 3 values given, which shape [-1,4] cannot hold");
    const nested = await postJson(`${server.http}/v2/models/doubler/generate`, { INPUT: [1, 2, 3, 4], extra: [1] });
    expect(nested.status).toBe(400);
    expect(nested.json.error).toContain("generate request: parameter 'extra' has invalid type");
    const notObject = await postJson(`${server.http}/v2/models/doubler/generate`, [1, 2]);
    expect(notObject.json.error).toBe("the generate request must be a JSON object");
  });
});

describe("generate_stream", () => {
  it("sends each of a decoupled model's responses as a Server-Sent Event", async () => {
    const res = await post("countdown", "generate_stream", { IN: 3 });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    expect(await events(res)).toEqual([3, 2, 1].map((n) => ({ model_name: "countdown", model_version: "1", OUT: n })));
  });

  it("sends a model that answers once as one event", async () => {
    const res = await post("doubler", "generate_stream", { INPUT: [1, 1, 1, 1] });
    expect(await events(res)).toEqual([{ model_name: "doubler", model_version: "1", OUTPUT: [2, 2, 2, 2] }]);
  });

  it("reports a failure after the first response as an error event, one before it as an ordinary error", async () => {
    const late = await post("countdown", "generate_stream", { IN: 3, parameters: { fail_at: 1 } });
    expect(late.status).toBe(200);
    expect(await events(late)).toEqual([
      { model_name: "countdown", model_version: "1", OUT: 3 },
      { model_name: "countdown", model_version: "1", OUT: 2 },
      { error: "countdown: asked to fail at 1" },
    ]);
    const early = await post("countdown", "generate_stream", { IN: 2, parameters: { fail_at: 2 } });
    expect(early.status).toBe(400);
    expect(early.headers.get("content-type")).toBe("application/json");
    expect(await early.json()).toEqual({ error: "countdown: asked to fail at 2" });
  });
});

describe("tracing", () => {
  it("traces a generate_stream request as an infer one: received, each model's activity, sent", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-generate-trace-"));
    const file = join(dir, "trace.json");
    const traced = await startServerProcess([
      ...["--model-repository", repo, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"],
      ...["--trace-config", `triton,file=${file}`],
    ]);
    try {
      const res = await fetch(`${traced.http}/v2/models/countdown/generate_stream`, {
        method: "POST",
        body: JSON.stringify({ IN: 2 }),
      });
      expect(await events(res)).toHaveLength(2);
    } finally {
      expect(await traced.stop()).toBe(0);
    }
    try {
      const entries = JSON.parse(await readFile(file, "utf8")) as {
        model_name?: string;
        timestamps?: { name: string }[];
      }[];
      expect(entries.filter((e) => e.model_name).map((e) => e.model_name)).toEqual(["countdown"]);
      const names = entries.flatMap((e) => e.timestamps ?? []).map((t) => t.name);
      for (const stamp of [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "REQUEST_START",
        "REQUEST_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
      ]) {
        expect(names).toContain(stamp);
      }
    } finally {
      await removeDir(dir);
    }
  });
});
