/**
 * One extra client of attack-ab.ts, in a thread of its own: sends the attack's requests (or good
 * ones, for the control) in a closed loop until told to stop, then posts how many good ones failed.
 */
import { parentPort, workerData } from "node:worker_threads";
import { ATTACKS, goodBody } from "./attack-bodies.js";

const {
  http,
  attack: name,
  attacking,
  client,
} = workerData as {
  http: string;
  attack: string;
  attacking: boolean;
  client: number;
};
const attack = ATTACKS.find((a) => a.name === name)!;
let running = true;
parentPort?.once("message", () => {
  running = false;
});
let failedGood = 0;
for (let n = client; running; n += 2) {
  const { model, body } = attacking ? attack.attack(n) : { model: attack.good, body: goodBody(attack.good, n + 7) };
  const res = await fetch(`${http}/v2/models/${model}/infer`, {
    method: "POST",
    body,
    headers: { "content-type": "application/json" },
  });
  await res.arrayBuffer();
  if (!attacking && res.status !== 200) failedGood++;
}
parentPort?.postMessage(failedGood);
