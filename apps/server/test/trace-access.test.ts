/**
 * Who may read other clients' requests through traces (SECURITY.md "Traces"): an open server
 * keeps no sampled request for GET /v2/traces and refuses trace_level TENSORS at run time, over
 * HTTP and gRPC; where the trace endpoints need a key, its holder turns TENSORS on and reads a
 * victim's tensors, and nobody else does. Good requests are in flight throughout.
 */
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TRACE_ASK_HEADER } from "../src/observability/tracing.js";
import { echoConfig, grpcClientOf, jsonOf, makeRepository } from "./helpers.js";

const KEY = { "trace-key": "k3y" };
let repo: string;
let dir: string;
let open: ServerProcess;
let keyed: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  dir = await mkdtemp(join(tmpdir(), "trellis-trace-access-"));
  [open, keyed] = await Promise.all([
    // The operator chose TENSORS at start, every request: the file gets them, the routes must not.
    startServerProcess([
      ...["--model-repository", repo, "--trace-config", `triton,file=${join(dir, "open.json")}`],
      ...["--trace-config", "level=TENSORS", "--trace-config", "rate=1"],
    ]),
    startServerProcess([
      ...["--model-repository", repo, "--trace-config", `triton,file=${join(dir, "keyed.json")}`],
      ...["--http-restricted-api", "trace:trace-key=k3y", "--grpc-restricted-protocol", "trace:trace-key=k3y"],
    ]),
  ]);
});
afterAll(async () => {
  const codes = [await open?.stop(), await keyed?.stop()];
  await removeDir(repo);
  await removeDir(dir);
  expect(codes).toEqual([0, 0]);
});

/** One echo inference over HTTP; its output values. */
async function infer(base: string, id: string, data: number[], headers: Record<string, string> = {}) {
  const res = await fetch(`${base}/v2/models/echo/infer`, {
    method: "POST",
    body: JSON.stringify({ id, inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data }] }),
    headers: { "content-type": "application/json", ...headers },
  });
  const body = await jsonOf(res);
  return { status: res.status, data: body.outputs?.[0]?.data as number[] | undefined };
}

/** Good requests beside the test: 24 inferences, each answered with its own values. */
async function goodTraffic(base: string): Promise<string[]> {
  const answers = await Promise.all(
    Array.from({ length: 24 }, (_, i) => infer(base, `good-${i}`, [i, i + 1, i + 2, i + 3])),
  );
  return answers.map((a) => `${a.status}:${a.data?.join(",")}`);
}
const expectedGood = Array.from({ length: 24 }, (_, i) => `200:${i},${i + 1},${i + 2},${i + 3}`);

const postSetting = (base: string, path: string, body: object, headers: Record<string, string> = {}) =>
  fetch(`${base}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json", ...headers },
  });

describe("an open server (no trace key)", () => {
  it("refuses TENSORS at run time and keeps no other client's request for GET /v2/traces", async () => {
    const good = goodTraffic(open.http);
    expect(await infer(open.http, "victim-1", [7, 8, 9, 10])).toEqual({ status: 200, data: [7, 8, 9, 10] });

    for (const [path, body] of [
      ["/v2/trace/setting", { trace_level: ["TIMESTAMPS", "TENSORS"], trace_rate: "1" }],
      ["/v2/trace/setting", { trace_level: ["TENSORS"] }],
      ["/v2/models/echo/trace/setting", { trace_level: ["TENSORS"] }],
    ] as const) {
      const res = await postSetting(open.http, path, body);
      expect(res.status, path).toBe(403);
      const { error } = await jsonOf(res);
      expect(error).toContain("trace_level TENSORS records every client's tensors");
      expect(error).toContain("--http-restricted-api trace:<header>=<value>");
    }
    const overGrpc = await grpcClientOf(open)
      .traceSetting({ settings: { trace_level: { value: ["TENSORS"] } } })
      .catch((e: unknown) => ConnectError.from(e));
    expect((overGrpc as ConnectError).code).toBe(Code.PermissionDenied);
    // Nothing changed: the model has no settings of its own, the global ones are the operator's.
    const now = await jsonOf(await fetch(`${open.http}/v2/models/echo/trace/setting`));
    expect(now.trace_level).toEqual(["TENSORS"]);
    expect(now.trace_rate).toBe("1");
    // Timestamps stay the caller's to change.
    expect((await postSetting(open.http, "/v2/models/echo/trace/setting", { trace_rate: "2" })).status).toBe(200);
    expect((await postSetting(open.http, "/v2/models/echo/trace/setting", { trace_rate: null })).status).toBe(200);

    // The victim was sampled (it reaches the operator's file at exit), but the routes never hold it.
    const victim = await jsonOf(await fetch(`${open.http}/v2/traces?request_id=victim-1`));
    expect(victim.traces).toEqual([]);
    // A request that asks to be traced is kept, timestamps only: no tensors on an open port.
    expect((await infer(open.http, "mine-1", [1, 2, 3, 4], { [TRACE_ASK_HEADER]: "1" })).status).toBe(200);
    const all = await jsonOf(await fetch(`${open.http}/v2/traces`));
    expect(all.traces.map((t: { requestId: string }) => t.requestId)).toEqual(["mine-1"]);
    const mine = await jsonOf(await fetch(`${open.http}/v2/traces/${all.traces[0].id}`));
    expect(mine.root.times.REQUEST_START).toBeTypeOf("number");
    expect(JSON.stringify(mine)).not.toContain("tensors");
    expect(await good).toEqual(expectedGood);
  });
});

describe("a server whose trace endpoints need a key", () => {
  it("refuses the settings and the traces without it; its holder turns on TENSORS and reads them", async () => {
    const good = goodTraffic(keyed.http);
    const tensorsOn = { trace_level: ["TENSORS"], trace_rate: "1" };
    const refused = await postSetting(keyed.http, "/v2/trace/setting", tensorsOn);
    expect(refused.status).toBe(403);
    expect((await jsonOf(refused)).error).toContain("expecting header 'trace-key'");
    expect((await postSetting(keyed.http, "/v2/trace/setting", tensorsOn, { "trace-key": "wrong" })).status).toBe(403);
    const overGrpc = await grpcClientOf(keyed)
      .traceSetting({ settings: { trace_level: { value: ["TENSORS"] } } })
      .catch((e: unknown) => ConnectError.from(e));
    expect((overGrpc as ConnectError).code).toBe(Code.Unavailable);
    expect((await fetch(`${keyed.http}/v2/trace/setting`)).status).toBe(403);

    const set = await postSetting(keyed.http, "/v2/trace/setting", tensorsOn, KEY);
    expect(set.status).toBe(200);
    expect((await jsonOf(set)).trace_level).toEqual(["TENSORS"]);
    // The victim sends no key; its request is sampled and kept for the key's holders only.
    expect(await infer(keyed.http, "victim-2", [7, 8, 9, 10])).toEqual({ status: 200, data: [7, 8, 9, 10] });
    for (const path of ["/v2/traces", "/v2/traces?request_id=victim-2", "/v2/traces/1", "/v2/traces/1/chrome"]) {
      expect((await fetch(`${keyed.http}${path}`)).status, path).toBe(403);
    }
    const list = await jsonOf(await fetch(`${keyed.http}/v2/traces?request_id=victim-2`, { headers: KEY }));
    expect(list.traces).toHaveLength(1);
    const trace = await jsonOf(await fetch(`${keyed.http}/v2/traces/${list.traces[0].id}`, { headers: KEY }));
    expect(trace.requestId).toBe("victim-2");
    expect(trace.root.tensors.map((t: { tensor: { data: string } }) => t.tensor.data)).toEqual([
      "7,8,9,10",
      "7,8,9,10",
    ]);
    const off = await postSetting(keyed.http, "/v2/trace/setting", { trace_level: ["OFF"] }, KEY);
    expect((await jsonOf(off)).trace_level).toEqual(["OFF"]);
    expect(await good).toEqual(expectedGood);
  });
});

describe("the operator's trace file", () => {
  it("holds the victim's request the open server sampled: it was traced, only never served", async () => {
    expect(await open.stop()).toBe(0);
    const entries = JSON.parse(await readFile(join(dir, "open.json"), "utf8")) as { request_id?: string }[];
    expect(entries.some((e) => e.request_id === "victim-1")).toBe(true);
  });
});
