/**
 * A C-core gRPC peer for interop tests: python/kserve_grpc.py on grpcio, the
 * gRPC library under Triton's own Python client (tritonclient.grpc) and the
 * same core as Triton's C++ server. grpc-js and Connect share no code with it,
 * so it catches what a Node-only pair of ends would agree on wrongly.
 *
 * Needs a python3 that imports grpc and google.protobuf (Debian:
 * `apt-get install python3-grpcio python3-protobuf`; .ci/run installs them).
 */
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { create, type JsonObject, type JsonValue, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { file_grpc_service, file_model_config } from "@trellis/protocol";

const SCRIPT = join(import.meta.dirname, "..", "python", "kserve_grpc.py");
const CANDIDATES = [process.env.TRELLIS_PYTHON, "/usr/bin/python3", "python3"].filter((p): p is string => !!p);
const INSTALL_HINT = "apt-get install python3-grpcio python3-protobuf (or set TRELLIS_PYTHON)";

let found: { python?: string; missing?: string } | undefined;

/** The first python3 that imports grpc and google.protobuf, or why there is none. */
export function findPythonGrpc(): { python?: string; missing?: string } {
  if (found) return found;
  const tried: string[] = [];
  for (const python of CANDIDATES) {
    try {
      execFileSync(python, ["-c", "import grpc, google.protobuf"], { stdio: "pipe" });
      found = { python };
      return found;
    } catch (err) {
      tried.push(`${python}: ${(err as { stderr?: Buffer }).stderr?.toString().trim().split("\n").pop() ?? err}`);
    }
  }
  found = { missing: `no python3 with grpcio and protobuf (${tried.join("; ")}); ${INSTALL_HINT}` };
  return found;
}

/**
 * Whether interop tests must run: always in CI (.ci/run installs grpcio), and
 * wherever grpcio is installed. Elsewhere they are skipped with the reason logged.
 */
export function pythonGrpcRequired(): boolean {
  const { missing } = findPythonGrpc();
  if (missing && !process.env.CI) console.warn(`C-core gRPC interop tests skipped: ${missing}`);
  return !missing || !!process.env.CI;
}

function python(): string {
  const { python, missing } = findPythonGrpc();
  if (!python) throw new Error(missing);
  return python;
}

let descriptors: string | undefined;

/** Our grpc_service.proto and its import as a FileDescriptorSet file, written once per process. */
function descriptorSet(): string {
  if (!descriptors) {
    const set = create(FileDescriptorSetSchema, { file: [file_model_config.proto, file_grpc_service.proto] });
    descriptors = join(mkdtempSync(join(tmpdir(), "trellis-descriptors-")), "grpc_service.binpb");
    writeFileSync(descriptors, toBinary(FileDescriptorSetSchema, set));
  }
  return descriptors;
}

/** One call of inference.GRPCInferenceService; messages in proto3 JSON (toJson of our schemas). */
export interface PythonGrpcCall {
  method: string;
  /** A unary call's request. */
  request?: JsonValue;
  /** A client-streaming call's requests, sent in order. */
  requests?: JsonValue[];
  /** The call's deadline in seconds (grpc-timeout). */
  timeout?: number;
  compression?: "gzip" | "deflate";
  metadata?: Record<string, string>;
}

export interface PythonGrpcResult {
  response?: JsonObject;
  responses?: JsonObject[];
  /** grpcio's status code name (e.g. "INVALID_ARGUMENT") and details. */
  error?: { code: string; details: string };
}

/** TLS for the grpcio channel: PEM file paths. */
export interface PythonGrpcTls {
  /** The CA to trust. */
  rootCert: string;
  /** A client certificate and its key, for mutual TLS. */
  cert?: string;
  key?: string;
}

/** Makes `calls` in order on one grpcio channel to `address` ("host:port"), cleartext or with `tls`. */
export async function pythonGrpcCalls(
  address: string,
  calls: PythonGrpcCall[],
  tls?: PythonGrpcTls,
): Promise<PythonGrpcResult[]> {
  const tlsArgs = tls
    ? ["--root-cert", tls.rootCert, ...(tls.cert && tls.key ? ["--cert", tls.cert, "--key", tls.key] : [])]
    : [];
  const child = spawn(python(), [SCRIPT, descriptorSet(), "client", address, ...tlsArgs], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => {
    stdout += String(d);
  });
  child.stderr.on("data", (d) => {
    stderr += String(d);
  });
  child.stdin.end(JSON.stringify(calls));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  if (code !== 0) throw new Error(`kserve_grpc.py client exited with ${code}:\n${stderr}`);
  return JSON.parse(stdout) as PythonGrpcResult[];
}

/** A model the stand-in server hosts, as Triton would host a TensorRT engine. */
export interface PythonKServeModel {
  /** The ModelConfig Triton would report, in proto3 JSON. */
  config: JsonObject;
  /** What it computes per input: the bytes as they came, or FP16 y = 2x. */
  compute: "identity" | "double_fp16";
  /** Held this long before answering (a cancelled call stops waiting). */
  delayMs?: number;
}

export interface PythonKServeServer {
  port: number;
  /** http://127.0.0.1:port */
  url: string;
  /** Ids of held calls the server saw cancelled, in order. */
  cancelled: string[];
  stop(): Promise<void>;
}

/** Starts a grpcio KServe v2 server on an ephemeral loopback port hosting `models`. */
export async function startPythonKServe(models: PythonKServeModel[]): Promise<PythonKServeServer> {
  const dir = mkdtempSync(join(tmpdir(), "trellis-kserve-"));
  const spec = join(dir, "models.json");
  writeFileSync(
    spec,
    JSON.stringify({ models: models.map((m) => ({ config: m.config, compute: m.compute, delay_ms: m.delayMs ?? 0 })) }),
  );
  const child = spawn(python(), [SCRIPT, descriptorSet(), "serve", spec], { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => {
    stderr += String(d);
  });
  const exited = new Promise<void>((resolve) => child.on("close", () => resolve()));
  const cancelled: string[] = [];
  const port = await new Promise<number>((resolve, reject) => {
    createInterface({ input: child.stdout }).on("line", (line) => {
      const m = /^listening (\d+)$/.exec(line);
      if (m) resolve(Number(m[1]));
      if (line.startsWith("cancelled ")) cancelled.push(line.slice("cancelled ".length));
    });
    exited.then(() => reject(new Error(`kserve_grpc.py serve exited before listening:\n${stderr}`)));
  });
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    cancelled,
    stop: async () => {
      child.stdin.end();
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}
