/**
 * process.argv without a leading `--` before the script's own arguments: pnpm 12 passes the
 * `--` of `pnpm models:synth -- --seed 7` through to the script, where commander would read
 * every argument after it as a positional one ("too many arguments").
 */
export function scriptArgv(argv: readonly string[] = process.argv): string[] {
  const [node = "node", script = "", ...rest] = argv;
  return [node, script, ...(rest[0] === "--" ? rest.slice(1) : rest)];
}
