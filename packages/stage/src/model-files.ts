/**
 * Files a model config names (label_filename, default_model_filename, warmup
 * and initial-state data files) are the model's own: they resolve inside its
 * folder, never elsewhere, whoever wrote the config (a load request's config
 * override included).
 */
import { isAbsolute, relative, resolve, sep } from "node:path";
import { Code, StageError } from "./errors.js";

/**
 * `name` resolved against `folder`, refused (INVALID_ARGUMENT, naming `what`
 * and the name but not the folder) when it is absolute, holds a NUL, or
 * climbs out of `folder` with `..`.
 */
export function modelFilePath(folder: string, name: string, what: string, stage = ""): string {
  const refuse = () =>
    new StageError(Code.InvalidArgument, stage, `${what} "${name}" must name a file inside the model's folder`);
  if (name === "" || name.includes("\0") || isAbsolute(name) || /^[a-zA-Z]:/.test(name)) throw refuse();
  const root = resolve(folder);
  const path = resolve(root, name);
  const rel = relative(root, path);
  if (rel === "" || rel === ".." || rel.startsWith(`..${sep}`) || isAbsolute(rel)) throw refuse();
  return path;
}
