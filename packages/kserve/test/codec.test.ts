import { create } from "@bufbuild/protobuf";
import { InferTensorContentsSchema } from "@trellis/protocol";
import { bytesTensor, Code, type DataType, StageError, type Tensor } from "@trellis/stage";
import { allocate, DATATYPES, elementSize } from "@trellis/stage/backend";
import { describe, expect, it } from "vitest";
import { frameBytes, tensorFromContents, tensorFromRaw, tensorToContents, tensorToRaw } from "../src/codec.js";

/** A tensor of each datatype with values that exercise sign, range and precision. */
function sample(datatype: DataType): Tensor {
  const shape = [2, 3];
  if (datatype === "BYTES") {
    return bytesTensor("t", shape, ["", "a", new Uint8Array([0, 1, 0, 255]), "héllo", "\0", "last"]);
  }
  const data = allocate(datatype, 6);
  const values: Record<string, (number | bigint)[]> = {
    BOOL: [1, 0, 1, 1, 0, 0],
    UINT8: [0, 1, 127, 128, 254, 255],
    UINT16: [0, 1, 32768, 65535, 2, 3],
    UINT32: [0, 1, 2 ** 31, 2 ** 32 - 1, 5, 6],
    UINT64: [0n, 1n, 2n ** 63n, 2n ** 64n - 1n, 5n, 6n],
    INT8: [-128, -1, 0, 1, 127, 5],
    INT16: [-32768, -1, 0, 1, 32767, 5],
    INT32: [-(2 ** 31), -1, 0, 1, 2 ** 31 - 1, 5],
    INT64: [-(2n ** 63n), -1n, 0n, 1n, 2n ** 63n - 1n, 5n],
    FP16: [0x3c00, 0xbc00, 0x7c00, 0x0001, 0x7bff, 0],
    BF16: [0x3f80, 0xbf80, 0x7f80, 0x0001, 0x7f7f, 0],
    FP32: [1.5, -2.25, 3.4e38, 1e-45, Number.POSITIVE_INFINITY, 0],
    FP64: [1.5, -2.25, Number.MAX_VALUE, 5e-324, Number.NEGATIVE_INFINITY, Math.PI],
  };
  (data as unknown as { set(v: ArrayLike<number | bigint>): void }).set(values[datatype] as never);
  return { name: "t", datatype, shape, data } as Tensor;
}

describe("raw contents", () => {
  it.each(DATATYPES)("%s round-trips through raw bytes", (datatype) => {
    const t = sample(datatype);
    const raw = tensorToRaw(t);
    const back = tensorFromRaw("input", t, raw);
    expect(back.datatype).toBe(datatype);
    expect(back.shape).toEqual([2, 3]);
    expect(back.data).toEqual(t.data);
    if (datatype !== "BYTES") expect(raw.byteLength).toBe(6 * elementSize(datatype));
  });

  it("is little-endian on the wire", () => {
    const t = { name: "x", datatype: "INT32", shape: [1], data: new Int32Array([0x01020304]) } as Tensor;
    expect([...tensorToRaw(t)]).toEqual([4, 3, 2, 1]);
  });

  it("returns a view, not a copy, when the bytes are aligned", () => {
    const buffer = new ArrayBuffer(64);
    const raw = new Uint8Array(buffer, 8, 16);
    const t = tensorFromRaw("input", { name: "x", datatype: "FP32", shape: [4] }, raw);
    expect((t.data as Float32Array).buffer).toBe(buffer);
    (t.data as Float32Array)[0] = 2;
    expect(new Float32Array(buffer, 8, 1)[0]).toBe(2);
  });

  it("copies misaligned bytes into an aligned array", () => {
    const raw = new Uint8Array(new ArrayBuffer(17), 1, 16);
    new DataView(raw.buffer).setFloat32(1, 7.5, true);
    const t = tensorFromRaw("input", { name: "x", datatype: "FP32", shape: [4] }, raw);
    expect((t.data as Float32Array)[0]).toBe(7.5);
  });

  it("frames BYTES as 4-byte little-endian length + bytes", () => {
    expect([...frameBytes([new Uint8Array([9]), new Uint8Array(0)])]).toEqual([1, 0, 0, 0, 9, 0, 0, 0, 0]);
  });
});

describe("malformed raw contents", () => {
  const err = (fn: () => unknown): StageError => {
    try {
      fn();
    } catch (e) {
      return e as StageError;
    }
    throw new Error("expected an error");
  };

  it("names the tensor, shape, expected and actual byte size", () => {
    const e = err(() =>
      tensorFromRaw(
        "input",
        { name: "PREPROCESSED_IMAGE", datatype: "FP32", shape: [2, 3, 224, 224] },
        new Uint8Array(1204220),
      ),
    );
    expect(e).toBeInstanceOf(StageError);
    expect(e.code).toBe(Code.InvalidArgument);
    expect(e.rawMessage).toBe("input PREPROCESSED_IMAGE: FP32 shape [2,3,224,224] needs 1204224 bytes, got 1204220");
  });

  it("rejects a truncated BYTES length prefix", () => {
    const raw = new Uint8Array([1, 0, 0, 0, 65, 2, 0]);
    expect(
      err(() => tensorFromRaw("input", { name: "RAW_IMAGE", datatype: "BYTES", shape: [2, 1] }, raw)).rawMessage,
    ).toBe("input RAW_IMAGE: BYTES element 1: truncated length prefix at byte 5 (2 of 4 bytes)");
  });

  it("rejects a BYTES length past the end", () => {
    const raw = new Uint8Array([1, 0, 0, 0, 65, 200, 0, 0, 0, 1, 2]);
    expect(err(() => tensorFromRaw("output", { name: "R", datatype: "BYTES", shape: [2] }, raw)).rawMessage).toBe(
      "output R: BYTES element 1: length 200 at byte 5 runs past the end (2 bytes left)",
    );
  });

  it("rejects a BYTES element count that does not match the shape", () => {
    const raw = frameBytes([new Uint8Array([1])]);
    expect(err(() => tensorFromRaw("input", { name: "R", datatype: "BYTES", shape: [3, 1] }, raw)).rawMessage).toBe(
      "input R: BYTES shape [3,1] needs 3 elements, got 1",
    );
  });

  it("rejects unknown datatypes and negative dims", () => {
    expect(
      err(() => tensorFromRaw("input", { name: "x", datatype: "FP8", shape: [1] }, new Uint8Array(1))).rawMessage,
    ).toBe('input x: unknown datatype "FP8"');
    expect(
      err(() => tensorFromRaw("input", { name: "x", datatype: "FP32", shape: [-1] }, new Uint8Array(4))).rawMessage,
    ).toBe("input x: invalid shape [-1]");
  });
});

describe("typed contents", () => {
  it.each(DATATYPES.filter((d) => d !== "FP16" && d !== "BF16"))(
    "%s round-trips through typed contents",
    (datatype) => {
      const t = sample(datatype);
      const back = tensorFromContents("input", t, tensorToContents(t));
      if (datatype === "FP32") {
        expect(Array.from(back.data as Float32Array)).toEqual(Array.from(t.data as Float32Array));
      } else {
        expect(back.data).toEqual(t.data);
      }
    },
  );

  it("rejects a count mismatch, naming the contents field", () => {
    const contents = create(InferTensorContentsSchema, { fp32Contents: [1, 2, 3] });
    expect(() => tensorFromContents("input", { name: "x", datatype: "FP32", shape: [2, 2] }, contents)).toThrow(
      "input x: FP32 shape [2,2] needs 4 elements in fp32Contents, got 3",
    );
  });

  it("requires raw contents for FP16", () => {
    expect(() =>
      tensorFromContents("input", { name: "h", datatype: "FP16", shape: [1] }, create(InferTensorContentsSchema)),
    ).toThrow("input h: FP16 data must be sent as raw contents");
  });
});
