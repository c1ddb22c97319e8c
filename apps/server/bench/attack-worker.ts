/**
 * The two extra clients of attack-ab.ts, in a process of their own started at the lowest CPU
 * priority (`nice -n 19`): on one 2-core machine it stands in for clients on another machine, so
 * what the bench measures is what their requests cost the server, not what reading their answers
 * (32 MiB each in the large-answer attack) or looping on fast refusals costs the good clients'
 * own process. For the same reason each answer is read and dropped as it arrives (node:http,
 * keep-alive), not assembled: fetch's arrayBuffer() cost this process 0.6–0.75 of a core at three
 * 32 MiB answers a second, which the good clients paid for in memory bandwidth and cache.
 * Sends the attack's requests (or good ones, for the control) in two closed loops until told to
 * stop, then sends back how many requests it sent and how many good ones failed.
 */
import { Agent, request } from "node:http";
import { ATTACKS, goodBody } from "./attack-bodies.js";

const [http, name, mode] = process.argv.slice(2) as [string, string, "attack" | "control"];
const attacking = mode === "attack";
const attack = ATTACKS.find((a) => a.name === name)!;
const agent = new Agent({ keepAlive: true, maxSockets: 2 });
let running = true;
process.once("message", () => {
  running = false;
});

/** POSTs `body` and reads the answer to its end, dropping it; resolves to the status. */
function post(model: string, body: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${http}/v2/models/${model}/infer`,
      {
        method: "POST",
        agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        res.on("end", () => resolve(res.statusCode ?? 0));
        res.on("error", reject);
        res.resume();
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

let sent = 0;
let failedGood = 0;
await Promise.all(
  [0, 1].map(async (client) => {
    for (let n = client; running; n += 2) {
      const { model, body } = attacking ? attack.attack(n) : { model: attack.good, body: goodBody(attack.good, n + 7) };
      const status = await post(model, body);
      sent++;
      if (!attacking && status !== 200) failedGood++;
    }
  }),
);
agent.destroy();
process.send?.({ sent, failedGood }, () => process.exit(0));
