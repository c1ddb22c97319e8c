import { bytesTensor, Code, StageError, tensor } from "@trellis/stage";
import { readFixtureImage, readReferenceTensor } from "@trellis/testing";
import sharp from "sharp";
import { describe, expect, it } from "vitest";
import { jpegHasEnd } from "../src/image.js";
import { createPreprocess } from "../src/index.js";
import { diff, preprocessOne, rawImageRequest } from "./helpers.js";

const stage = createPreprocess({ name: "resnet50_preprocess" });

function asStageError(err: unknown): StageError {
  if (!(err instanceof StageError)) throw new Error(`expected a StageError, got ${String(err)}`);
  return err;
}
const chelsea = readFixtureImage("chelsea.jpg");

/** Runs a request whose element 1 is `bad` (element 0 is a good photo) and returns the error. */
async function failure(bad: Uint8Array | string, s = stage): Promise<StageError> {
  try {
    await s.infer(rawImageRequest([chelsea, bad]));
  } catch (err) {
    return asStageError(err);
  }
  throw new Error("request with a bad element succeeded");
}

/** A JPEG whose SOF header claims `width` x `height`: a decompression bomb that costs no bytes. */
function withClaimedSize(jpeg: Uint8Array, width: number, height: number): Uint8Array {
  const out = jpeg.slice();
  for (let i = 2; i < out.length - 9; ) {
    if (out[i] !== 0xff) throw new Error("not at a JPEG marker");
    const marker = out[i + 1] as number;
    const length = ((out[i + 2] as number) << 8) | (out[i + 3] as number);
    if (marker >= 0xc0 && marker <= 0xc2) {
      out[i + 5] = height >> 8;
      out[i + 6] = height & 0xff;
      out[i + 7] = width >> 8;
      out[i + 8] = width & 0xff;
      return out;
    }
    i += 2 + length;
  }
  throw new Error("no SOF marker");
}

describe("each bad element fails its request with INVALID_ARGUMENT naming the element and reason", () => {
  it.each<[string, () => Uint8Array | string, RegExp, ReturnType<typeof createPreprocess>?]>([
    ["empty bytes", () => new Uint8Array(0), /element 1: empty \(0 bytes\)/],
    [
      "not an image (binary)",
      () => Uint8Array.from({ length: 300 }, (_, i) => (i * 7) % 256),
      /element 1: not an image: no known image signature/,
    ],
    [
      "not an image (base64 of text)",
      () => Buffer.from("hello world, not a picture").toString("base64"),
      /element 1: not an image: base64 decoded to 26 bytes/,
    ],
    [
      "truncated.jpg",
      () => readFixtureImage("truncated.jpg"),
      /element 1: truncated or corrupt jpeg: .*premature end of JPEG/i,
    ],
    [
      "a JPEG cut off mid-scan",
      () => chelsea.subarray(0, Math.floor(chelsea.length * 0.6)),
      /element 1: truncated or corrupt jpeg: .*premature end/i,
    ],
    [
      "undecodable base64",
      () => "iVBORw0KGgo!!notbase64",
      /element 1: undecodable base64: invalid character 0x21 at offset 11/,
    ],
    ["base64 with a bad length", () => "QUJDR", /element 1: undecodable base64: bad length/],
    [
      // BMP is decoded now, as the seed's cv2.imdecode does (test/formats.test.ts); GIF is refused as it refuses it.
      "unsupported format (GIF, in seed mode)",
      () => Uint8Array.from(Buffer.from("GIF89a\x01\0\x01\0\0\0\0;", "latin1")),
      /element 1: unsupported format gif in seed mode: the seed's OpenCV \(cv2\.imdecode\) does not decode it \(seed mode decodes: jpeg, png, webp, tiff, bmp, pbm, pgm, ppm; mode fast decodes gif\)/,
    ],
    [
      "unsupported format (SVG)",
      () => '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
      /element 1: unsupported format svg/,
    ],
    [
      "a decompression bomb over max_pixels",
      () => withClaimedSize(chelsea, 30000, 30000),
      /element 1: 30000x30000 = 900000000 pixels exceed max_pixels 40000000 \(rejected before decoding\)/,
    ],
  ])("%s", async (_label, make, message) => {
    const err = await failure(make());
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^resnet50_preprocess: input RAW_IMAGE element 1: /);
    expect(err.rawMessage).toMatch(message);
    expect(err.rawMessage).not.toMatch(/element 0/);
  });

  it("says why a truncated JPEG failed even when concurrent decodes wipe libvips' shared error buffer", async () => {
    // Every sharp pipeline clears libvips' one global error buffer as it ends, so with decodes
    // finishing on other threads, sharp alone reports a third or more of these as "Unknown error".
    const cut = chelsea.subarray(0, Math.floor(chelsea.length * 0.6));
    const errors = await Promise.all(Array.from({ length: 24 }, () => failure(cut)));
    for (const err of errors) {
      expect(err.rawMessage).toMatch(/element 1: truncated or corrupt jpeg: .*premature end/i);
      expect(err.rawMessage).not.toMatch(/unknown error/i);
    }
  });

  it("tells a JPEG that ends after its last scan from one cut short", () => {
    expect(jpegHasEnd(chelsea)).toBe(true);
    const cut = chelsea.subarray(0, Math.floor(chelsea.length * 0.6));
    expect(jpegHasEnd(cut)).toBe(false);
    expect(jpegHasEnd(readFixtureImage("truncated.jpg"))).toBe(false);
    expect(jpegHasEnd(Uint8Array.from([...cut, 0xff, 0xd9]))).toBe(true);
  });

  it("rejects an image over max_pixels (a real photo, a small limit)", async () => {
    const small = createPreprocess({ maxPixels: 100_000 });
    const err = await failure(chelsea, small);
    expect(err.code).toBe(Code.InvalidArgument);
    // Both elements are the 451x300 photo: both are named.
    expect(err.rawMessage).toContain("element 0: 451x300 = 135300 pixels exceed max_pixels 100000");
    expect(err.rawMessage).toContain("element 1: 451x300 = 135300 pixels exceed max_pixels 100000");
  });

  it("rejects elements over max_bytes, raw and base64", async () => {
    const small = createPreprocess({ maxBytes: 30_000, name: "p" });
    const good = readFixtureImage("horse.jpg"); // 12897 bytes
    const raw = await small.infer(rawImageRequest([good])).catch((e) => e);
    expect(raw).not.toBeInstanceOf(Error);
    const err = asStageError(await small.infer(rawImageRequest([good, chelsea])).catch((e) => e));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe(`p: input RAW_IMAGE element 1: ${chelsea.length} bytes exceed max_bytes 30000`);
    const b64 = asStageError(
      await small.infer(rawImageRequest([Buffer.from(chelsea).toString("base64")])).catch((e) => e),
    );
    expect(b64.rawMessage).toContain(`element 0: ${chelsea.length} bytes (decoded from base64) exceed max_bytes 30000`);
  });

  it("fast mode checks max_pixels from the header too", async () => {
    const err = await failure(withClaimedSize(chelsea, 30000, 30000), createPreprocess({ mode: "fast" }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/element 1: 30000x30000 = 900000000 pixels exceed max_pixels 40000000/);
  });

  it("never returns a grey image for a truncated file, in fast mode either", async () => {
    const fast = createPreprocess({ mode: "fast" });
    const err = await failure(chelsea.subarray(0, Math.floor(chelsea.length * 0.6)), fast);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/element 1: truncated or corrupt jpeg: /);
  });
});

describe("bad requests do not disturb good ones", () => {
  it("a good request running at the same time as a bad one succeeds, bit-identical", async () => {
    const good = stage.infer(rawImageRequest([readFixtureImage("coffee.jpg"), chelsea]));
    const bad = stage.infer(
      rawImageRequest([chelsea, readFixtureImage("truncated.jpg"), readFixtureImage("coffee.jpg")]),
    );
    const [g, b] = await Promise.allSettled([good, bad]);
    expect(b.status).toBe("rejected");
    expect(asStageError((b as PromiseRejectedResult).reason).rawMessage).toMatch(
      /element 1: truncated or corrupt jpeg: /,
    );
    expect(g.status).toBe("fulfilled");
    const out = (g as PromiseFulfilledResult<Awaited<typeof good>>).value.outputs[0]!;
    expect(out.shape).toEqual([2, 3, 224, 224]);
    const data = out.data as Float32Array;
    const plane = 3 * 224 * 224;
    expect(diff(data.subarray(0, plane), readReferenceTensor("coffee.jpg")).max).toBe(0);
    expect(diff(data.subarray(plane), readReferenceTensor("chelsea.jpg")).max).toBe(0);
  });

  it("counts failures and successes in the statistics", async () => {
    const s = createPreprocess({ name: "stats" });
    await s.infer(rawImageRequest([chelsea, chelsea, chelsea]));
    await s.infer(rawImageRequest([new Uint8Array(0)])).catch(() => undefined);
    const st = await s.statistics();
    // Counted by the model runtime, as the server counts: the failed request's execution ran too.
    expect(st.inferenceCount).toBe(3n);
    expect(st.executionCount).toBe(2n);
    expect(st.inferenceStats?.success?.count).toBe(1n);
    expect(st.inferenceStats?.fail?.count).toBe(1n);
    expect(st.batchStats.map((b) => b.batchSize).sort()).toEqual([1n, 3n]);
  });
});

describe("encodings and request checks", () => {
  it("accepts base64 text (auto-detected and declared) with the same result as raw bytes", async () => {
    const b64 = Buffer.from(chelsea).toString("base64");
    const expected = readReferenceTensor("chelsea.jpg");
    expect(diff(await preprocessOne(stage, b64), expected).max).toBe(0);
    expect(diff(await preprocessOne(createPreprocess({ encoding: "base64" }), b64), expected).max).toBe(0);
    expect(diff(await preprocessOne(stage, `data:image/jpeg;base64,${b64}`), expected).max).toBe(0);
    // Line-wrapped base64, as some clients send it.
    expect(diff(await preprocessOne(stage, b64.replace(/.{76}/g, "$&\n")), expected).max).toBe(0);
  });

  it("encoding raw does not try base64; encoding base64 refuses file bytes", async () => {
    const raw = createPreprocess({ encoding: "raw" });
    const e1 = asStageError(
      await raw.infer(rawImageRequest([Buffer.from(chelsea).toString("base64")])).catch((e) => e),
    );
    expect(e1.rawMessage).toMatch(/element 0: not an image: no known image signature/);
    const b64 = createPreprocess({ encoding: "base64" });
    const e2 = asStageError(await b64.infer(rawImageRequest([chelsea])).catch((e) => e));
    expect(e2.rawMessage).toMatch(/element 0: undecodable base64: invalid character 0xff at offset 0/);
  });

  it("checks the input tensor's name, datatype and shape, in Triton's words (core src/infer_request.cc)", async () => {
    const cases: [Parameters<typeof stage.infer>[0], RegExp][] = [
      [
        { inputs: [bytesTensor("IMAGE", [1, 1], [chelsea])] },
        /unexpected inference input 'IMAGE' for model '\w+' \(its inputs: RAW_IMAGE\)/,
      ],
      [
        { inputs: [tensor("RAW_IMAGE", "UINT8", [1, 4], new Uint8Array(4))] },
        /inference input 'RAW_IMAGE' data-type is 'UINT8', but model '\w+' expects 'BYTES'/,
      ],
      [
        { inputs: [bytesTensor("RAW_IMAGE", [1, 2], [chelsea, chelsea])] },
        /unexpected shape for input 'RAW_IMAGE' for model '\w+'\. Expected \[-1,1\], got \[1,2\]/,
      ],
      [
        { ...rawImageRequest([chelsea]), outputs: [{ name: "LOGITS" }] },
        /unexpected inference output 'LOGITS' for model '\w+'/,
      ],
    ];
    for (const [req, msg] of cases) {
      const err = asStageError(await stage.infer(req).catch((e) => e));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toMatch(msg);
    }
  });

  it("handles any batch size, including an empty one", async () => {
    const empty = await stage.infer(rawImageRequest([]));
    expect(empty.outputs[0]!.shape).toEqual([0, 3, 224, 224]);
    const eight = await stage.infer(rawImageRequest(Array.from({ length: 8 }, () => chelsea)));
    const data = eight.outputs[0]!.data as Float32Array;
    const plane = 3 * 224 * 224;
    for (let i = 0; i < 8; i++)
      expect(diff(data.subarray(i * plane, (i + 1) * plane), readReferenceTensor("chelsea.jpg")).max).toBe(0);
  });

  it("a lossless PNG re-encode of a JPEG gives the JPEG's result", async () => {
    const png = new Uint8Array(await sharp(chelsea).png().toBuffer());
    expect(diff(await preprocessOne(stage, png), readReferenceTensor("chelsea.jpg")).max).toBe(0);
  });
});
