/**
 * The server's pino logger, under Triton's log settings: verbose (debug lines
 * when its level is above 0), info, warning and error each on or off on its own
 * (--log-info / --log-warning / --log-error, and the logging extension), and
 * log_format choosing how each JSON line's "time" is written: "default", pino's
 * milliseconds since the epoch, or "ISO8601". Logs go to stdout or to --log-file's
 * file (log_file: set only at start, as in Triton since 24.05).
 * --log-style text writes each entry as one readable line instead of JSON (the default on a
 * terminal): time, level, message, then the fields as key=value.
 */

import type { LogSettings, LogSettingsControl } from "@trellis/frontends";
import { Code, StageError } from "@trellis/stage";
import { type Logger, pino } from "pino";

const KINDS = {
  log_file: "string",
  log_info: "boolean",
  log_warning: "boolean",
  log_error: "boolean",
  log_verbose_level: "uint32",
  log_format: "string",
} as const;

type Setting = keyof typeof KINDS;

export const LOG_FORMATS = ["default", "ISO8601"] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

/** The settings the server starts with (its flags). */
export interface InitialLogSettings {
  /** --log-file (undefined: stdout). */
  file?: string;
  verboseLevel: number;
  info: boolean;
  warning: boolean;
  error: boolean;
  format: LogFormat;
  /** "json" lines (default) or readable "text" lines. */
  style?: LogStyle;
}

export type LogStyle = "json" | "text";

/** The style when --log-style is not given: readable on a terminal, JSON for anything reading the output. */
export function defaultLogStyle(file: string | undefined): LogStyle {
  return !file && process.stdout.isTTY ? "text" : "json";
}

const LEVEL_NAMES: Record<number, string> = {
  10: "TRACE",
  20: "DEBUG",
  30: "INFO",
  40: "WARN",
  50: "ERROR",
  60: "FATAL",
};
const HIDDEN = new Set(["level", "time", "pid", "hostname", "msg"]);
const pad = (n: number, width = 2) => String(n).padStart(width, "0");

/** One pino JSON line as a readable line: `<time> <LEVEL> <message> key=value ...`. */
export function textLine(json: string): string {
  let entry: Record<string, unknown>;
  try {
    entry = JSON.parse(json);
  } catch {
    return json;
  }
  const time =
    typeof entry.time === "number"
      ? (() => {
          const d = new Date(entry.time);
          return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
        })()
      : String(entry.time ?? "");
  const level = (LEVEL_NAMES[entry.level as number] ?? String(entry.level)).padEnd(5);
  const fields = Object.entries(entry)
    .filter(([key, value]) => !HIDDEN.has(key) && value !== undefined && value !== "")
    .map(([key, value]) => {
      const text = typeof value === "string" ? value : JSON.stringify(value);
      return `${key}=${typeof value === "string" && /[\s"=]/.test(value) ? JSON.stringify(value) : text}`;
    });
  return `${[time, level, String(entry.msg ?? ""), ...fields].join(" ")}\n`;
}

const invalid = (message: string) => new StageError(Code.InvalidArgument, "", message);

/** pino's level numbers, and which of Triton's settings turns each on. */
const SWITCHES: Record<number, "log_info" | "log_warning" | "log_error"> = {
  30: "log_info",
  40: "log_warning",
  50: "log_error",
  60: "log_error",
};

export function createServerLogger(initial: InitialLogSettings): { logger: Logger; settings: LogSettingsControl } {
  const current = {
    log_file: initial.file ?? "",
    log_info: initial.info,
    log_warning: initial.warning,
    log_error: initial.error,
    log_verbose_level: initial.verboseLevel,
    log_format: initial.format as string,
  };
  const options = {
    base: { pid: process.pid },
    // Read at each line, so a change through the logging extension applies at once.
    timestamp: () =>
      current.log_format === "ISO8601" ? `,"time":"${new Date().toISOString()}"` : `,"time":${Date.now()}`,
    hooks: {
      // pino has one threshold; this drops the levels switched off below it (info off, warnings on).
      logMethod(this: Logger, args: Parameters<Logger["info"]>, method: (...a: unknown[]) => void, level: number) {
        const setting = SWITCHES[level];
        if (setting && !current[setting]) return;
        method.apply(this, args);
      },
    },
  };
  // Synchronous writes to a log file: nothing is lost when the process exits after shutdown.
  const destination = initial.file
    ? pino.destination({ dest: initial.file, sync: true })
    : initial.style === "text"
      ? pino.destination({ dest: 1, sync: true })
      : undefined;
  const stream =
    initial.style === "text" && destination
      ? { write: (line: string) => destination.write(line.split("\n").filter(Boolean).map(textLine).join("")) }
      : destination;
  const logger = stream ? pino(options, stream) : pino(options);
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
  const settings: LogSettingsControl = {
    get: () => ({ ...current }),
    update(changes: LogSettings) {
      // Triton leaves a setting sent as null as it is.
      const given = Object.fromEntries(Object.entries(changes).filter(([, value]) => value !== null)) as LogSettings;
      for (const [key, value] of Object.entries(given)) {
        // Own keys only: 'constructor' or 'toString' are the object's, not settings.
        const kind = Object.hasOwn(KINDS, key) ? KINDS[key as Setting] : undefined;
        if (!kind) throw invalid(`unknown log setting '${key}' (settings: ${Object.keys(KINDS).join(", ")})`);
        const ok =
          kind === "uint32"
            ? typeof value === "number" && Number.isInteger(value) && value >= 0 && value < 2 ** 32
            : typeof value === kind;
        if (!ok)
          throw invalid(
            `log setting '${key}' must be ${kind === "uint32" ? "an unsigned integer" : `a ${kind}`}, got ${JSON.stringify(value)}`,
          );
        // As Triton (server src/http_server.cc HandleLogging): any log_file but null is refused.
        if (key === "log_file") {
          throw new StageError(
            Code.Unimplemented,
            "",
            "log file location can not be updated through network protocol: it is set when the server starts (--log-file <path>)",
          );
        }
        if (key === "log_format" && !(LOG_FORMATS as readonly unknown[]).includes(value)) {
          throw invalid(`log_format '${value}' is not supported (formats: ${LOG_FORMATS.join(", ")})`);
        }
      }
      Object.assign(current, given);
      apply();
      return { ...current };
    },
  };
  return { logger, settings };
}
