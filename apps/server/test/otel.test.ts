/**
 * Trace mode opentelemetry, black-box: the server process exports each traced
 * request as OTLP/HTTP spans to a collector (here a small HTTP server that
 * keeps what it is sent), continuing the caller's W3C trace context.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, type ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { explicitModels, grpcClientOf, jsonOf, postBinary, postJson } from "./helpers.js";

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: { key: string; value: { stringValue?: string; intValue?: number | string } }[];
  events: { name: string }[];
}

/** An OTLP/HTTP (JSON) collector on a loopback port, keeping every span and resource it is sent. */
async function startCollector() {
  const spans: OtlpSpan[] = [];
  const resources: Record<string, string>[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as {
        resourceSpans: {
          resource: { attributes: OtlpSpan["attributes"] };
          scopeSpans: { spans: OtlpSpan[] }[];
        }[];
      };
      for (const rs of body.resourceSpans) {
        resources.push(Object.fromEntries(rs.resource.attributes.map((a) => [a.key, a.value.stringValue ?? ""])));
        for (const ss of rs.scopeSpans) spans.push(...ss.spans);
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`,
    spans,
    resources,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const attribute = (span: OtlpSpan, key: string) => {
  const v = span.attributes.find((a) => a.key === key)?.value;
  return v?.stringValue ?? (v?.intValue !== undefined ? Number(v.intValue) : undefined);
};

const GRPC_CALLER = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331" };
const HTTP_CALLER = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7" };
const traceparent = (c: { traceId: string; spanId: string }) => `00-${c.traceId}-${c.spanId}-01`;

describe("--trace-config mode=opentelemetry", () => {
  let repo: string;
  let collector: Awaited<ReturnType<typeof startCollector>>;
  let server: ServerProcess;
  const photo = readFixtureImage("chelsea.jpg");

  beforeAll(async () => {
    repo = await makeSeedRepository();
    collector = await startCollector();
    server = await startServerProcess([
      "--model-repository",
      repo,
      "--trace-config",
      "mode=opentelemetry",
      "--trace-config",
      "level=TIMESTAMPS",
      // Only the requests that carry their caller's context, as Triton's rate=0.
      "--trace-config",
      "rate=0",
      "--trace-config",
      `opentelemetry,url=${collector.url}`,
      "--trace-config",
      "opentelemetry,resource=service.name=trellis-under-test",
    ]);
  });
  afterAll(async () => {
    await server?.stop();
    await collector?.close();
    await removeDir(repo);
  });

  it("exports each request's spans as Triton does, under the caller's trace, over gRPC and HTTP", async () => {
    // The trace extension reads the settings; changing them is refused in this mode, as in Triton.
    expect(await jsonOf(await fetch(`${server.http}/v2/trace/setting`))).toMatchObject({
      trace_mode: "opentelemetry",
      trace_level: ["TIMESTAMPS"],
      trace_rate: "0",
    });
    const refused = await postJson(`${server.http}/v2/trace/setting`, { trace_rate: "1" });
    expect(refused.status).toBe(501);
    expect(refused.json.error).toMatch(/^trace settings cannot be changed at run time in trace mode opentelemetry/);

    const client = grpcClientOf(server);
    const request = create(ModelInferRequestSchema, {
      modelName: "resnet50_ensemble",
      id: "with-context",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([photo])],
    });
    await client.modelInfer(request, { headers: { traceparent: traceparent(GRPC_CALLER) } });
    await client.modelInfer({ ...request, id: "without" }); // rate 0 and no context: not traced
    const res = await postBinary(
      `${server.http}/v2/models/resnet50_ensemble/infer`,
      { inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }] },
      [frameBytes([photo])],
    );
    expect(res.status).toBe(200);
    const traced = await fetch(`${server.http}/v2/models/resnet50_ensemble/infer`, {
      method: "POST",
      headers: { traceparent: traceparent(HTTP_CALLER) },
      body: JSON.stringify({
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1], data: ["not an image"] }],
      }),
    });
    expect(traced.status).toBe(400); // traced as far as it went
    expect(await server.stop("SIGTERM")).toBe(0); // exports what is queued

    expect(collector.resources.every((r) => r["service.name"] === "trellis-under-test")).toBe(true);
    expect(new Set(collector.spans.map((s) => s.traceId))).toEqual(new Set([GRPC_CALLER.traceId, HTTP_CALLER.traceId]));

    const spans = collector.spans.filter((s) => s.traceId === GRPC_CALLER.traceId);
    const byId = new Map(spans.map((s) => [s.spanId, s]));
    const children = (parent: OtlpSpan) => spans.filter((s) => s.parentSpanId === parent.spanId);
    const top = spans.find((s) => s.name === "InferRequest") as OtlpSpan;
    expect(top.parentSpanId).toBe(GRPC_CALLER.spanId);
    expect(top.events.map((e) => e.name)).toEqual([
      "GRPC_WAITREAD_START",
      "GRPC_WAITREAD_END",
      "GRPC_SEND_START",
      "GRPC_SEND_END",
    ]);
    const [ensemble] = children(top);
    expect(children(top)).toHaveLength(1);
    expect(ensemble?.name).toBe("resnet50_ensemble");
    expect(attribute(ensemble as OtlpSpan, "request_id")).toBe("with-context");
    expect(attribute(ensemble as OtlpSpan, "model_version")).toBe(1);
    expect(ensemble?.events.map((e) => e.name)).toEqual(["REQUEST_START", "QUEUE_START", "REQUEST_END"]);
    // Under the ensemble: its compute span and a span per step, each with its own compute span.
    const under = children(ensemble as OtlpSpan).map((s) => s.name);
    expect(under.sort()).toEqual(["compute", "resnet50_inference", "resnet50_postprocess", "resnet50_preprocess"]);
    for (const step of children(ensemble as OtlpSpan).filter((s) => s.name !== "compute")) {
      expect(attribute(step, "model_name")).toBe(step.name);
      const [compute] = children(step);
      expect(compute?.name).toBe("compute");
      expect(compute?.events.map((e) => e.name)).toEqual([
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
      ]);
      // Each span within its parent's time.
      const parent = byId.get(step.parentSpanId as string) as OtlpSpan;
      expect(BigInt(step.startTimeUnixNano)).toBeGreaterThanOrEqual(BigInt(parent.startTimeUnixNano));
      expect(BigInt(step.endTimeUnixNano)).toBeLessThanOrEqual(BigInt(parent.endTimeUnixNano));
    }
    expect(spans).toHaveLength(1 + 2 + 3 * 2);

    // The refused HTTP request: received, handled, refused in its first step.
    const failed = collector.spans.filter((s) => s.traceId === HTTP_CALLER.traceId).map((s) => s.name);
    expect(failed.sort()).toEqual(["InferRequest", "resnet50_ensemble", "resnet50_preprocess"]);
  });
});

it("logs what the collector refuses, and goes on serving", async () => {
  const repo = await makeSeedRepository();
  const refusing = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(400, { "content-type": "application/json" });
      res.end('{"message":"malformed"}');
    });
  });
  await new Promise<void>((resolve) => refusing.listen(0, "127.0.0.1", resolve));
  const server = await startServerProcess([
    ...explicitModels(repo, "resnet50_postprocess"),
    "--trace-config",
    "mode=opentelemetry",
    "--trace-config",
    "level=TIMESTAMPS",
    "--trace-config",
    "rate=1",
    "--trace-config",
    `opentelemetry,url=http://127.0.0.1:${(refusing.address() as AddressInfo).port}/v1/traces`,
    "--trace-config",
    "opentelemetry,bsp_schedule_delay=50",
  ]);
  try {
    const infer = () =>
      postJson(`${server.http}/v2/models/resnet50_postprocess/infer`, {
        inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1, 1000], data: new Array(1000).fill(0.5) }],
      });
    expect((await infer()).status).toBe(200);
    const warned = () => server.logs.find((l) => String(l.msg).startsWith("opentelemetry: "));
    for (let i = 0; i < 100 && !warned(); i++) await new Promise((r) => setTimeout(r, 50));
    expect(warned()?.msg).toBe('opentelemetry: OTLPExporterError: Bad Request (400) {"message":"malformed"}');
    expect(warned()?.level).toBe(40); // pino's warn
    expect((await infer()).status).toBe(200);
  } finally {
    expect(await server.stop()).toBe(0);
    await new Promise<void>((resolve) => refusing.close(() => resolve()));
    await removeDir(repo);
  }
});

it("refuses trace mode opentelemetry settings it cannot use, in one line", async () => {
  const repo = await makeSeedRepository();
  try {
    const badUrl = await startupRefusal([
      "--model-repository",
      repo,
      "--trace-config",
      "mode=opentelemetry",
      "--trace-config",
      "opentelemetry,url=localhost:4318",
    ]);
    expect(String(badUrl)).toContain(
      "trellis-server: --trace-config opentelemetry,url=localhost:4318: expected an http:// or https:// URL",
    );
    const badBatch = await startupRefusal([
      "--model-repository",
      repo,
      "--trace-config",
      "mode=opentelemetry",
      "--trace-config",
      "opentelemetry,bsp_max_export_batch_size=4096",
    ]);
    expect(String(badBatch)).toContain("must not exceed opentelemetry,bsp_max_queue_size");
  } finally {
    await removeDir(repo);
  }
});

it("refuses trace setting changes over gRPC too in this mode", async () => {
  const repo = await makeSeedRepository();
  const server = await startServerProcess([...explicitModels(repo), "--trace-config", "mode=opentelemetry"]);
  try {
    const client = grpcClientOf(server);
    expect((await client.traceSetting({})).settings.trace_mode?.value).toEqual(["opentelemetry"]);
    const refused = await client
      .traceSetting({ settings: { trace_level: { value: ["TIMESTAMPS"] } } })
      .catch((e: ConnectError) => e);
    expect((refused as ConnectError).code).toBe(Code.Unimplemented);
  } finally {
    expect(await server.stop()).toBe(0);
    await removeDir(repo);
  }
});
