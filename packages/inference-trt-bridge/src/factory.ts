/**
 * createStage: the bridge as a `backend: "typescript"` model, configured by
 * its config.pbtxt `parameters`.
 */
import { readFileSync } from "node:fs";
import { isAbsolute, join } from "node:path";
import {
  Code,
  configInteger,
  configParameter,
  type StageDefinition,
  StageError,
  type StageFactoryOptions,
} from "@trellis/stage";
import { bridgeDefinition, type TrtBridgeOptions } from "./bridge.js";

/** Parameter keys the bridge reads (config.pbtxt `parameters`). */
export const PARAMETERS = {
  endpoint: "endpoint",
  remoteModelName: "remote_model_name",
  remoteModelVersion: "remote_model_version",
  timeoutMs: "timeout_ms",
  readyTimeoutMs: "ready_timeout_ms",
  fp16Conversion: "fp16_conversion",
  maxRetries: "max_retries",
  retryBaseDelayMs: "retry_base_delay_ms",
  tlsCa: "tls_ca_file",
  tlsCert: "tls_cert_file",
  tlsKey: "tls_key_file",
  /** `header:<Name>` entries become request headers. */
  headerPrefix: "header:",
} as const;

/** Reads the bridge's options from a model config's parameters; files resolve against the model folder. */
export function bridgeOptionsFromConfig(options: StageFactoryOptions): TrtBridgeOptions {
  const { config, modelDir } = options;
  const param = (key: string) => configParameter(config, key);
  const int = (key: string, min = 0) => configInteger(config, key, min);
  const file = (key: string) => {
    const v = param(key);
    if (v === undefined) return undefined;
    const path = isAbsolute(v) ? v : join(modelDir, v);
    try {
      return readFileSync(path);
    } catch (err) {
      throw new StageError(
        Code.InvalidArgument,
        config.name,
        `parameter ${key}: cannot read ${path}: ${err instanceof Error ? err.message : String(err)}`,
        { cause: err },
      );
    }
  };
  const endpoint = param(PARAMETERS.endpoint);
  if (!endpoint) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter endpoint is required (the Triton gRPC URL, e.g. "http://127.0.0.1:8101")`,
    );
  }
  const fp16 = param(PARAMETERS.fp16Conversion)?.toLowerCase();
  if (fp16 !== undefined && fp16 !== "true" && fp16 !== "false") {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter fp16_conversion: expected "true" or "false", got "${fp16}"`,
    );
  }
  const headers: Record<string, string> = {};
  for (const [key, value] of Object.entries(config.parameters)) {
    if (key.startsWith(PARAMETERS.headerPrefix)) headers[key.slice(PARAMETERS.headerPrefix.length)] = value.stringValue;
  }
  const ca = file(PARAMETERS.tlsCa);
  const cert = file(PARAMETERS.tlsCert);
  const key = file(PARAMETERS.tlsKey);
  const maxRetries = int(PARAMETERS.maxRetries);
  const baseDelay = int(PARAMETERS.retryBaseDelayMs);
  return {
    config,
    version: options.version,
    endpoint,
    modelName: param(PARAMETERS.remoteModelName),
    modelVersion: param(PARAMETERS.remoteModelVersion),
    // A 0 ms deadline would fail every request, so the smallest is 1.
    timeoutMs: int(PARAMETERS.timeoutMs, 1),
    readyTimeoutMs: int(PARAMETERS.readyTimeoutMs),
    allowFp16Conversion: fp16 === "true",
    retries:
      maxRetries !== undefined || baseDelay !== undefined
        ? { max: maxRetries ?? 3, baseDelayMs: baseDelay ?? 100 }
        : undefined,
    tls: ca || cert || key ? { ca, cert, key } : undefined,
    headers: Object.keys(headers).length > 0 ? headers : undefined,
    logger: options.logger,
  };
}

/**
 * The repository loader's entry point, as every stage package's (`parameters { key: "module"
 * value: { string_value: "@trellis/inference-trt-bridge" } }`): what the bridge computes.
 */
export async function createStage(options: StageFactoryOptions): Promise<StageDefinition> {
  return bridgeDefinition(bridgeOptionsFromConfig(options));
}
