/** What the command-line readers share: their error type and tritonserver's "<scope>,<key>=<value>" settings. */

/** A bad flag or flag file: printed as one line, without a stack. */
export class UsageError extends Error {}

/**
 * One "[<scope>,]<key>=<value>" entry of tritonserver's --*-config flags ("local,size=1024",
 * "triton,file=/tmp/t.json", "rate=100"): the scope is what precedes a comma ahead of the first "=".
 */
export function splitSetting(entry: string): { scope?: string; key: string; value?: string } {
  const eq = entry.indexOf("=");
  const comma = entry.indexOf(",");
  const scoped = comma >= 0 && (eq < 0 || comma < eq);
  const rest = scoped ? entry.slice(comma + 1) : entry;
  const at = rest.indexOf("=");
  return {
    ...(scoped ? { scope: entry.slice(0, comma) } : {}),
    key: at < 0 ? rest : rest.slice(0, at),
    ...(at < 0 ? {} : { value: rest.slice(at + 1) }),
  };
}
