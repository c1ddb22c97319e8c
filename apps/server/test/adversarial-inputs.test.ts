/**
 * Malformed inference requests over both protocols, black-box, against the
 * seed pipeline (preprocess decodes the image bytes): lying headers and
 * length prefixes, wrong shapes and datatypes, huge declared shapes, an
 * image that declares billions of pixels, and path traversal in every name a
 * client sends. Each is answered with its code and a message naming the
 * problem (no path or address), and a good request right after still
 * classifies correctly.
 */
import { deflateSync } from "node:zlib";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type createClient } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import type { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  STABLE_TOP1,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf } from "./helpers.js";

const ENSEMBLE = "resnet50_ensemble";
const PHOTO = "chelsea.jpg";

/** CRC-32 as PNG chunks carry it. */
function crc32(bytes: Uint8Array): number {
  let c = ~0;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

function chunk(type: string, data: Uint8Array): Buffer {
  const body = Buffer.concat([Buffer.from(type, "latin1"), data]);
  const out = Buffer.alloc(12 + data.length);
  out.writeUInt32BE(data.length, 0);
  body.copy(out, 4);
  out.writeUInt32BE(crc32(body), 8 + data.length);
  return out;
}

/** A valid PNG header declaring width x height (8-bit RGB) with one tiny row of data: a pixel bomb. */
function pngDeclaring(width: number, height: number): Buffer {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", deflateSync(Buffer.alloc(64))),
    chunk("IEND", new Uint8Array()),
  ]);
}

/** What an error message may not carry: server paths, addresses. */
const LEAK = /\/tmp\/|\/work\/|dist\/|node_modules|127\.0\.0\.1|localhost:\d/;

describe("malformed inference requests", () => {
  let repo: string;
  let server: ServerProcess;
  let client: ReturnType<typeof createClient<typeof GRPCInferenceService>>;
  const photo = readFixtureImage(PHOTO);
  const expected = STABLE_TOP1[PHOTO];

  beforeAll(async () => {
    repo = await makeSeedRepository();
    server = await startServerProcess(["--model-repository", repo]);
    client = grpcClientOf(server);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  /** A good request over both protocols still gets the photo's class. */
  async function goodStillAnswers(): Promise<void> {
    const raw = frameBytes([photo]);
    const grpc = await client.modelInfer({
      modelName: ENSEMBLE,
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [raw],
    });
    // OUTPUT_RESULTS: one BYTES element (4-byte length, then the seed's JSON).
    const result = JSON.parse(new TextDecoder().decode(grpc.rawOutputContents[0]!.subarray(4)));
    expect(result.top5_labels[0]).toBe(expected?.label);
    const http = await binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], raw);
    expect(http.status).toBe(200);
    const body = (await http.json()) as { outputs: { data: string[] }[] };
    expect(JSON.parse(body.outputs[0]!.data[0]!).top5_labels[0]).toBe(expected?.label);
  }

  /** An HTTP binary-extension request with `raw` as RAW_IMAGE and the header's length as given. */
  function binaryPost(
    path: string,
    shape: number[],
    raw: Uint8Array,
    tweak: { declaredSize?: number; headerLength?: string } = {},
  ): Promise<Response> {
    const header = Buffer.from(
      JSON.stringify({
        inputs: [
          {
            name: "RAW_IMAGE",
            datatype: "BYTES",
            shape,
            parameters: { binary_data_size: tweak.declaredSize ?? raw.byteLength },
          },
        ],
        outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: false } }],
      }),
    );
    return fetch(`${server.http}${path}`, {
      method: "POST",
      body: Buffer.concat([header, raw]),
      headers: { "inference-header-content-length": tweak.headerLength ?? String(header.length) },
    });
  }

  const raw = () => frameBytes([photo]);
  const httpCases: [string, () => Promise<Response>, number, RegExp][] = [
    [
      "a non-numeric Inference-Header-Content-Length",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], raw(), { headerLength: "lots" }),
      400,
      /header size|Inference-Header-Content-Length/i,
    ],
    [
      "an Inference-Header-Content-Length past the body",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], raw(), { headerLength: "99999999" }),
      400,
      /header|length|size/i,
    ],
    [
      "a binary_data_size larger than the bytes sent",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], raw(), { declaredSize: raw().byteLength + 1000 }),
      400,
      /binary_data_size|bytes/,
    ],
    [
      "a binary_data_size smaller than the bytes sent",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], raw(), { declaredSize: 10 }),
      400,
      /RAW_IMAGE|binary|bytes/,
    ],
    [
      "a BYTES element whose length prefix runs past its tensor",
      () => {
        const lying = raw();
        new DataView(lying.buffer, lying.byteOffset).setUint32(0, lying.byteLength * 2, true);
        return binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], lying);
      },
      400,
      /RAW_IMAGE/,
    ],
    [
      "a shape that declares 10^18 elements",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1_000_000_000, 1_000_000_000], raw()),
      400,
      /RAW_IMAGE|shape|batch/,
    ],
    [
      "a negative dimension",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, -1], raw()),
      400,
      /RAW_IMAGE|shape|dim/,
    ],
    [
      "a batch over max_batch_size (256)",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [300, 1], frameBytes(Array(300).fill(new Uint8Array(1)))),
      400,
      /batch/,
    ],
    [
      "an image declaring 50000 x 50000 pixels",
      () => binaryPost(`/v2/models/${ENSEMBLE}/infer`, [1, 1], frameBytes([pngDeclaring(50_000, 50_000)])),
      400,
      /pixels/,
    ],
    [
      "FP32 data for the BYTES input",
      () =>
        fetch(`${server.http}/v2/models/${ENSEMBLE}/infer`, {
          method: "POST",
          body: JSON.stringify({ inputs: [{ name: "RAW_IMAGE", datatype: "FP32", shape: [1, 1], data: [1] }] }),
        }),
      400,
      /RAW_IMAGE.*(datatype|BYTES|FP32)|(datatype|BYTES|FP32).*RAW_IMAGE/,
    ],
    [
      "a model name that climbs out (encoded slashes)",
      () => binaryPost("/v2/models/..%2F..%2F..%2Fetc%2Fpasswd/infer", [1, 1], raw()),
      // No such model: 404, as Triton's HandleInfer since server PR #6713 (see parity-codes.test.ts).
      404,
      // The name decoded whole (as tritonclient encodes it): one segment, never a path.
      /unknown model: '\.\.\/\.\.\/\.\.\/etc\/passwd' is not found/,
    ],
    ["a model name of '..' sent as is", () => binaryPost("/v2/models/../infer", [1, 1], raw()), 404, /./],
    [
      "a version that climbs out",
      () => binaryPost(`/v2/models/${ENSEMBLE}/versions/..%2F..%2F1/infer`, [1, 1], raw()),
      404,
      /version/i,
    ],
  ];

  it.each(httpCases)("HTTP: %s is refused with its code and the reason", async (_what, send, status, message) => {
    const res = await send();
    const text = await res.text();
    expect(res.status, text).toBe(status);
    expect(text).toMatch(message);
    expect(text).not.toMatch(LEAK);
    await goodStillAnswers();
  });

  const infer = (request: Omit<MessageInitShape<typeof ModelInferRequestSchema>, "$typeName">) =>
    client
      .modelInfer({
        modelName: ENSEMBLE,
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [raw()],
        ...request,
      })
      .then(
        () => undefined,
        (err: unknown) => err,
      );
  const grpcCases: [string, () => Promise<unknown>, Code, RegExp][] = [
    [
      "raw contents shorter than the shape needs",
      () =>
        infer({
          inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [2n, 1n] }],
        }),
      Code.InvalidArgument,
      /RAW_IMAGE/,
    ],
    [
      "a BYTES element whose length prefix runs past its tensor",
      () => {
        const lying = raw();
        new DataView(lying.buffer, lying.byteOffset).setUint32(0, 1 << 30, true);
        return infer({ rawInputContents: [lying] });
      },
      Code.InvalidArgument,
      /RAW_IMAGE/,
    ],
    [
      "a shape that declares 2^62 elements",
      () => infer({ inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n << 31n, 1n << 31n] }] }),
      Code.InvalidArgument,
      /RAW_IMAGE|shape|batch/,
    ],
    [
      "a negative dimension",
      () => infer({ inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, -1n] }] }),
      Code.InvalidArgument,
      /RAW_IMAGE|shape|dim/,
    ],
    [
      "an image declaring 50000 x 50000 pixels",
      () => infer({ rawInputContents: [frameBytes([pngDeclaring(50_000, 50_000)])] }),
      Code.InvalidArgument,
      /pixels/,
    ],
    [
      "an unknown datatype",
      () => infer({ inputs: [{ name: "RAW_IMAGE", datatype: "FP128", shape: [1n, 1n] }] }),
      Code.InvalidArgument,
      /FP128|datatype/,
    ],
    ["a model name that climbs out", () => infer({ modelName: "../../../etc/passwd" }), Code.NotFound, /./],
    [
      "a version that climbs out",
      () => infer({ modelVersion: "../1" }),
      Code.NotFound,
      /'resnet50_ensemble' version \.\.\/1 is not found/,
    ],
  ];

  it.each(grpcCases)("gRPC: %s is refused with its code and the reason", async (_what, send, code, message) => {
    const err = await send();
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code, (err as ConnectError).rawMessage).toBe(code);
    expect((err as ConnectError).rawMessage).toMatch(message);
    expect((err as ConnectError).rawMessage).not.toMatch(LEAK);
    await goodStillAnswers();
  });
});
