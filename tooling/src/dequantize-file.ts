/** models:dequantize without the command line: an fp32 ONNX model from a QOperator int8 one. */
import { readFile, rename, writeFile } from "node:fs/promises";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { ModelProtoSchema } from "./gen/onnx_pb.js";
import { countOps, dequantizeModel } from "./quantize.js";

export interface DequantizeReport {
  /** Bytes of the fp32 model written. */
  bytes: number;
  /** Operators of the written model, by type. */
  ops: Record<string, number>;
}

/** Writes to `out` (through a `.part` file, so a reader never sees half of it) the fp32 model of `model`. */
export async function dequantizeFile(model: string, out: string): Promise<DequantizeReport> {
  const fp32 = dequantizeModel(fromBinary(ModelProtoSchema, new Uint8Array(await readFile(model))));
  const bytes = toBinary(ModelProtoSchema, fp32);
  await writeFile(`${out}.part`, bytes);
  await rename(`${out}.part`, out);
  return { bytes: bytes.length, ops: countOps(fp32) };
}
