/**
 * One candidate on a real server: its temp repository served by apps/server's built main.js on
 * loopback ephemeral ports, measured over gRPC with the client's perf_analyzer measurement
 * (`measure`), a concurrency at a time, stopping as soon as the rest of the sweep cannot matter.
 */
import { connectEndpoint, type Endpoint, measure, type PerfResult } from "@trellis/client";
import type { InferRequest } from "@trellis/stage";
import { type ServerProcess, startServerProcess } from "@trellis/testing";
import { candidateRepository, type EnsembleRepository, removeRepository } from "./repository.js";
import type { Candidate } from "./space.js";

export interface Subject {
  candidate: Candidate;
  server: ServerProcess;
  endpoint: Endpoint;
  stop(): Promise<void>;
}

/** Starts a server for `candidate`; `stop()` ends it and removes its temp repository. */
export async function startSubject(repo: EnsembleRepository, candidate: Candidate): Promise<Subject> {
  const dir = await candidateRepository(repo, candidate);
  let server: ServerProcess;
  try {
    server = await startServerProcess(["--model-repository", dir]);
  } catch (err) {
    await removeRepository(dir);
    throw err;
  }
  const endpoint = connectEndpoint(server.grpc, "grpc");
  return {
    candidate,
    server,
    endpoint,
    stop: async () => {
      endpoint.close();
      await server.stop();
      await removeRepository(dir);
    },
  };
}

export interface WindowOptions {
  model: string;
  requests: InferRequest[];
  windowMs: number;
  warmupMs: number;
}

/** One measurement window at `concurrency`, as `pnpm client perf` takes it. */
export function measureAt(subject: Subject, options: WindowOptions, concurrency: number): Promise<PerfResult> {
  return measure(subject.endpoint, { ...options, batch: 1, concurrency });
}

export interface SweepPoint {
  concurrency: number;
  throughput: number;
  p99Ms: number;
  p50Ms: number;
  /** Each model's mean time per request in the window (queue + compute), from the server's statistics. */
  modelMs: Record<string, number>;
}

export type SweepEnd = "done" | "over budget" | "pruned" | "failed";

export interface Sweep {
  points: SweepPoint[];
  /** Why the sweep ended: all concurrencies done, p99 over the budget, pruned (cannot beat the incumbent), or its server failed. */
  end: SweepEnd;
  /** The best throughput among the points within the budget; 0 when none is. */
  score: number;
}

export const toPoint = (r: PerfResult): SweepPoint => ({
  concurrency: r.concurrency,
  throughput: r.throughput,
  p99Ms: r.latencyUs.p99 / 1000,
  p50Ms: r.latencyUs.p50 / 1000,
  modelMs: Object.fromEntries(r.server.map((s) => [s.model, s.requestUs / 1000])),
});

/** The best throughput among `points` whose p99 is within the budget (0 when none is). */
export const scoreOf = (points: SweepPoint[], budgetMs: number) =>
  Math.max(0, ...points.filter((p) => p.p99Ms <= budgetMs).map((p) => p.throughput));

/**
 * The most throughput the rest of a sweep could reach after `last`: in a closed loop
 * throughput = concurrency / mean latency (Little's law), and latency does not fall as more
 * requests queue, so at concurrency c' it is at most X(c) · c'/c.
 */
export const sweepBound = (last: SweepPoint, highest: number) => (last.throughput * highest) / last.concurrency;

/**
 * Measures `concurrencies` in order, stopping at the first point over the budget (more
 * concurrency only queues more) or once `sweepBound` says no later point can beat `incumbent`.
 */
export async function sweep(
  subject: Subject,
  options: WindowOptions & { concurrencies: number[]; budgetMs: number; incumbent: number },
): Promise<Sweep> {
  const points: SweepPoint[] = [];
  const highest = Math.max(...options.concurrencies);
  let end: SweepEnd = "done";
  for (const concurrency of options.concurrencies) {
    const point = toPoint(await measureAt(subject, options, concurrency));
    points.push(point);
    if (point.p99Ms > options.budgetMs) {
      end = "over budget";
      break;
    }
    const best = scoreOf(points, options.budgetMs);
    if (concurrency < highest && Math.max(best, sweepBound(point, highest)) <= options.incumbent) {
      end = "pruned";
      break;
    }
  }
  return { points, end, score: scoreOf(points, options.budgetMs) };
}
