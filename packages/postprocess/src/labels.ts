import { readFile } from "node:fs/promises";
import { basename } from "node:path";
import { Code, StageError } from "@trellis/stage";

/**
 * Parses a label file the way the seed read it: one label per line,
 * surrounding whitespace stripped (Python's `line.strip()`), and a final
 * newline does not make an extra empty label.
 */
export function parseLabels(text: string): string[] {
  const lines = text.split(/\r?\n/);
  if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();
  return lines.map((l) => l.trim());
}

/** Reads a label file; a missing or unreadable file is NOT_FOUND naming the file (not the folder it was looked for in). */
export async function loadLabels(path: string, stage: string): Promise<string[]> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    const why = (err as NodeJS.ErrnoException).code ?? "unreadable";
    throw new StageError(Code.NotFound, stage, `cannot read label file ${basename(path)} (${why})`, {
      cause: err,
    });
  }
  return parseLabels(text);
}
