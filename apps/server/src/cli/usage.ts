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

/**
 * A start-up failure the operator can fix, as one line (no stack): a port in use or not
 * allowed, an address that is not this machine's. `ports` names each port's flag.
 */
export function startupFailure(err: unknown, ports: Record<string, number | undefined>): string | undefined {
  const e = err as NodeJS.ErrnoException & { port?: number; address?: string };
  if (!(err instanceof Error) || e.syscall !== "listen") return undefined;
  const flag = Object.entries(ports).find(([, port]) => port !== undefined && port === e.port)?.[0];
  const where = `${flag ? `${flag} ${e.port}` : `port ${e.port}`} (${e.address}:${e.port})`;
  if (e.code === "EADDRINUSE")
    return `${where}: the port is already in use by another process; stop it or choose another port`;
  if (e.code === "EACCES") return `${where}: not allowed to listen on this port (ports below 1024 need privileges)`;
  if (e.code === "EADDRNOTAVAIL") return `${where}: ${e.address} is not an address of this machine`;
  return `${where}: cannot listen (${e.code})`;
}
