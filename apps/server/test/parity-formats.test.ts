/**
 * Issue 22 item 6: the seed ensemble takes the image formats the seed's `cv2.imdecode`
 * takes. OpenCV's imread/imdecode documentation (docs.opencv.org/4.6.0, group imgcodecs,
 * cv::imread) lists Windows bitmaps among the formats it always reads, and GIF is not
 * among them; the seed's preprocess.py decodes every RAW_IMAGE with cv2.imdecode.
 * A BMP of chelsea must classify as its PNG does, over HTTP and gRPC; a GIF is refused.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import sharp from "sharp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf, jsonOf, postBinary } from "./helpers.js";

let repo: string;
let server: ServerProcess;
const png = readFixtureImage("chelsea.png");
let bmp: Uint8Array;
let gif: Uint8Array;

/** A bottom-up 24-bit BMP (BITMAPINFOHEADER, rows padded to 4 bytes) of RGB pixels. */
function writeBmp(rgb: Uint8Array, width: number, height: number): Uint8Array {
  const pitch = (width * 3 + 3) & ~3;
  const b = Buffer.alloc(54 + pitch * height);
  b.write("BM", 0, "latin1");
  b.writeUInt32LE(b.length, 2);
  b.writeUInt32LE(54, 10);
  b.writeUInt32LE(40, 14);
  b.writeInt32LE(width, 18);
  b.writeInt32LE(height, 22);
  b.writeUInt16LE(1, 26);
  b.writeUInt16LE(24, 28);
  b.writeUInt32LE(pitch * height, 34);
  for (let y = 0; y < height; y++) {
    const row = 54 + (height - 1 - y) * pitch;
    for (let x = 0; x < width; x++) {
      const p = 3 * (y * width + x);
      b[row + 3 * x] = rgb[p + 2] as number;
      b[row + 3 * x + 1] = rgb[p + 1] as number;
      b[row + 3 * x + 2] = rgb[p] as number;
    }
  }
  return new Uint8Array(b);
}

beforeAll(async () => {
  const { data, info } = await sharp(png).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  expect(info.width % 4).not.toBe(0); // 451 wide: every BMP row is padded
  bmp = writeBmp(new Uint8Array(data), info.width, info.height);
  gif = new Uint8Array(await sharp(png).gif().toBuffer());
  repo = await makeSeedRepository();
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

interface InferJson {
  error?: string;
  outputs: { data: string[] }[];
}

async function viaHttp(image: Uint8Array): Promise<{ status: number; json: InferJson }> {
  const res = await postBinary(
    `${server.http}/v2/models/resnet50_ensemble/infer`,
    {
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { binary_data: false } }],
    },
    [frameBytes([image])],
  );
  return { status: res.status, json: (await jsonOf(res)) as InferJson };
}

async function viaGrpc(image: Uint8Array): Promise<string> {
  const client = grpcClientOf(server);
  const res = await client.modelInfer(
    create(ModelInferRequestSchema, {
      modelName: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([image])],
    }),
  );
  const raw = res.rawOutputContents[0] as Uint8Array;
  const n = new DataView(raw.buffer, raw.byteOffset, raw.byteLength).getUint32(0, true);
  return new TextDecoder().decode(raw.subarray(4, 4 + n));
}

const top1 = (answer: string) => (JSON.parse(answer) as { top5_labels: string[] }).top5_labels[0];

describe("image formats as the seed's cv2.imdecode", () => {
  it("classifies a BMP of chelsea exactly as its PNG, over HTTP and gRPC", async () => {
    const fromPng = await viaHttp(png);
    const fromBmp = await viaHttp(bmp);
    expect(fromPng.status).toBe(200);
    expect(fromBmp.status, JSON.stringify(fromBmp.json)).toBe(200);
    const answer = fromPng.json.outputs[0]?.data[0] as string;
    expect(top1(answer)).toBe("Egyptian cat");
    // Same pixels, same tensor, same scores: the whole answer is identical.
    expect(fromBmp.json.outputs[0]?.data[0]).toBe(answer);
    expect(await viaGrpc(bmp)).toBe(answer);
    expect(await viaGrpc(png)).toBe(answer);
  });

  it("refuses a GIF (which cv2.imdecode does not decode) naming the format: HTTP 400, gRPC INVALID_ARGUMENT", async () => {
    const http = await viaHttp(gif);
    expect(http.status).toBe(400);
    expect(http.json.error).toContain(
      "unsupported format gif in seed mode: the seed's OpenCV (cv2.imdecode) does not decode it",
    );
    const err = await viaGrpc(gif).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toContain("unsupported format gif in seed mode");
  });
});
