#!/usr/bin/env node
// CLI: pnpm models:dequantize --model INT8.onnx --out FP32.onnx
import { Command } from "commander";
import { scriptArgv } from "./argv.js";
import { dequantizeFile } from "./dequantize-file.js";

if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);

const program = new Command("models:dequantize")
  .description("an fp32 model from a QOperator int8 ONNX model (QLinearConv & co.): weights = scale × (q − zero_point)")
  .requiredOption("--model <file>", "int8 QOperator ONNX model")
  .requiredOption("--out <file>", "fp32 ONNX model to write")
  .parse(scriptArgv());
const o = program.opts<{ model: string; out: string }>();
const report = await dequantizeFile(o.model, o.out);
const ops = Object.entries(report.ops)
  .map(([k, n]) => `${n} ${k}`)
  .join(", ");
console.log(`wrote ${o.out}: ${(report.bytes / 1e6).toFixed(2)} MB fp32 (${ops})`);
