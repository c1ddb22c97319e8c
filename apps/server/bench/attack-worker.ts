/**
 * The two extra clients of attack-ab.ts, in a process of their own started at the lowest CPU
 * priority (`nice -n 19`): on one 2-core machine it stands in for clients on another machine, so
 * what the bench measures is what their requests cost the server, not what reading their answers
 * (32 MiB each in the large-answer attack) or looping on fast refusals costs the good clients'
 * own process. Sends the attack's requests (or good ones, for the control) in two closed loops
 * until told to stop, then sends back how many requests it sent and how many good ones failed.
 */
import { ATTACKS, goodBody } from "./attack-bodies.js";

const [http, name, mode] = process.argv.slice(2) as [string, string, "attack" | "control"];
const attacking = mode === "attack";
const attack = ATTACKS.find((a) => a.name === name)!;
let running = true;
process.once("message", () => {
  running = false;
});
let sent = 0;
let failedGood = 0;
await Promise.all(
  [0, 1].map(async (client) => {
    for (let n = client; running; n += 2) {
      const { model, body } = attacking ? attack.attack(n) : { model: attack.good, body: goodBody(attack.good, n + 7) };
      const res = await fetch(`${http}/v2/models/${model}/infer`, {
        method: "POST",
        body,
        headers: { "content-type": "application/json" },
      });
      await res.arrayBuffer();
      sent++;
      if (!attacking && res.status !== 200) failedGood++;
    }
  }),
);
process.send?.({ sent, failedGood }, () => process.exit(0));
