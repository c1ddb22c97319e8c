/**
 * The soak's traffic against the seed ensemble: good requests whose answers are checked
 * against the MobileNetV2 reference, and bad ones that must be refused with the right
 * code. Each kind is a function of a request number, so variants rotate deterministically.
 */
import { request as httpRequest } from "node:http";
import { connect as http2Connect } from "node:http2";
import { gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { type Client, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, type ModelInferRequest, ModelInferRequestSchema } from "@trellis/protocol";
import { readFixtureImage, readReferenceTop5, TRUNCATED_PHOTO } from "@trellis/testing";

/** What a client saw: "OK", a gRPC code name, "HTTP <status>", or "CLIENT ABORT" / "NETWORK ERROR" / ... */
export interface Outcome {
  code: string;
  message: string;
  /** A successful answer's OUTPUT_RESULTS strings. */
  answers?: string[];
}

export interface Result {
  outcome: Outcome;
  /** Which variant of the kind was sent (for findings). */
  variant: string;
  /** The photos the answers must classify as the reference does, when the outcome is an answer. */
  photos?: string[];
}

export interface Kind {
  name: string;
  /** Good requests must be answered right; bad ones must get one of `expect`. */
  good: boolean;
  expect: readonly string[];
  run(i: number): Promise<Result>;
}

export interface Endpoints {
  http: string;
  grpc: string;
}

const GRPC_CODES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
];
const grpcCodeName = (code: number) => GRPC_CODES[code] ?? `gRPC ${code}`;

/** Generous: a good request slower than this counts as an error, and no call outlives the run by more. */
export const CALL_TIMEOUT_MS = 60_000;
const ENSEMBLE = "resnet50_ensemble";
const MODEL_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer";
const decoder = new TextDecoder();

export const references = readReferenceTop5();
/**
 * The photos the reference is sure of (top-1 p >= 0.5). The int8 model's close calls flip with
 * the CPU's kernels: on an AVX2 machine without VNNI, astronaut, horse.png and rocket get another
 * top-1 from the reference tensor itself, which says nothing about the server.
 */
export const PHOTOS = Object.keys(references)
  .filter((p) => (references[p]?.top5_probs[0] ?? 0) >= 0.5)
  .sort();
const photoBytes = new Map(PHOTOS.map((p) => [p, readFixtureImage(p)]));
const bytesOf = (p: string) => photoBytes.get(p) as Uint8Array;
/** `n` photos starting at the i-th, so every photo is sent in every position over the run. */
const photosAt = (i: number, n: number) =>
  Array.from({ length: n }, (_, k) => PHOTOS[(i + k) % PHOTOS.length] as string);

/** BYTES tensor contents: each element as a 4-byte little-endian length and its bytes. */
export function unframe(raw: Uint8Array): string[] {
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const out: string[] = [];
  for (let off = 0; off + 4 <= raw.byteLength; ) {
    const n = view.getUint32(off, true);
    out.push(decoder.decode(raw.subarray(off + 4, off + 4 + n)));
    off += 4 + n;
  }
  return out;
}

/** A PNG header declaring `side` x `side` RGB pixels, with a token IDAT: a decoder that honours a pixel limit refuses it unread. */
export function pixelBombPng(side: number): Uint8Array {
  const chunk = (type: string, data: Uint8Array) => {
    const out = Buffer.alloc(12 + data.length);
    out.writeUInt32BE(data.length, 0);
    out.write(type, 4, "latin1");
    out.set(data, 8);
    out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length);
    return out;
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(side, 0);
  ihdr.writeUInt32BE(side, 4);
  ihdr.set([8, 2, 0, 0, 0], 8); // 8-bit RGB, deflate, no filter, no interlace
  return new Uint8Array(
    Buffer.concat([
      Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
      chunk("IHDR", ihdr),
      chunk("IDAT", Uint8Array.from([0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01])),
      chunk("IEND", new Uint8Array(0)),
    ]),
  );
}

// zlib.crc32 arrived after Node 20.0, so PNG chunk CRCs are computed here.
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = (CRC_TABLE[(c ^ b) & 0xff] as number) ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

const ensembleRequest = (raw: Uint8Array, shape: number[], extra: { modelName?: string; modelVersion?: string } = {}) =>
  create(ModelInferRequestSchema, {
    modelName: ENSEMBLE,
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: shape.map(BigInt) }],
    rawInputContents: [raw],
    ...extra,
  });

/** Triton's binary extension: the JSON header, then the tensors' bytes. */
function binaryBody(json: object): { headers: Record<string, string>; body: Buffer } {
  const text = Buffer.from(JSON.stringify(json));
  return { headers: { "inference-header-content-length": String(text.byteLength) }, body: text };
}

/** An ensemble request body with RAW_IMAGE in binary; `declared` overrides binary_data_size (to lie). */
function httpImages(images: Uint8Array[], options: { binaryOut?: boolean; declared?: number; shape?: number[] } = {}) {
  const raw = frameBytes(images);
  const { headers, body } = binaryBody({
    inputs: [
      {
        name: "RAW_IMAGE",
        datatype: "BYTES",
        shape: options.shape ?? [images.length, 1],
        parameters: { binary_data_size: options.declared ?? raw.byteLength },
      },
    ],
    outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: options.binaryOut ?? false } }],
  });
  return { headers, body: Buffer.concat([body, raw]) };
}

async function grpcInfer(
  client: Client<typeof GRPCInferenceService>,
  req: ModelInferRequest,
  timeoutMs = CALL_TIMEOUT_MS,
): Promise<Outcome> {
  try {
    const res = await client.modelInfer(req, { timeoutMs });
    const raw = res.rawOutputContents[0];
    return {
      code: "OK",
      message: "",
      answers: raw ? unframe(raw) : res.outputs[0]?.contents?.bytesContents.map((b) => decoder.decode(b)),
    };
  } catch (err) {
    const ce = ConnectError.from(err);
    return { code: grpcCodeName(ce.code), message: ce.rawMessage };
  }
}

async function httpPost(
  url: string,
  headers: Record<string, string>,
  body: Uint8Array | string,
  timeoutMs = CALL_TIMEOUT_MS,
): Promise<Outcome> {
  let res: Response;
  try {
    res = await fetch(url, { method: "POST", headers, body, signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    const e = err as Error;
    return e.name === "TimeoutError" || e.name === "AbortError"
      ? { code: "CLIENT ABORT", message: `aborted after ${timeoutMs} ms` }
      : { code: "NETWORK ERROR", message: String((e.cause as Error | undefined)?.message ?? e.message) };
  }
  let bytes: Uint8Array;
  try {
    bytes = new Uint8Array(await res.arrayBuffer());
  } catch (err) {
    return { code: "CLIENT ABORT", message: `body cut: ${(err as Error).message}` };
  }
  const code = `HTTP ${res.status}`;
  if (res.status !== 200) return { code, message: decoder.decode(bytes.subarray(0, 300)) };
  try {
    // Binary output: a JSON header of this length, then each binary output's bytes.
    const headerLength = Number(res.headers.get("inference-header-content-length") ?? bytes.byteLength);
    const json = JSON.parse(decoder.decode(bytes.subarray(0, headerLength)));
    const out = json.outputs?.[0];
    const answers = out?.parameters?.binary_data_size !== undefined ? unframe(bytes.subarray(headerLength)) : out?.data;
    return { code, message: "", answers };
  } catch (err) {
    return { code, message: `unreadable answer: ${(err as Error).message}` };
  }
}

/** POST with the path sent as written: fetch would resolve `..` segments before sending. */
function rawHttpPost(base: string, path: string, headers: Record<string, string>, body: Uint8Array): Promise<Outcome> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve) => {
    const req = httpRequest({ hostname, port, path, method: "POST", headers, timeout: CALL_TIMEOUT_MS }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ code: `HTTP ${res.statusCode}`, message: Buffer.concat(chunks).subarray(0, 300).toString() }),
      );
      res.on("error", (e) => resolve({ code: "NETWORK ERROR", message: e.message }));
    });
    req.on("timeout", () => req.destroy(new Error(`no answer in ${CALL_TIMEOUT_MS} ms`)));
    req.on("error", (e) => resolve({ code: "NETWORK ERROR", message: e.message }));
    req.end(body);
  });
}

/**
 * One ModelInfer over a fresh HTTP/2 session with a hand-made frame, for what a gRPC client
 * library will not send: a compressed frame, bytes that are not a protobuf message.
 */
function rawGrpc(base: string, message: Uint8Array, gzip: boolean): Promise<Outcome> {
  return new Promise((resolve) => {
    const session = http2Connect(base);
    let settled = false;
    const finish = (o: Outcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.close();
      resolve(o);
    };
    const timer = setTimeout(() => {
      session.destroy();
      finish({ code: "CLIENT TIMEOUT", message: `no answer in ${CALL_TIMEOUT_MS} ms` });
    }, CALL_TIMEOUT_MS);
    session.on("error", (e) => finish({ code: "NETWORK ERROR", message: e.message }));
    const frame = Buffer.alloc(5 + message.byteLength);
    frame[0] = gzip ? 1 : 0;
    frame.writeUInt32BE(message.byteLength, 1);
    frame.set(message, 5);
    const stream = session.request({
      ":method": "POST",
      ":path": MODEL_INFER_PATH,
      "content-type": "application/grpc",
      te: "trailers",
      ...(gzip ? { "grpc-encoding": "gzip" } : {}),
    });
    let httpStatus = 0;
    let status: string | undefined;
    let detail = "";
    const take = (h: Record<string, unknown>) => {
      if (h[":status"] !== undefined) httpStatus = Number(h[":status"]);
      if (h["grpc-status"] === undefined) return;
      status = String(h["grpc-status"]);
      detail = decodeURIComponent(String(h["grpc-message"] ?? ""));
    };
    stream.on("response", take);
    stream.on("trailers", take);
    stream.on("data", () => {});
    stream.on("error", () => {}); // "close" follows and reports
    stream.on("close", () =>
      finish(
        status !== undefined
          ? { code: grpcCodeName(Number(status)), message: detail }
          : {
              code: httpStatus ? `HTTP ${httpStatus}` : "NO STATUS",
              message: `stream closed, RST code ${stream.rstCode}`,
            },
      ),
    );
    stream.end(frame);
  });
}

/** A kind with variants: request i sends variant i mod n. */
function variants<T>(list: readonly (readonly [string, T])[], i: number): readonly [string, T] {
  return list[i % list.length] as readonly [string, T];
}

const INVALID = ["INVALID_ARGUMENT"] as const;
const HTTP_400 = ["HTTP 400"] as const;

/** Every kind of request the soak sends: the good ones first. */
export function soakKinds(server: Endpoints): Kind[] {
  const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.grpc }));
  const inferUrl = (model = ENSEMBLE) => `${server.http}/v2/models/${model}/infer`;
  const chelsea = bytesOf("chelsea.jpg");
  const truncated = readFixtureImage(TRUNCATED_PHOTO);
  const pngBomb = pixelBombPng(50_000);
  // Deterministic "random" bytes, so a finding can be replayed.
  const noise = Uint8Array.from({ length: 4096 }, (_, k) => (k * 2654435761) >>> 24);
  // 80 MiB of zeros in RAW_IMAGE (over the 64 MiB a plain HTTP body may hold), gzipped to ~80 KB.
  const bomb = gzipSync(toBinary(ModelInferRequestSchema, ensembleRequest(new Uint8Array(80 << 20), [1, 1])), {
    level: 9,
  });
  const shortDeadlines = [1, 5, 20, 50];

  const goodGrpc = (n: number): Kind => ({
    name: `grpc good x${n}`,
    good: true,
    expect: ["OK"],
    run: async (i) => {
      const photos = photosAt(i, n);
      return {
        variant: photos.join(","),
        photos,
        outcome: await grpcInfer(client, ensembleRequest(frameBytes(photos.map(bytesOf)), [n, 1])),
      };
    },
  });
  const goodHttp = (n: number, binaryOut: boolean): Kind => ({
    name: `http good x${n} (${binaryOut ? "binary" : "JSON"} out)`,
    good: true,
    expect: ["HTTP 200"],
    run: async (i) => {
      const photos = photosAt(i, n);
      const { headers, body } = httpImages(photos.map(bytesOf), { binaryOut });
      return { variant: photos.join(","), photos, outcome: await httpPost(inferUrl(), headers, body) };
    },
  });
  const badGrpc = (
    name: string,
    expect: readonly string[],
    list: readonly (readonly [string, () => ModelInferRequest])[],
  ): Kind => ({
    name: `grpc ${name}`,
    good: false,
    expect,
    run: async (i) => {
      const [variant, make] = variants(list, i);
      return { variant, outcome: await grpcInfer(client, make()) };
    },
  });
  const badHttp = (
    name: string,
    expect: readonly string[],
    list: readonly (readonly [
      string,
      () => { url: string; headers: Record<string, string>; body: Uint8Array | string },
    ])[],
  ): Kind => ({
    name: `http ${name}`,
    good: false,
    expect,
    run: async (i) => {
      const [variant, make] = variants(list, i);
      const { url, headers, body } = make();
      return { variant, outcome: await httpPost(url, headers, body) };
    },
  });
  const httpImage = (images: Uint8Array[], url = inferUrl()) => ({ url, ...httpImages(images) });
  const jsonBody = (url: string, json: unknown) => ({
    url,
    headers: { "content-type": "application/json" },
    body: JSON.stringify(json),
  });
  const hugeFp32 = { name: "input", datatype: "FP32", shape: [1, 3, 50_000, 50_000] };

  return [
    goodGrpc(1),
    goodGrpc(3),
    goodHttp(1, false),
    goodHttp(3, true),

    badGrpc("truncated JPEG", INVALID, [
      ["[good, truncated]", () => ensembleRequest(frameBytes([chelsea, truncated]), [2, 1])],
    ]),
    badHttp("truncated JPEG", HTTP_400, [["[truncated]", () => httpImage([truncated])]]),
    badGrpc("random bytes as image", INVALID, [["4 KiB noise", () => ensembleRequest(frameBytes([noise]), [1, 1])]]),
    badHttp("random bytes as image", HTTP_400, [["[good, noise]", () => httpImage([chelsea, noise])]]),
    badGrpc(
      "unknown model",
      ["NOT_FOUND", "INVALID_ARGUMENT"],
      [
        ["no_such_model", () => ensembleRequest(frameBytes([chelsea]), [1, 1], { modelName: "no_such_model" })],
        ["../../etc/passwd", () => ensembleRequest(frameBytes([chelsea]), [1, 1], { modelName: "../../etc/passwd" })],
      ],
    ),
    badHttp(
      "unknown model",
      ["HTTP 400", "HTTP 404"],
      [["no_such_model", () => httpImage([chelsea], inferUrl("no_such_model"))]],
    ),
    badGrpc(
      "unknown model version",
      ["NOT_FOUND", "INVALID_ARGUMENT"],
      [["version 7", () => ensembleRequest(frameBytes([chelsea]), [1, 1], { modelVersion: "7" })]],
    ),
    badHttp(
      "unknown model version",
      ["HTTP 400", "HTTP 404"],
      [["version 7", () => httpImage([chelsea], `${server.http}/v2/models/${ENSEMBLE}/versions/7/infer`)]],
    ),
    badGrpc("wrong datatype", INVALID, [
      [
        "RAW_IMAGE as FP32",
        () =>
          create(ModelInferRequestSchema, {
            modelName: ENSEMBLE,
            inputs: [{ name: "RAW_IMAGE", datatype: "FP32", shape: [1n, 1n] }],
            rawInputContents: [new Uint8Array(4)],
          }),
      ],
    ]),
    badHttp("wrong datatype", HTTP_400, [
      [
        "RAW_IMAGE as INT32",
        () => jsonBody(inferUrl(), { inputs: [{ name: "RAW_IMAGE", datatype: "INT32", shape: [1, 1], data: [7] }] }),
      ],
    ]),
    badGrpc("wrong shape", INVALID, [
      ["RAW_IMAGE [1,2]", () => ensembleRequest(frameBytes([chelsea, chelsea]), [1, 2])],
    ]),
    badHttp("wrong shape", HTTP_400, [
      ["RAW_IMAGE [2] of one", () => ({ url: inferUrl(), ...httpImages([chelsea], { shape: [2] }) })],
    ]),
    badGrpc(
      "oversized declared shape",
      ["INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"],
      [
        [
          "FP32 [1,3,50000,50000] with 12 bytes",
          () =>
            create(ModelInferRequestSchema, {
              modelName: "resnet50_inference",
              inputs: [{ ...hugeFp32, shape: hugeFp32.shape.map(BigInt) }],
              rawInputContents: [new Uint8Array(12)],
            }),
        ],
        ["RAW_IMAGE [1e9,1] of one", () => ensembleRequest(frameBytes([chelsea]), [1_000_000_000, 1])],
      ],
    ),
    badHttp(
      "oversized declared shape",
      ["HTTP 400", "HTTP 413"],
      [
        [
          "FP32 [1,3,50000,50000] with 3 values",
          () => jsonBody(inferUrl("resnet50_inference"), { inputs: [{ ...hugeFp32, data: [0, 0, 0] }] }),
        ],
        ["RAW_IMAGE [2^40,1] of one", () => ({ url: inferUrl(), ...httpImages([chelsea], { shape: [2 ** 40, 1] }) })],
      ],
    ),
    badHttp("malformed JSON body", HTTP_400, [
      [
        "unterminated",
        () => ({ url: inferUrl(), headers: { "content-type": "application/json" }, body: '{"inputs": [' }),
      ],
      ["null", () => jsonBody(inferUrl(), null)],
      ["an array", () => jsonBody(inferUrl(), [])],
      ["inputs a string", () => jsonBody(inferUrl(), { inputs: "RAW_IMAGE" })],
      [
        "deep nesting",
        () => ({ url: inferUrl(), headers: { "content-type": "application/json" }, body: "[".repeat(100_000) }),
      ],
    ]),
    {
      name: "grpc malformed protobuf",
      good: false,
      expect: INVALID,
      run: async (i) => {
        const [variant, bytes] = variants(
          [
            ["model_name longer than the message", Uint8Array.of(0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x41)],
            ["field number 0", Uint8Array.of(0x00, 0x01)],
            ["wire type 7", Uint8Array.of(0x0f, 0x01, 0x02)],
          ],
          i,
        );
        return { variant, outcome: await rawGrpc(server.grpc, bytes, false) };
      },
    },
    badHttp("binary_data_size that lies", HTTP_400, [
      [
        "1000 bytes more than sent",
        () => ({ url: inferUrl(), ...httpImages([chelsea], { declared: frameBytes([chelsea]).byteLength + 1000 }) }),
      ],
      [
        "10 bytes fewer than sent",
        () => ({ url: inferUrl(), ...httpImages([chelsea], { declared: frameBytes([chelsea]).byteLength - 10 }) }),
      ],
    ]),
    badGrpc("BYTES length prefix that lies", INVALID, [
      [
        "element says 1 MB, 1000 bytes follow",
        () => {
          const raw = new Uint8Array(1004);
          new DataView(raw.buffer).setUint32(0, 1_000_000, true);
          raw.set(chelsea.subarray(0, 1000), 4);
          return ensembleRequest(raw, [1, 1]);
        },
      ],
      ["shape [2,1], one element", () => ensembleRequest(frameBytes([chelsea]), [2, 1])],
    ]),
    {
      name: "grpc gzip bomb",
      good: false,
      expect: ["RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"],
      run: async () => ({
        variant: `${(bomb.byteLength / 1024).toFixed(0)} KiB gzip of 80 MiB`,
        outcome: await rawGrpc(server.grpc, bomb, true),
      }),
    },
    badGrpc("pixel bomb", INVALID, [["PNG 50000x50000", () => ensembleRequest(frameBytes([pngBomb]), [1, 1])]]),
    badHttp("pixel bomb", HTTP_400, [["[good, PNG 50000x50000]", () => httpImage([chelsea, pngBomb])]]),
    {
      name: "http path traversal in the model name",
      good: false,
      expect: ["HTTP 400", "HTTP 404"],
      run: async (i) => {
        const [variant, path] = variants(
          [
            ["raw ..", "/v2/models/../../../../etc/passwd/infer"],
            ["%2F-encoded", "/v2/models/..%2F..%2F..%2Fetc%2Fpasswd/infer"],
            ["%2e%2e name", "/v2/models/%2e%2e/infer"],
            ["traversal in the version", `/v2/models/${ENSEMBLE}/versions/..%2F..%2F1/infer`],
          ],
          i,
        );
        const { headers, body } = httpImages([chelsea]);
        return { variant, outcome: await rawHttpPost(server.http, path, headers, body) };
      },
    },
    // A client that gives up mid-request: whatever it sees, its neighbours must not notice; if it
    // is answered after all, the answer must be right.
    {
      name: "grpc short deadline",
      good: false,
      expect: ["DEADLINE_EXCEEDED", "CANCELLED", "OK"],
      run: async (i) => {
        const ms = shortDeadlines[i % shortDeadlines.length] as number;
        const photos = photosAt(i, 3);
        return {
          variant: `${ms} ms`,
          photos,
          outcome: await grpcInfer(client, ensembleRequest(frameBytes(photos.map(bytesOf)), [3, 1]), ms),
        };
      },
    },
    {
      name: "http client abort",
      good: false,
      expect: ["CLIENT ABORT", "HTTP 200"],
      run: async (i) => {
        const ms = shortDeadlines[i % shortDeadlines.length] as number;
        const photos = photosAt(i, 3);
        const { headers, body } = httpImages(photos.map(bytesOf));
        return { variant: `after ${ms} ms`, photos, outcome: await httpPost(inferUrl(), headers, body, ms) };
      },
    },
  ];
}
