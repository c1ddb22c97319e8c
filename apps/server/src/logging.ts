/**
 * The logging extension over our pino logger: Triton's settings mapped onto
 * pino's one threshold (verbose -> debug, else the most detailed of info,
 * warning, error that is on; all off -> silent). Logs are JSON lines, on
 * stdout or in --log-file's file (log_file: set only at start, as in Triton
 * since 24.05), so log_format stays "default".
 */
import { Code, type LogSettings, type LogSettingsControl, StageError } from "@trellis/stage";
import type { Logger as Pino } from "pino";

const KINDS = {
  log_file: "string",
  log_info: "boolean",
  log_warning: "boolean",
  log_error: "boolean",
  log_verbose_level: "uint32",
  log_format: "string",
} as const;

type Setting = keyof typeof KINDS;

const invalid = (message: string) => new StageError(Code.InvalidArgument, "", message);

export function pinoLogSettings(logger: Pick<Pino, "level">, verboseLevel: number, logFile = ""): LogSettingsControl {
  const current = {
    log_file: logFile,
    log_info: true,
    log_warning: true,
    log_error: true,
    log_verbose_level: verboseLevel,
    log_format: "default",
  };
  const apply = () => {
    logger.level =
      current.log_verbose_level > 0
        ? "debug"
        : current.log_info
          ? "info"
          : current.log_warning
            ? "warn"
            : current.log_error
              ? "error"
              : "silent";
  };
  apply();
  return {
    get: () => ({ ...current }),
    update(changes: LogSettings) {
      for (const [key, value] of Object.entries(changes)) {
        const kind = KINDS[key as Setting];
        if (!kind) throw invalid(`unknown log setting '${key}' (settings: ${Object.keys(KINDS).join(", ")})`);
        const ok =
          kind === "uint32"
            ? typeof value === "number" && Number.isInteger(value) && value >= 0 && value < 2 ** 32
            : typeof value === kind;
        if (!ok)
          throw invalid(
            `log setting '${key}' must be ${kind === "uint32" ? "an unsigned integer" : `a ${kind}`}, got ${JSON.stringify(value)}`,
          );
        if (key === "log_file" && value !== current.log_file) {
          throw new StageError(
            Code.Unimplemented,
            "",
            "log_file can only be set when the server starts (--log-file <path>), not through the logging API",
          );
        }
        if (key === "log_format" && value !== "default") {
          throw invalid(`log_format '${value}' is not supported (the server logs JSON lines: 'default')`);
        }
      }
      Object.assign(current, changes);
      apply();
      return { ...current };
    },
  };
}
