/**
 * A decoupled model reached over --endpoints, black-box: server R serves the countdown model
 * (a decoupled TypeScript stage); server F lists it in its endpoint map, so F's countdown is
 * R's. Through F a ModelStreamInfer streams every response R's model sends, in order (with
 * the empty final one when asked, and a failure mid-request after what was sent); F's config
 * says decoupled and its ModelInfer refuses as R's does; the requests F holds pending are those
 * R holds, and a client going away from F stops the request on R. A third server, E, runs an
 * ensemble whose decoupled step is R's countdown (a remote step): it streams too.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ModelInferRequestSchema } from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  boolParam as bool,
  countdownRequest as countdown,
  countingModels,
  explicitModels,
  grpcClientOf,
  int64Param as int64,
  makeRepository,
  metricValue,
  postJson,
  readStreamAnswer as read,
  scrape,
} from "./helpers.js";

let repo: string;
/** Serves countdown itself. */
let remote: ServerProcess;
/** Serves countdown as R's, through its endpoint map. */
let front: ServerProcess;
/** Serves the ensemble counting, whose step countdown is R's (a remote step: E does not load it). */
let ensemble: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    ...countingModels(),
  });
  const explicit = (model: string) => [...explicitModels(repo), "--load-model", model];
  remote = await startServerProcess(explicit("countdown"));
  const endpoints = join(repo, "endpoints.json");
  await writeFile(endpoints, JSON.stringify({ countdown: remote.grpc }));
  [front, ensemble] = await Promise.all([
    startServerProcess([...explicit("countdown"), "--endpoints", endpoints]),
    startServerProcess([...explicit("counting"), "--endpoints", endpoints]),
  ]);
}, 120_000);

afterAll(async () => {
  for (const server of [front, ensemble, remote]) if (server) expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

const client = (server: ServerProcess) => grpcClientOf(server);

const pending = async (server: ServerProcess) =>
  metricValue(await scrape(server), "nv_inference_pending_request_count", "countdown");

/** Polls `check` until it holds (the servers' own state, read over their APIs). */
async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe("a decoupled model served through --endpoints", () => {
  it("streams every response the remote model sends, in order, over ModelStreamInfer", async () => {
    async function* requests() {
      yield countdown("plain", 3);
      yield countdown("flagged", 2, { triton_enable_empty_final_response: bool(true) });
    }
    const answers: string[] = [];
    for await (const a of client(front).modelStreamInfer(requests())) answers.push(read(a));
    const of = (id: string) => answers.filter((a) => a.startsWith(`${id} `));
    expect(of("plain")).toEqual(["plain 3", "plain 2", "plain 1"]);
    expect(of("flagged")).toEqual(["flagged 2 final=false", "flagged 1 final=false", "flagged empty final=true"]);
    expect(answers).toHaveLength(6);

    // And over HTTP: generate_stream sends each response as an event.
    const res = await fetch(`${front.http}/v2/models/countdown/generate_stream`, {
      method: "POST",
      body: JSON.stringify({ IN: 3 }),
    });
    expect(res.status).toBe(200);
    const events = (await res.text())
      .split("\n\n")
      .filter(Boolean)
      .map((e) => JSON.parse(e.slice("data: ".length)) as { OUT: number });
    expect(events.map((e) => e.OUT)).toEqual([3, 2, 1]);
  });

  it("passes a failure mid-request on after what was sent, naming the model and not R's address", async () => {
    async function* requests() {
      yield countdown("failing", 4, { fail_at: int64(2n) });
    }
    const answers: string[] = [];
    for await (const a of client(front).modelStreamInfer(requests())) answers.push(read(a));
    expect(answers.slice(0, 2)).toEqual(["failing 4", "failing 3"]);
    expect(answers).toHaveLength(3);
    expect(answers[2]).toMatch(/^failing error: .*countdown.*asked to fail at 2/);
    expect(answers[2]).not.toContain(remote.grpc.replace(/^https?:\/\//, ""));
  });

  it("says decoupled in its config, and refuses the one-answer calls as the remote does", async () => {
    const config = (await client(front).modelConfig({ name: "countdown" })).config;
    expect(config?.modelTransactionPolicy?.decoupled).toBe(true);
    const http = (await (await fetch(`${front.http}/v2/models/countdown/config`)).json()) as {
      model_transaction_policy?: { decoupled?: boolean };
    };
    expect(http.model_transaction_policy?.decoupled).toBe(true);
    const metadata = await client(front).modelMetadata({ name: "countdown" });
    expect(metadata.outputs.map((o) => o.name)).toEqual(["OUT"]);

    const unary = await client(front)
      .modelInfer(countdown("unary", 2))
      .catch((e: unknown) => e);
    expect(unary).toBeInstanceOf(ConnectError);
    expect((unary as ConnectError).code).toBe(Code.Unimplemented);
    expect((unary as ConnectError).rawMessage).toContain("decoupled");
    const rest = await postJson(`${front.http}/v2/models/countdown/infer`, {
      inputs: [{ name: "IN", datatype: "INT32", shape: [1], data: [2] }],
    });
    expect(rest.status).toBe(501);
  });

  it("holds pending what the remote holds, and a client going away stops the request on the remote", async () => {
    expect(await pending(front)).toBe(0);
    expect(await pending(remote)).toBe(0);
    const before = await remoteStats();
    const controllers = [new AbortController(), new AbortController()];
    const firsts: string[] = [];
    const streams = controllers.map(async (ctl, i) => {
      async function* requests() {
        yield countdown(`long${i}`, 1000, { delay_ms: int64(50n) });
        // Keeps the request stream open: the call ends when the client aborts it.
        await new Promise((r) => ctl.signal.addEventListener("abort", r, { once: true }));
      }
      try {
        for await (const a of client(front).modelStreamInfer(requests(), { signal: ctl.signal })) {
          if (firsts.length < 2 && !firsts.some((f) => f.startsWith(`long${i} `))) firsts.push(read(a));
        }
      } catch (err) {
        if (!(err instanceof ConnectError) || err.code !== Code.Canceled) throw err;
      }
    });
    // Both requests are on R, sending (each has answered once), and hundreds of responses from done.
    await until(async () => firsts.length === 2, "both requests answering");
    expect(firsts.sort()).toEqual(["long0 1000", "long1 1000"]);
    expect(await pending(remote)).toBe(2);
    expect(await pending(front)).toBe(2);
    for (const ctl of controllers) ctl.abort();
    await Promise.all(streams);
    await until(async () => (await pending(front)) === 0 && (await pending(remote)) === 0, "no request pending");
    // Stopped on R, not run to the end (R's own pending count is 0 long before 1000 responses could be sent).
    const after = await remoteStats();
    expect(after.success.count - before.success.count).toBe(0);
  });

  it("streams an ensemble whose decoupled step is the remote model, one answer per response of the step", async () => {
    const before = await remoteStats();
    async function* requests() {
      yield create(ModelInferRequestSchema, {
        modelName: "counting",
        id: "e",
        inputs: [{ name: "N", datatype: "INT32", shape: [1n] }],
        rawInputContents: [new Uint8Array(Int32Array.of(3).buffer)],
        parameters: { triton_enable_empty_final_response: bool(true) },
      });
    }
    const answers: string[] = [];
    for await (const a of client(ensemble).modelStreamInfer(requests())) answers.push(read(a));
    expect(answers).toEqual(["e 30 final=false", "e 20 final=false", "e 10 final=false", "e empty final=true"]);
    // The step ran on R: one more request there, E has no countdown of its own.
    expect((await remoteStats()).success.count).toBe(before.success.count + 1);
    expect((await fetch(`${ensemble.http}/v2/models/countdown/ready`)).status).toBe(404);
  });
});

async function remoteStats() {
  const stats = (await (await fetch(`${remote.http}/v2/models/countdown/stats`)).json()) as {
    model_stats: { inference_stats: { success: { count: number }; fail: { count: number } } }[];
  };
  return stats.model_stats[0]!.inference_stats;
}
