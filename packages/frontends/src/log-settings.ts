/**
 * Triton's logging extension (GET/POST /v2/logging, gRPC LogSettings): the
 * server's log settings, read and changed at run time. The server supplies
 * the control; a stage served on its own has none and says so.
 */
import { Code, StageError } from "@trellis/stage";

/** A setting's value: Triton's settings are booleans, unsigned integers or strings. */
export type LogSettingValue = boolean | number | string;
export type LogSettings = Record<string, LogSettingValue>;

export interface LogSettingsControl {
  /** Every setting, as Triton names them (log_file, log_info, log_warning, log_error, log_verbose_level, log_format). */
  get(): LogSettings;
  /** Applies `changes` all or none; throws a StageError naming the first bad one. Returns every setting. */
  update(changes: LogSettings): LogSettings;
}

/** Answers a logging request: a read when `changes` is empty, else an update. */
export function answerLogSettings(control: LogSettingsControl | undefined, changes: LogSettings): LogSettings {
  if (!control) {
    throw new StageError(Code.Unimplemented, "", "log settings are not available on this server");
  }
  return Object.keys(changes).length === 0 ? control.get() : control.update(changes);
}
