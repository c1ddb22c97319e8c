/**
 * A bare worker-thread hand-off (docs/bench-history.md, "Where the time goes"): the main thread
 * posts a small message to a worker after POSTMESSAGE_GAP_MS (40) of idle, as the server idles
 * while ORT runs, and the worker answers at once. "in" is post → the worker's handler, "out" the
 * worker's post → the main thread's handler, both on the shared wall clock
 * (performance.timeOrigin + performance.now() is comparable across threads).
 * Run (after pnpm build): node dist/bench/postmessage.js
 */
import { isMainThread, parentPort, Worker } from "node:worker_threads";

const now = () => performance.timeOrigin + performance.now();

if (isMainThread) {
  const GAP_MS = Number(process.env.POSTMESSAGE_GAP_MS ?? 40);
  const N = Number(process.env.POSTMESSAGE_N ?? 200);
  const worker = new Worker(new URL(import.meta.url));
  const ins: number[] = [];
  const outs: number[] = [];
  const once = () =>
    new Promise<void>((resolve) => {
      worker.once("message", ({ received, sent }: { received: number; sent: number }) => {
        outs.push(now() - sent);
        ins.push(received - posted);
        resolve();
      });
      const posted = now();
      worker.postMessage({ posted });
    });
  for (let i = 0; i < 20; i++) await once(); // warm-up, not counted
  ins.length = 0;
  outs.length = 0;
  for (let i = 0; i < N; i++) {
    await new Promise((r) => setTimeout(r, GAP_MS));
    await once();
  }
  await worker.terminate();
  const q = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.floor((p / 100) * (xs.length - 1))]!;
  const line = (label: string, xs: number[]) =>
    `${label}: p10 ${q(xs, 10).toFixed(3)} ms, p50 ${q(xs, 50).toFixed(3)} ms, p90 ${q(xs, 90).toFixed(3)} ms`;
  console.log(`postMessage ping-pong, ${N} calls, ${GAP_MS} ms idle before each`);
  console.log(line("in (main → worker)", ins));
  console.log(line("out (worker → main)", outs));
} else {
  parentPort!.on("message", () => {
    const received = now();
    parentPort!.postMessage({ received, sent: now() });
  });
}
