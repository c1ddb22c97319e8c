/**
 * models:fetch on an unreliable network, against HTTP servers on 127.0.0.1: a connection
 * dropped mid-body is resumed with a Range request, 503s are retried, HTTP_PROXY is used
 * (a tiny forward proxy on loopback) unless NO_PROXY names the host, and the offline
 * fallback says why.
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import {
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type Artifact, ensureModels, fetchModels } from "../src/index.js";

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
const body = randomBytes(256 * 1024);

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
async function listen(handler: Handler): Promise<{ server: Server; url: string }> {
  const server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}
/** Drops `res`'s connection once `path` holds `size` bytes: the client has written all that was sent. */
function dropWhenWritten(res: ServerResponse, path: string, size: number): void {
  const poll = setInterval(async () => {
    const written = await stat(path).then(
      (st) => st.size,
      () => 0,
    );
    if (written >= size) {
      clearInterval(poll);
      res.socket?.destroy();
    }
  }, 5);
}
const close = (s: Server) =>
  new Promise((r) => {
    s.closeAllConnections();
    s.close(r);
  });

describe("models:fetch on an unreliable network", () => {
  let dir: string;
  const servers: Server[] = [];
  const env = { ...process.env };
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "fetch-net-"));
  });
  afterEach(() => {
    for (const k of ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"]) {
      if (env[k] === undefined) delete process.env[k];
      else process.env[k] = env[k];
    }
  });
  afterAll(async () => {
    await Promise.all(servers.map(close));
    await rm(dir, { recursive: true, force: true });
  });
  const serve = async (handler: Handler) => {
    const s = await listen(handler);
    servers.push(s.server);
    return s.url;
  };
  const artifact = (url: string, name = "model.bin"): Artifact => ({
    name,
    url: `${url}/${name}`,
    sha256: sha(body),
    dest: `m/1/${name}`,
  });

  it("resumes a download cut off mid-body with a Range request, and the file is complete", async () => {
    const seen: (string | undefined)[] = [];
    const half = body.length / 2;
    const repository = join(dir, "resume");
    const url = await serve((req, res) => {
      seen.push(req.headers.range);
      const range = /^bytes=(\d+)-$/.exec(req.headers.range ?? "");
      if (!range) {
        // The whole file announced, half of it sent, then the connection dropped.
        res.writeHead(200, { "content-length": body.length, "accept-ranges": "bytes" });
        res.write(body.subarray(0, half));
        dropWhenWritten(res, join(repository, "m/1/model.bin.part"), half);
        return;
      }
      const from = Number(range[1]);
      res.writeHead(206, {
        "content-length": body.length - from,
        "content-range": `bytes ${from}-${body.length - 1}/${body.length}`,
      });
      res.end(body.subarray(from));
    });
    const lines: string[] = [];
    const [got] = await fetchModels({
      repository,
      artifacts: [artifact(url)],
      retryDelayMs: 1,
      log: (l) => lines.push(l),
    });
    expect(seen).toEqual([undefined, `bytes=${half}-`]);
    expect(got!.sha256).toBe(sha(body));
    expect(got!.bytes).toBe(body.length);
    expect(Buffer.compare(await readFile(join(repository, "m/1/model.bin")), body)).toBe(0);
    expect(lines.join("\n")).toContain(`resuming at byte ${half}`);
  });

  it("starts over when the server ignores the Range header", async () => {
    const seen: (string | undefined)[] = [];
    const repository = join(dir, "restart");
    const url = await serve((req, res) => {
      seen.push(req.headers.range);
      res.writeHead(200, { "content-length": body.length });
      if (seen.length > 1) return void res.end(body);
      res.write(body.subarray(0, 1000));
      dropWhenWritten(res, join(repository, "m/1/model.bin.part"), 1000);
    });
    const lines: string[] = [];
    const [got] = await fetchModels({
      repository,
      artifacts: [artifact(url)],
      retryDelayMs: 1,
      log: (l) => lines.push(l),
    });
    expect(seen).toEqual([undefined, "bytes=1000-"]);
    expect(lines.join("\n")).toContain("the server does not resume downloads; starting over");
    expect(got!.sha256).toBe(sha(body));
    expect(Buffer.compare(await readFile(join(repository, "m/1/model.bin")), body)).toBe(0);
  });

  it("retries 503 with backoff, then succeeds", async () => {
    let calls = 0;
    const url = await serve((_req, res) => {
      calls++;
      if (calls <= 2) res.writeHead(503).end("busy");
      else res.writeHead(200, { "content-length": body.length }).end(body);
    });
    const lines: string[] = [];
    const [got] = await fetchModels({
      repository: join(dir, "retry"),
      artifacts: [artifact(url)],
      retryDelayMs: 1,
      log: (l) => lines.push(l),
    });
    expect(calls).toBe(3);
    expect(got!.sha256).toBe(sha(body));
    expect(lines.filter((l) => l.includes("HTTP 503") && l.includes("retrying"))).toHaveLength(2);
  });

  it("gives up after the retries, and the bundled-model fallback names the last error", async () => {
    let calls = 0;
    const url = await serve((_req, res) => {
      calls++;
      res.writeHead(502).end("bad gateway");
    });
    const warnings: string[] = [];
    const result = await ensureModels({
      repository: join(dir, "fallback"),
      artifacts: [artifact(url)],
      retries: 2,
      retryDelayMs: 1,
      log: () => {},
      warn: (l) => warnings.push(l),
    });
    expect(calls).toBe(3);
    expect(result.source).toBe("bundled");
    expect(warnings[0]).toContain(`GET ${url}/model.bin: HTTP 502 Bad Gateway (3 tries)`);
    expect(warnings[0]).toContain("bundled MobileNetV2");
  });

  it("does not retry a 404", async () => {
    let calls = 0;
    const url = await serve((_req, res) => {
      calls++;
      res.writeHead(404).end("no");
    });
    const err = await fetchModels({
      repository: join(dir, "404"),
      artifacts: [artifact(url)],
      retryDelayMs: 1,
      log: () => {},
    }).catch((e) => e);
    expect(err.message).toContain("HTTP 404");
    expect(calls).toBe(1);
  });

  it("goes through HTTP_PROXY, and around it for a host in NO_PROXY", async () => {
    const origin: string[] = [];
    const url = await serve((req, res) => {
      origin.push(req.url ?? "");
      res.writeHead(200, { "content-length": body.length }).end(body);
    });
    // A forward proxy: absolute-URI requests for http:// targets, passed on.
    const proxied: string[] = [];
    const proxy = await serve((req, res) => {
      proxied.push(req.url ?? "");
      const upstream = httpRequest(req.url ?? "", { method: req.method, headers: req.headers }, (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      });
      upstream.on("error", () => res.writeHead(502).end());
      req.pipe(upstream);
    });
    process.env.HTTP_PROXY = proxy;
    delete process.env.http_proxy;
    delete process.env.NO_PROXY;
    delete process.env.no_proxy;
    const [viaProxy] = await fetchModels({ repository: join(dir, "proxy"), artifacts: [artifact(url)], log: () => {} });
    expect(viaProxy!.sha256).toBe(sha(body));
    expect(proxied).toEqual([`${url}/model.bin`]);
    expect(origin).toEqual(["/model.bin"]);

    process.env.NO_PROXY = "127.0.0.1";
    const [direct] = await fetchModels({
      repository: join(dir, "no-proxy"),
      artifacts: [artifact(url)],
      log: () => {},
    });
    expect(direct!.sha256).toBe(sha(body));
    expect(proxied).toHaveLength(1);
    expect(origin).toEqual(["/model.bin", "/model.bin"]);
  });
});
