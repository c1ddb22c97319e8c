/** Issue 46's bounds, round 3, through a real server process. */
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeRepository, postJson } from "./helpers.js";

let server: ServerProcess;
let repo: string;

beforeAll(async () => {
  repo = await makeRepository({});
  server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
}, 60_000);

afterAll(async () => {
  await server?.stop();
  await removeDir(repo);
});

describe("the logging endpoint", () => {
  it("answers an object's own keys (constructor, toString, __proto__) as unknown settings", async () => {
    const before = await fetch(`${server.http}/v2/logging`).then((r) => r.json());
    for (const key of ["constructor", "toString", "hasOwnProperty", "valueOf", "__proto__"]) {
      // Raw JSON text: an object literal's __proto__ would set the prototype, not send the key.
      const res = await fetch(`${server.http}/v2/logging`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: `{${JSON.stringify(key)}: 1}`,
      });
      expect(res.status, key).toBe(400);
      expect((await res.json()).error, key).toMatch(new RegExp(`^unknown log setting '${key}' \\(settings: `));
    }
    // Nothing changed, and good settings still apply.
    expect(await fetch(`${server.http}/v2/logging`).then((r) => r.json())).toEqual(before);
    expect((await postJson(`${server.http}/v2/logging`, { log_verbose_level: 0 })).status).toBe(200);
  });
});
