/**
 * tritonserver's command line, black-box: a pasted Triton command line starts,
 * the flags that mean something here do it (--id, --model-store,
 * --disable-auto-complete-config, --response-cache-byte-size, CPU metrics,
 * log switches and format, load threads and retries, gRPC keepalive and
 * connection age, header forwarding, inference response compression), the ones that mean nothing are named in warnings, and values
 * asking for what the server lacks stop it at start.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { copyFile, mkdir, readFile, writeFile } from "node:fs/promises";
import http2 from "node:http2";
import net from "node:net";
import { join } from "node:path";
import { gunzipSync, gzipSync, inflateSync } from "node:zlib";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { compressedFlag, encodeEnvelope } from "@connectrpc/connect/protocol";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { compressionDeflate, frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, ModelInferRequestSchema, ModelInferResponseSchema } from "@trellis/protocol";
import { MOBILENET_PATH, removeDir, type ServerProcess, startServerProcess, startupRefusal } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  addModel,
  echoConfig,
  echoInferMessage,
  freePort,
  grpcClientOf,
  makeRepository,
  postJson,
  scrape,
} from "./helpers.js";

const SERVER_MAIN = join(import.meta.dirname, "..", "dist", "main.js");

async function until(check: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 25));
  }
}

const warnings = (server: ServerProcess) => server.logs.filter((l) => l.level === 40).map((l) => String(l.msg));

/** A gRPC ModelInfer of the echo model as raw HTTP/2 frames, held `delayMs` by the model. */
function echoCall(session: http2.ClientHttp2Session, delayMs: number): Promise<{ grpcStatus?: string; error?: Error }> {
  const message = toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: "echo",
      parameters: { delay_ms: { parameterChoice: { case: "stringParam", value: String(delayMs) } } },
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
      rawInputContents: [new Uint8Array(16)],
    }),
  );
  const stream = session.request({
    ":method": "POST",
    ":path": "/inference.GRPCInferenceService/ModelInfer",
    "content-type": "application/grpc",
    te: "trailers",
  });
  stream.end(encodeEnvelope(0, message));
  stream.resume();
  return new Promise((resolve) => {
    let grpcStatus: string | undefined;
    stream.on("trailers", (trailers) => {
      grpcStatus = String(trailers["grpc-status"]);
    });
    stream.on("error", (error) => resolve({ error }));
    stream.on("close", () => resolve({ grpcStatus }));
  });
}

let repo: string;
beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo", { extra: "response_cache { enable: true }" }) },
  });
  // The shared MobileNetV2 with a config naming only its platform: it loads only if auto-complete may fill it in.
  await mkdir(join(repo, "mobilenet", "1"), { recursive: true });
  await writeFile(join(repo, "mobilenet", "config.pbtxt"), 'platform: "onnxruntime_onnx"\n');
  await copyFile(MOBILENET_PATH, join(repo, "mobilenet", "1", "model.onnx"));
});
afterAll(() => removeDir(repo));

describe("a pasted tritonserver command line", () => {
  let server: ServerProcess;
  beforeAll(async () => {
    // Flags as real Triton deployment scripts pass them (values spelt as they do).
    server = await startServerProcess([
      `--model-store=${repo}`,
      "--id=FasterTransformer-T5",
      "--disable-auto-complete-config",
      // "mobilenet" (a config naming only its platform) fails to load under it, as in tritonserver.
      "--exit-on-error=false",
      "--log-info",
      "True",
      "--log-warning=true",
      "--log-error=true",
      "--metrics-interval-ms",
      "100",
      "--allow-cpu-metrics=true",
      "--allow-gpu-metrics=false",
      "--http-thread-count",
      "10",
      "--buffer-manager-thread-count",
      "8",
      "--pinned-memory-pool-byte-size",
      "2000000000",
      "--cuda-memory-pool-byte-size",
      "0:536870912",
      "--response-cache-byte-size",
      "1048576",
      "--rate-limit",
      "execution_count",
      "--backend-directory",
      "/opt/tritonserver/backends",
      "--grpc-infer-allocation-pool-size",
      "20",
      "--exit-timeout-secs",
      "60",
    ]);
  });
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
  });

  it("names the server with --id over HTTP and gRPC", async () => {
    expect(((await (await fetch(`${server.http}/v2`)).json()) as { name: string }).name).toBe("FasterTransformer-T5");
    const client = grpcClientOf(server);
    expect((await client.serverMetadata({})).name).toBe("FasterTransformer-T5");
  });

  it("warns once for each flag that has no effect here, naming it and why", () => {
    const noEffect = warnings(server).filter((m) => m.includes(" has no effect: "));
    expect(noEffect.map((m) => m.split(" has no effect")[0])).toEqual([
      "--pinned-memory-pool-byte-size=2000000000",
      "--cuda-memory-pool-byte-size=0:536870912",
      "--backend-directory=/opt/tritonserver/backends",
      "--buffer-manager-thread-count=8",
      "--http-thread-count=10",
      "--grpc-infer-allocation-pool-size=20",
    ]);
    expect(noEffect[0]).toContain("allocates no GPU memory");
  });

  it("loads no model whose config needs auto-completing (--disable-auto-complete-config)", async () => {
    const index = (await postJson(`${server.http}/v2/repository/index`, {})).json as {
      name: string;
      state: string;
      reason: string;
    }[];
    expect(index.find((m) => m.name === "echo")?.state).toBe("READY");
    const mobilenet = index.find((m) => m.name === "mobilenet");
    expect(mobilenet?.state).toBe("UNAVAILABLE");
    expect(mobilenet?.reason).toContain("strict model config needs input and output sections");
  });

  it("caches responses with --response-cache-byte-size", async () => {
    const body = { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] };
    for (let i = 0; i < 2; i++) {
      expect((await postJson(`${server.http}/v2/models/echo/infer`, body)).status).toBe(200);
    }
    const stats = (await (await fetch(`${server.http}/v2/models/echo/stats`)).json()) as {
      model_stats: { inference_stats: { cache_hit?: { count: number } } }[];
    };
    expect(stats.model_stats[0]?.inference_stats.cache_hit?.count).toBe(1);
  });

  it("samples CPU utilization every --metrics-interval-ms", async () => {
    const utilization = async () => {
      const line = (await scrape(server)).split("\n").find((l) => l.startsWith("nv_cpu_utilization "));
      return Number(line?.split(" ")[1]);
    };
    // A process keeps one core busy for a while: the last interval's utilization, read
    // meanwhile, cannot be 0 (the gauge reads the last whole interval, not since start).
    const burner = spawn(process.execPath, ["-e", "const end = Date.now() + 2000; while (Date.now() < end);"]);
    const exited = new Promise((r) => burner.once("exit", r));
    await new Promise((r) => setTimeout(r, 500));
    const value = await utilization();
    burner.kill();
    await exited;
    expect(value).toBeGreaterThan(0);
    expect(value).toBeLessThanOrEqual(1);
    expect(await scrape(server)).toContain("nv_cpu_memory_used_bytes ");
  });
});

it("leaves the CPU metrics out with --allow-cpu-metrics false", async () => {
  const server = await startServerProcess([
    "--model-repository",
    repo,
    "--allow-cpu-metrics=false",
    "--load-model",
    "echo",
  ]);
  try {
    // --load-model picks models in explicit mode only: here every model loads, and a warning says so.
    expect(warnings(server)).toContain(
      "--load-model has no effect with --model-control-mode=none: every model is loaded at start (it picks models in explicit mode)",
    );
    const text = await scrape(server);
    expect(text).toContain("nv_inference_request_success");
    expect(text).not.toContain("nv_cpu_");
  } finally {
    expect(await server.stop()).toBe(0);
  }
});

it("stops at start, saying why, for values asking for what it lacks or flags that do not fit", async () => {
  for (const [args, message] of [
    [["--model-namespacing"], "--model-namespacing: models are named without namespaces here"],
    [["--reuse-grpc-port", "1"], "--reuse-grpc-port: sharing a port needs Node 22's reusePort"],
    [["--rate-limit", "sometimes"], "argument 'sometimes' is invalid. Allowed choices are off, execution_count."],
    [["--grpc-max-connection-age-grace", "100"], "--grpc-max-connection-age-grace needs --grpc-max-connection-age"],
    [["--response-cache-byte-size", "lots"], "--response-cache-byte-size lots: expected a whole number of bytes"],
    [["--log-verbose", "loud"], "a level 0 or more, or true/false"],
    [["--model-load-thread-count", "0"], "a whole number, 1 or more"],
    [
      ["--model-control-mode", "explicit", "--load-model=*", "--load-model", "echo"],
      "--load-model=* loads every model: it must be the only --load-model",
    ],
  ] as const) {
    const err = await startupRefusal(["--model-repository", repo, ...args]);
    expect(String(err), args.join(" ")).toContain(message);
  }
  const none = await startupRefusal([]);
  expect(String(none)).toContain("trellis-server: --model-repository <path> is required");
});

describe("log switches and format", () => {
  // Its own ports (freePort): with info lines off, the server does not log the ones it picked.
  it("keeps only the levels switched on, writes ISO 8601 times, and changes both at run time", async () => {
    const logRepo = await makeRepository({
      echo: { config: echoConfig("echo") },
      broken: { config: echoConfig("broken", { params: { fail_loads: "9" } }) },
    });
    const [httpPort, grpcPort, metricsPort] = [await freePort(), await freePort(), await freePort()];
    const proc: ChildProcess = spawn(
      process.execPath,
      [
        SERVER_MAIN,
        "--model-repository",
        logRepo,
        "--no-fetch-models",
        ...["--http-port", String(httpPort), "--grpc-port", String(grpcPort), "--metrics-port", String(metricsPort)],
        ...["--model-control-mode", "explicit", "--load-model", "broken", "--exit-on-error=false"],
        "--log-info=false",
        "--log-format",
        "ISO8601",
        "--http-thread-count",
        "4",
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    const lines: Record<string, unknown>[] = [];
    proc.stdout?.on("data", (d: Buffer) => {
      for (const line of String(d).split("\n").filter(Boolean)) lines.push(JSON.parse(line));
    });
    const base = `http://127.0.0.1:${httpPort}`;
    try {
      await until(async () => (await fetch(`${base}/v2/health/live`).catch(() => undefined))?.status === 200);
      await until(() => lines.some((l) => l.level === 50));
      // Warnings and errors, no info lines (not even "listening" or "server started").
      expect(lines.filter((l) => l.level === 30)).toEqual([]);
      expect(lines.find((l) => l.level === 40)?.msg).toBe(
        "--http-thread-count=4 has no effect: requests are served by Node's event loop, with no such threads or pools to size",
      );
      expect(lines.find((l) => l.level === 50)?.msg).toBe("model failed to load");
      for (const line of lines) expect(line.time).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

      const settings = await (await fetch(`${base}/v2/logging`)).json();
      expect(settings).toMatchObject({ log_info: false, log_warning: true, log_error: true, log_format: "ISO8601" });
      expect((await postJson(`${base}/v2/logging`, { log_info: true, log_format: "default" })).status).toBe(200);
      expect((await postJson(`${base}/v2/repository/models/echo/load`, {})).status).toBe(200);
      await until(() => lines.some((l) => l.msg === "model loaded"));
      const loaded = lines.find((l) => l.msg === "model loaded");
      expect(loaded?.level).toBe(30);
      expect(typeof loaded?.time).toBe("number");
      expect((await postJson(`${base}/v2/logging`, { log_format: "json" })).json.error).toBe(
        "log_format 'json' is not supported (formats: default, ISO8601)",
      );
    } finally {
      proc.kill("SIGTERM");
      await new Promise((r) => proc.once("exit", r));
      await removeDir(logRepo);
    }
  });
});

describe("model loading", () => {
  let loadRepo: string;
  let loadLog: string;
  beforeAll(async () => {
    loadRepo = await makeRepository({});
    loadLog = join(loadRepo, "loads.log");
    for (const name of ["a", "b", "c", "d"]) {
      await addModel(loadRepo, name, {
        config: echoConfig(name, { params: { load_delay_ms: "300", load_log: loadLog } }),
      });
    }
  });
  afterAll(() => removeDir(loadRepo));

  /** The most loads under way at once, from the log the models write. */
  const mostAtOnce = async () => {
    let now = 0;
    let most = 0;
    for (const line of (await readFile(loadLog, "utf8")).split("\n").filter(Boolean)) {
      now += line.startsWith("start ") ? 1 : -1;
      most = Math.max(most, now);
    }
    return most;
  };

  it("loads at most --model-load-thread-count models at once", async () => {
    for (const [threads, expected] of [
      ["1", 1],
      ["4", 4],
    ] as const) {
      await writeFile(loadLog, "");
      const server = await startServerProcess(["--model-repository", loadRepo, "--model-load-thread-count", threads]);
      try {
        const ready = server.logs.filter((l) => l.msg === "model loaded").map((l) => l.model);
        expect(ready.sort()).toEqual(["a", "b", "c", "d"]);
        expect(await mostAtOnce(), `--model-load-thread-count ${threads}`).toBe(expected);
      } finally {
        expect(await server.stop()).toBe(0);
      }
    }
  });

  it("tries a failing load again --model-load-retry-count times before reporting it", async () => {
    const retryRepo = await makeRepository({
      flaky: { config: echoConfig("flaky", { params: { fail_loads: "2" } }) },
    });
    try {
      const patient = await startServerProcess(["--model-repository", retryRepo, "--model-load-retry-count", "2"]);
      try {
        const retries = patient.logs.filter((l) => l.msg === "model failed to load: trying again");
        expect(retries.map((l) => [l.attempt, l.reason])).toEqual([
          [1, "asked to fail load 1 of 2"],
          [2, "asked to fail load 2 of 2"],
        ]);
        expect((await fetch(`${patient.http}/v2/models/flaky/ready`)).status).toBe(200);
      } finally {
        expect(await patient.stop()).toBe(0);
      }
      const hasty = await startServerProcess([
        ...["--model-repository", retryRepo, "--model-load-retry-count", "1"],
        "--exit-on-error=false",
      ]);
      try {
        const index = (await postJson(`${hasty.http}/v2/repository/index`, {})).json as {
          state: string;
          reason: string;
        }[];
        expect(index[0]).toMatchObject({ state: "UNAVAILABLE", reason: "asked to fail load 2 of 2" });
      } finally {
        expect(await hasty.stop()).toBe(0);
      }
    } finally {
      await removeDir(retryRepo);
    }
  });
});

describe("gRPC connections", () => {
  it("pings idle connections with --grpc-keepalive-permit-without-calls, and closes one whose peer never answers", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      ...["--grpc-keepalive-time", "100", "--grpc-keepalive-timeout", "300", "--grpc-keepalive-permit-without-calls"],
      // No limit on pings while the server sends nothing (gRPC core's default stops after 2).
      ...["--grpc-http2-max-pings-without-data", "0"],
    ]);
    try {
      // Node's client answers pings: the connection stays, pinged every 100 ms.
      const session = http2.connect(server.grpc);
      let pings = 0;
      session.on("ping", () => pings++);
      await until(() => pings >= 3);
      expect(session.closed || session.destroyed).toBe(false);
      session.close();

      // A peer that speaks HTTP/2 but never acknowledges a PING is cut off after the timeout.
      const socket = net.connect(server.grpcPort, "127.0.0.1");
      let sawPing = false;
      let received = Buffer.alloc(0);
      socket.on("data", (d: Buffer) => {
        received = Buffer.concat([received, d]);
        while (received.length >= 9) {
          const length = received.readUIntBE(0, 3);
          if (received.length < 9 + length) break;
          const [type, flags] = [received[3], received[4] ?? 0];
          if (type === 6 && !(flags & 1)) sawPing = true;
          // Acknowledge the server's SETTINGS, as a client must; never its PINGs.
          if (type === 4 && !(flags & 1)) socket.write(Buffer.from([0, 0, 0, 4, 1, 0, 0, 0, 0]));
          received = received.subarray(9 + length);
        }
      });
      socket.write(Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
      socket.write(Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])); // empty SETTINGS
      const closed = new Promise((r) => socket.once("close", r));
      await until(() => socket.destroyed, 5000);
      await closed;
      expect(sawPing).toBe(true);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("stops pinging after --grpc-http2-max-pings-without-data pings while it sends nothing (2 by default)", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      ...["--grpc-keepalive-time", "100", "--grpc-keepalive-permit-without-calls"],
    ]);
    try {
      const session = http2.connect(server.grpc);
      let pings = 0;
      session.on("ping", () => pings++);
      await new Promise((r) => setTimeout(r, 700));
      expect(pings).toBe(2);
      // A call is data sent: the count starts again.
      expect((await echoCall(session, 0)).grpcStatus).toBe("0");
      await until(() => pings === 4);
      session.close();
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("closes with GOAWAY too_many_pings a client that pings an idle connection too often, as gRPC core does", async () => {
    const server = await startServerProcess(["--model-repository", repo]);
    const flood = async (session: http2.ClientHttp2Session, n: number) => {
      // Once connected: pings queued before the server's session is set up go unseen by it.
      if (!session.connecting) await Promise.resolve();
      else await once(session, "connect");
      for (let i = 0; i < n && !session.destroyed; i++) {
        await new Promise<void>((resolve) => {
          if (!session.ping(() => resolve())) resolve();
        });
      }
    };
    try {
      // No call in flight and no permission to ping without one: gRPC core's floor is 2 hours,
      // so the second ping is a strike, and past 2 strikes the connection goes.
      const session = http2.connect(server.grpc);
      const goaway = new Promise<[number, Buffer | undefined]>((resolve) =>
        session.on("goaway", (code, _last, data) => resolve([code, data])),
      );
      session.on("error", () => undefined);
      await flood(session, 5);
      const [code, data] = await goaway;
      expect(code).toBe(0xb); // ENHANCE_YOUR_CALM
      expect(String(data)).toBe("too_many_pings");
      // Pings during a call are let be.
      const busy = http2.connect(server.grpc);
      let closed = false;
      busy.on("close", () => {
        closed = true;
      });
      const call = echoCall(busy, 500);
      await new Promise((r) => setTimeout(r, 50));
      await flood(busy, 5);
      expect((await call).grpcStatus).toBe("0");
      expect(closed).toBe(false);
      busy.close();
    } finally {
      expect(await server.stop()).toBe(0);
    }
    // --grpc-http2-max-ping-strikes 0: no limit.
    const lenient = await startServerProcess(["--model-repository", repo, "--grpc-http2-max-ping-strikes", "0"]);
    try {
      const session = http2.connect(lenient.grpc);
      await flood(session, 6);
      expect(session.destroyed || session.closed).toBe(false);
      session.close();
    } finally {
      expect(await lenient.stop()).toBe(0);
    }
  });

  it("pings only connections with calls in flight by default", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      ...["--grpc-keepalive-time", "100", "--grpc-keepalive-timeout", "1000"],
    ]);
    try {
      const session = http2.connect(server.grpc);
      let pings = 0;
      session.on("ping", () => pings++);
      await new Promise((r) => setTimeout(r, 400));
      expect(pings).toBe(0);
      // A call held 600 ms by the model: pinged meanwhile, and it still succeeds.
      const call = await echoCall(session, 600);
      expect(call.grpcStatus).toBe("0");
      expect(pings).toBeGreaterThanOrEqual(2);
      session.close();
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("sends GOAWAY at --grpc-max-connection-age, letting calls finish within the grace", async () => {
    const server = await startServerProcess([
      "--model-repository",
      repo,
      ...["--grpc-max-connection-age", "300", "--grpc-max-connection-age-grace", "500"],
    ]);
    try {
      const session = http2.connect(server.grpc);
      let goawayAt = 0;
      const opened = Date.now();
      session.on("goaway", () => {
        goawayAt = Date.now() - opened;
      });
      session.on("error", () => undefined);
      const [finishes, cut] = await Promise.all([echoCall(session, 400), echoCall(session, 2000)]);
      expect(goawayAt).toBeGreaterThanOrEqual(250);
      // In flight at the GOAWAY: the 400 ms call finishes; the 2 s one outlives the grace and is cut.
      expect(finishes.grpcStatus).toBe("0");
      expect(cut.grpcStatus).toBeUndefined();
      session.destroy();
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });
});

describe("header forwarding", () => {
  let server: ServerProcess;
  let reflectRepo: string;
  beforeAll(async () => {
    reflectRepo = await makeRepository({
      reflect: {
        config: echoConfig("reflect", { datatype: "TYPE_STRING", dims: [1], params: { reflect_parameters: "1" } }),
      },
    });
    server = await startServerProcess([
      "--model-repository",
      reflectRepo,
      ...["--http-header-forward-pattern", "PREFIX_.*", "--grpc-header-forward-pattern", "(?-i)^tenant$"],
    ]);
  });
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
    await removeDir(reflectRepo);
  });

  /** The parameters the model saw, which it answers with. */
  const overHttp = async (headers: Record<string, string>, parameters?: Record<string, string>) => {
    const res = await fetch(`${server.http}/v2/models/reflect/infer`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ parameters, inputs: [{ name: "INPUT", datatype: "BYTES", shape: [1, 1], data: ["x"] }] }),
    });
    const json = (await res.json()) as { outputs: { data: string[] }[] };
    return JSON.parse(json.outputs[0]?.data[0] ?? "null");
  };
  const overGrpc = async (transport: ReturnType<typeof createGrpcTransport>) => {
    const client = createClient(GRPCInferenceService, transport);
    const raw = frameBytes([new TextEncoder().encode("x")]);
    const res = await client.modelInfer(
      {
        modelName: "reflect",
        inputs: [{ name: "INPUT", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [raw],
      },
      { headers: { tenant: "acme", prefix_x: "y" } },
    );
    return JSON.parse(new TextDecoder().decode((res.rawOutputContents[0] as Uint8Array).subarray(4)));
  };

  it("gives the model an HTTP request's matching headers as parameters, ignoring case; the request's own win", async () => {
    expect(await overHttp({ PREFIX_Tenant: "acme", "x-other": "no" })).toEqual({ prefix_tenant: "acme" });
    expect(await overHttp({ prefix_tenant: "acme" }, { prefix_tenant: "mine", n: "1" })).toEqual({
      prefix_tenant: "mine",
      n: "1",
    });
  });

  it("forwards gRPC metadata under the gRPC pattern, over gRPC and over Connect on the HTTP port", async () => {
    expect(await overGrpc(createGrpcTransport({ baseUrl: server.grpc }))).toEqual({ tenant: "acme" });
    expect(await overGrpc(createConnectTransport({ baseUrl: server.http, httpVersion: "1.1" }))).toEqual({
      tenant: "acme",
    });
  });

  it("stops at start on a pattern that is not a regular expression", async () => {
    const err = await startupRefusal(["--model-repository", reflectRepo, "--http-header-forward-pattern", "PREFIX_("]);
    expect(String(err)).toContain("argument 'PREFIX_(' is invalid. a regular expression (Invalid regular expression");
  });
});

describe("--grpc-infer-response-compression-level", () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess([
      "--model-repository",
      repo,
      ...["--grpc-infer-response-compression-level", "high"],
    ]);
  });
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
  });

  /** One ModelInfer of the echo model over raw HTTP/2 (the direct path): the answer's encoding and its output. */
  const inferAccepting = async (accept?: string, compressRequest = false) => {
    const session = http2.connect(server.grpc);
    try {
      const message = echoInferMessage();
      const stream = session.request({
        ":method": "POST",
        ":path": "/inference.GRPCInferenceService/ModelInfer",
        "content-type": "application/grpc",
        te: "trailers",
        ...(accept ? { "grpc-accept-encoding": accept } : {}),
        ...(compressRequest ? { "grpc-encoding": "gzip" } : {}),
      });
      // A compressed request takes Connect's handler rather than the direct path.
      stream.end(compressRequest ? encodeEnvelope(compressedFlag, gzipSync(message)) : encodeEnvelope(0, message));
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      const [headers] = (await once(stream, "response")) as [http2.IncomingHttpHeaders];
      await once(stream, "end");
      const body = Buffer.concat(chunks);
      const encoding = headers["grpc-encoding"] as string | undefined;
      const payload = body.subarray(5);
      expect(body[0]).toBe(encoding ? 1 : 0);
      const raw = encoding === "gzip" ? gunzipSync(payload) : encoding === "deflate" ? inflateSync(payload) : payload;
      const response = fromBinary(ModelInferResponseSchema, raw);
      return { encoding, output: [...new Float32Array(Uint8Array.from(response.rawOutputContents[0] ?? []).buffer)] };
    } finally {
      session.close();
    }
  };

  it("compresses ModelInfer answers with the algorithm gRPC core picks among those the client accepts", async () => {
    expect(await inferAccepting("identity,deflate,gzip")).toEqual({ encoding: "deflate", output: [1, 2, 3, 4] });
    expect(await inferAccepting("gzip")).toEqual({ encoding: "gzip", output: [1, 2, 3, 4] });
    expect(await inferAccepting()).toEqual({ encoding: undefined, output: [1, 2, 3, 4] });
  });

  it("compresses inference answers through Connect's handler too, and no other method's", async () => {
    expect(await inferAccepting("identity,deflate,gzip", true)).toEqual({ encoding: "deflate", output: [1, 2, 3, 4] });
    expect(await inferAccepting("gzip", true)).toEqual({ encoding: "gzip", output: [1, 2, 3, 4] });
    // Connect's own client (which takes deflate through @trellis/stage's codec) reads the answer.
    const encodings: (string | null)[] = [];
    const client = createClient(
      GRPCInferenceService,
      createGrpcTransport({
        baseUrl: server.grpc,
        // A compressed request takes Connect's handler rather than the direct path.
        sendCompression: compressionGzip,
        compressMinBytes: 0,
        acceptCompression: [compressionGzip, compressionDeflate],
      }),
    );
    const onHeader = (h: Headers) => encodings.push(h.get("grpc-encoding"));
    const res = await client.modelInfer(
      {
        modelName: "echo",
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
        rawInputContents: [new Uint8Array(new Float32Array([5, 6, 7, 8]).buffer)],
      },
      { onHeader },
    );
    expect([...new Float32Array(Uint8Array.from(res.rawOutputContents[0] ?? []).buffer)]).toEqual([5, 6, 7, 8]);
    expect(encodings).toEqual(["deflate"]);

    // Other methods' answers stay uncompressed (Connect may name an encoding; the message flag is what counts).
    const session = http2.connect(server.grpc);
    const stream = session.request({
      ":method": "POST",
      ":path": "/inference.GRPCInferenceService/ServerMetadata",
      "content-type": "application/grpc",
      te: "trailers",
      "grpc-accept-encoding": "gzip",
    });
    stream.end(Buffer.alloc(5));
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    await once(stream, "end");
    session.close();
    expect(Buffer.concat(chunks)[0]).toBe(0);
  });
});
