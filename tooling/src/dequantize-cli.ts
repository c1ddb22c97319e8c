#!/usr/bin/env node
// CLI: pnpm models:dequantize --model INT8.onnx --out FP32.onnx
import { readFile, rename, writeFile } from "node:fs/promises";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Command } from "commander";
import { scriptArgv } from "./argv.js";
import { ModelProtoSchema } from "./gen/onnx_pb.js";
import { countOps, dequantizeModel } from "./quantize.js";

if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);

const program = new Command("models:dequantize")
  .description("an fp32 model from a QOperator int8 ONNX model (QLinearConv & co.): weights = scale × (q − zero_point)")
  .requiredOption("--model <file>", "int8 QOperator ONNX model")
  .requiredOption("--out <file>", "fp32 ONNX model to write")
  .parse(scriptArgv());
const o = program.opts<{ model: string; out: string }>();
const model = dequantizeModel(fromBinary(ModelProtoSchema, new Uint8Array(await readFile(o.model))));
const bytes = toBinary(ModelProtoSchema, model);
await writeFile(`${o.out}.part`, bytes);
await rename(`${o.out}.part`, o.out);
const ops = Object.entries(countOps(model))
  .map(([k, n]) => `${n} ${k}`)
  .join(", ");
console.log(`wrote ${o.out}: ${(bytes.length / 1e6).toFixed(2)} MB fp32 (${ops})`);
