#!/usr/bin/env node
// CLI: pnpm models:quantize --model FILE --calibration DIR [--eval DIR] [--out FILE | --version N] …
import { writeFile } from "node:fs/promises";
import cliProgress from "cli-progress";
import { Command, Option } from "commander";
import { scriptArgv } from "./argv.js";
import { quantizeFile, versionPath } from "./quantize-file.js";

// pnpm runs scripts in tooling/; paths on the command line mean the caller's directory.
if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);

const program = new Command("models:quantize")
  .description(
    "static post-training quantization of an fp32 ONNX model to QDQ int8, with an fp32-vs-int8 accuracy report",
  )
  .requiredOption("--model <file>", "fp32 ONNX model")
  .requiredOption("--calibration <dir|list>", "calibration photos: a folder, or a text file with one path a line")
  .option("--eval <dir|list>", "held-out photos for the accuracy report")
  .option("--out <file>", "int8 model file (default: <model>.int8.onnx beside the model)")
  .option("--version <n>", "write <repo>/<name>/<n>/model.onnx instead (the model must sit in a version folder)")
  .addOption(
    new Option("--method <m>", "activation range method")
      .choices(["percentile", "mse", "minmax"])
      .default("percentile"),
  )
  .option("--percentile <p>", "percentile kept by --method percentile", "99.99")
  .addOption(new Option("--activation-type <t>", "activation type").choices(["uint8", "int8"]).default("uint8"))
  .option("--reduce-range", "7-bit weights (for CPUs without VNNI, where u8×s8 can saturate)", false)
  .addOption(
    new Option(
      "--weight-type <t>",
      "weight storage: int8 (u8×s8 kernels) or uint8 (u8×u8: all 8 bits on CPUs without VNNI, slower)",
    )
      .choices(["int8", "uint8"])
      .default("int8"),
  )
  .option(
    "--equalize [headroom]",
    "rescale the channels of each depthwise Conv's input before calibration (headroom: default 1)",
  )
  .option("--report <file>", "accuracy report JSON (default: <out>.report.json)")
  .option("--optimized <file>", "keep the graph ONNX Runtime runs (optimizedModelFilePath) there")
  .parse(scriptArgv());
const o = program.opts<{
  model: string;
  calibration: string;
  eval?: string;
  out?: string;
  version?: string;
  method: "percentile" | "mse" | "minmax";
  percentile: string;
  activationType: "uint8" | "int8";
  reduceRange: boolean;
  weightType: "int8" | "uint8";
  equalize?: boolean | string;
  report?: string;
  optimized?: string;
}>();
const percentile = Number(o.percentile);
if (!(percentile > 50 && percentile <= 100)) program.error(`--percentile must be in (50, 100], got ${o.percentile}`);
const headroom = o.equalize === undefined || o.equalize === true ? 1 : Number(o.equalize);
if (!(headroom >= 1)) program.error(`--equalize: headroom must be a number ≥ 1, got ${o.equalize}`);
const out = o.version
  ? versionPath(o.model, Number(o.version))
  : (o.out ?? o.model.replace(/(\.onnx)?$/, ".int8.onnx"));

const bar = process.stderr.isTTY
  ? new cliProgress.SingleBar(
      { format: "{what} [{bar}] {value}/{total}", stream: process.stderr },
      cliProgress.Presets.shades_classic,
    )
  : undefined;
let stage = "";
const report = await quantizeFile({
  model: o.model,
  calibration: o.calibration,
  evaluation: o.eval,
  out,
  method: o.method,
  percentile,
  activationType: o.activationType,
  reduceRange: o.reduceRange,
  weightType: o.weightType,
  equalize: o.equalize === undefined ? undefined : { headroom },
  optimizedPath: o.optimized,
  progress: (done, total, what) => {
    const key = what.replace(/ .*/, "");
    if (bar) {
      if (key !== stage) {
        if (stage) bar.stop();
        bar.start(total, 0, { what: key });
        stage = key;
      }
      bar.update(done, { what: key });
      if (done === total) {
        bar.stop();
        stage = "";
      }
    } else if (done === total || done % 10 === 0) console.error(`${what.replace(/ \/.*$/, "")}: ${done}/${total}`);
  },
});
const reportPath = o.report ?? `${out}.report.json`;
await writeFile(reportPath, `${JSON.stringify(report, null, 2)}\n`);

const int8Kernels = Object.entries(report.ortOptimizedOps).filter(([k]) =>
  /QLinear|QGemm|Integer|QuantizeLinear/.test(k),
);
console.log(`wrote ${out}: ${(report.bytes / 1e6).toFixed(2)} MB, sha256 ${report.sha256}`);
console.log(
  `  ${report.quantizedWeights.toLocaleString("en")} weights ${report.weightType}${report.reduceRange ? " (7-bit)" : ""} (per channel), ${report.qdqTensors} activations ${report.activationType} (${report.method}${report.percentile ? ` ${report.percentile}` : ""}, ${report.calibrationImages.length} images${report.equalized ? `; ${report.equalized.tensors} depthwise inputs equalized` : ""})`,
);
console.log(
  `  ONNX Runtime runs: ${int8Kernels.map(([k, n]) => `${n} ${k}`).join(", ")}; fp32 left: ${
    Object.entries(report.ortOptimizedOps)
      .filter(([k]) => !/QLinear|QGemm|Integer|QuantizeLinear|DequantizeLinear/.test(k))
      .map(([k, n]) => `${n} ${k}`)
      .join(", ") || "none"
  }`,
);
if (report.accuracy) {
  const a = report.accuracy;
  console.log(
    `  fp32 vs int8 on ${a.images} held-out images: top-1 agreement ${(a.top1Agreement * 100).toFixed(1)}%, top-5 overlap ${(a.meanTop5Overlap * 100).toFixed(1)}%, max |Δprob| ${a.maxAbsDeltaProb.toFixed(4)}, logit correlation ${a.meanLogitCorrelation.toFixed(4)}`,
  );
  const pct = (x: number) => (Number.isNaN(x) ? "-" : `${(x * 100).toFixed(1)}%`);
  console.log(
    `  on the ${a.decisive.images} where fp32 leads by ≥ ${a.decisive.margin} probability: top-1 agreement ${pct(a.decisive.top1Agreement)}`,
  );
  console.log(
    `  computed exactly (graph optimizations off, no integer kernels): ${pct(a.exactTop1Agreement)}, decisive ${pct(a.decisive.exactTop1Agreement)}`,
  );
  for (const f of a.disagreements) console.log(`  top-1 differs: ${f}`);
}
for (const { file, error } of report.skippedImages) console.log(`  skipped ${file}: ${error}`);
console.log(`  report (per-layer ranges, per-image results): ${reportPath}`);
