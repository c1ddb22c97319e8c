#!/usr/bin/env node
/**
 * `pnpm deploy:test`: the split deployment on a real engine that runs Kubernetes YAML.
 *
 * 1. builds the image (Dockerfile) on a local base image (scripts/base-image.sh, cached),
 * 2. renders deploy/overlays/split with `kubectl kustomize` and plays it with `podman kube play`,
 * 3. waits until every pod answers /v2/health/ready (the readinessProbe's endpoint),
 * 4. classifies the fixture photos through the front with the real MobileNetV2 (tooling/bundled),
 * 5. stops the inference container: requests fail, naming the step, within a bound; restarts it: recovery,
 * 6. SIGTERMs the front while requests are in flight: none of them is dropped,
 * 7. tears everything down, always.
 *
 * What podman cannot run as Kubernetes does, and the transform applied here (the only one):
 * - Services: podman has no cluster DNS. The pods share one podman network whose DNS knows
 *   each pod by its name (`<deployment>-pod-0`), so the endpoints ConfigMap's Service names
 *   become pod names. Services, HPAs and PDBs (control-plane objects) are not played;
 *   the schema test checks them. One replica per Deployment (two cores here).
 * - Probes: podman turns a liveness probe into a healthcheck run by systemd timers, which
 *   this machine lacks, and has no readiness gate: the test polls /v2/health/ready itself.
 * - The PersistentVolumeClaim becomes a podman volume bound to a temp model repository.
 * - The image name points at the image built here; CPU limits are capped at this machine's cores.
 * - Container ports are dropped (probes name port 8000): podman 4.3 publishes each containerPort on
 *   the host, where 8000 may be taken. The test reaches each pod at its IP on the podman network.
 * Environment: DEPLOY_TEST_ORDER=reverse (start the pods in the opposite order), CONTAINERS_CONF (default deploy/containers.conf), TRELLIS_BASE_IMAGE (default: the
 * local base; set it to e.g. node:20-bookworm-slim where a registry is reachable), TRELLIS_CACHE_DIR.
 */
import { execFile as execFileCb, execFileSync } from "node:child_process";
import { chmod, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  fixturePhotos,
  makeSeedRepository,
  readFixtureImage,
  referenceTop5OnThisCpu,
  STABLE_TOP1,
} from "@trellis/testing";
import { parseAllDocuments, stringify } from "yaml";

const execFile = promisify(execFileCb);
const deployDir = join(import.meta.dirname, "..");
const repoRoot = join(deployDir, "..");
process.env.CONTAINERS_CONF ??= join(deployDir, "containers.conf");
const baseImage = process.env.TRELLIS_BASE_IMAGE ?? "localhost/trellis-base:bookworm-node20";
/** TRELLIS_IMAGE: test an image built before, skipping the build. */
const image = process.env.TRELLIS_IMAGE ?? "localhost/trellis-server:deploy-test";
const run = `trellis-dt-${process.pid}`;
const network = run;
const volume = `${run}-models`;
/** Bound on how long a request may take to fail while a stage is down. */
const FAIL_BOUND_MS = 10_000;

const t0 = Date.now();
const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;
const log = (line) => console.log(`[deploy-test ${secs(Date.now() - t0).padStart(7)}] ${line}`);
const failures = [];
const summary = {};
/** The containers kube play started, for their logs on failure. */
const playedContainers = [];
function check(ok, what) {
  console.log(`  ${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures.push(what);
}

async function sh(cmd, args, options = {}) {
  const { stdout } = await execFile(cmd, args, { maxBuffer: 64 << 20, ...options });
  return stdout;
}
const podman = (...args) => sh("podman", args);

// ---------------------------------------------------------------- KServe v2 over HTTP
/** One image through the front's HTTP endpoint (binary tensor extension), bounded by `timeoutMs`. */
async function classify(host, bytes, timeoutMs = 60_000) {
  const header = JSON.stringify({
    inputs: [
      {
        name: "RAW_IMAGE",
        datatype: "BYTES",
        shape: [1, 1],
        parameters: { binary_data_size: bytes.length + 4 },
      },
    ],
  });
  const len = Buffer.alloc(4);
  len.writeUInt32LE(bytes.length);
  const body = Buffer.concat([Buffer.from(header), len, bytes]);
  const res = await fetch(`http://${host}:8000/v2/models/resnet50_ensemble/infer`, {
    method: "POST",
    body,
    headers: { "Inference-Header-Content-Length": String(header.length), "Content-Type": "application/octet-stream" },
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await res.text();
  if (!res.ok) return { status: res.status, error: JSON.parse(text).error ?? text };
  const results = JSON.parse(JSON.parse(text).outputs[0].data[0]);
  return { status: res.status, top1: results.top5_labels[0], results };
}

/** `classify` on its own connection with node:http, calling `onSent` once the whole request is written. */
function rawClassify(host, bytes, onSent) {
  const header = JSON.stringify({
    inputs: [
      { name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1], parameters: { binary_data_size: bytes.length + 4 } },
    ],
  });
  const len = Buffer.alloc(4);
  len.writeUInt32LE(bytes.length);
  const body = Buffer.concat([Buffer.from(header), len, bytes]);
  return new Promise((resolve) => {
    const req = http.request(
      {
        host,
        port: 8000,
        method: "POST",
        path: "/v2/models/resnet50_ensemble/infer",
        agent: false,
        headers: { "Inference-Header-Content-Length": header.length, "Content-Length": body.length },
        timeout: 60_000,
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString();
          if (res.statusCode !== 200) return resolve({ status: res.statusCode, error: text });
          resolve({ status: 200, top1: JSON.parse(JSON.parse(text).outputs[0].data[0]).top5_labels[0] });
        });
        res.on("error", (err) => resolve({ error: String(err) }));
      },
    );
    req.on("finish", onSent);
    req.on("error", (err) => {
      onSent();
      resolve({ error: String(err) });
    });
    req.on("timeout", () => req.destroy(new Error("timed out")));
    req.end(body);
  });
}

async function ready(host) {
  try {
    const res = await fetch(`http://${host}:8000/v2/health/ready`, { signal: AbortSignal.timeout(2000) });
    return res.status === 200;
  } catch {
    return false;
  }
}

async function until(what, predicate, timeoutMs, everyMs = 250) {
  const start = Date.now();
  while (Date.now() - start < timeoutMs) {
    if (await predicate()) return Date.now() - start;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`${what}: not within ${secs(timeoutMs)}`);
}

// ---------------------------------------------------------------- the manifests, for podman
/** The split overlay as podman plays it: see this file's head for what changes and why. */
async function podmanManifests() {
  const rendered = execFileSync("kubectl", ["kustomize", join(deployDir, "overlays", "split")], { encoding: "utf8" });
  const objects = parseAllDocuments(rendered).map((d) => d.toJSON());
  const cores = availableParallelism();
  const played = [];
  for (const obj of objects) {
    if (obj.kind === "ConfigMap" && obj.data?.["endpoints.json"]) {
      const endpoints = JSON.parse(obj.data["endpoints.json"]);
      for (const [model, url] of Object.entries(endpoints)) {
        endpoints[model] = url.replace(/^http:\/\/([a-z0-9-]+):/, "http://$1-pod-0:");
      }
      obj.data["endpoints.json"] = JSON.stringify(endpoints);
      played.push(obj);
    } else if (obj.kind === "Deployment") {
      obj.spec.replicas = 1;
      const pod = obj.spec.template.spec;
      for (const c of pod.containers) {
        c.image = image;
        // podman 4.3 publishes each containerPort on the host's same port: pods are reached at their IPs instead.
        delete c.ports;
        for (const probe of [c.readinessProbe, c.livenessProbe, c.startupProbe]) {
          if (probe?.httpGet) probe.httpGet.port = 8000;
        }
        const limit = c.resources?.limits?.cpu;
        if (limit && Number.parseFloat(limit) > cores) c.resources.limits.cpu = String(cores);
      }
      for (const v of pod.volumes ?? []) {
        if (v.persistentVolumeClaim) v.persistentVolumeClaim.claimName = volume;
      }
      played.push(obj);
    }
  }
  // DEPLOY_TEST_ORDER=reverse: the pods start in the opposite order (kube play follows the file), so
  // the front comes up before the steps it calls: it must wait for them, not exit.
  if (process.env.DEPLOY_TEST_ORDER === "reverse") {
    const deployments = played.filter((o) => o.kind === "Deployment").reverse();
    return [...played.filter((o) => o.kind !== "Deployment"), ...deployments];
  }
  return played;
}

// ---------------------------------------------------------------- teardown, always
const cleanups = [];
let tornDown = false;
async function teardown() {
  if (tornDown) return;
  tornDown = true;
  log("teardown");
  for (const fn of cleanups.reverse()) {
    try {
      await fn();
    } catch (err) {
      console.error(`  teardown: ${err.message.split("\n")[0]}`);
    }
  }
}
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    teardown().finally(() => process.exit(130));
  });
}

// ---------------------------------------------------------------- the test
async function main() {
  for (const tool of ["podman", "kubectl"]) {
    try {
      execFileSync(tool, ["version", ...(tool === "kubectl" ? ["--client"] : [])], { stdio: "ignore" });
    } catch {
      throw new Error(`${tool} not found: .ci/run installs it (apt-get install podman runc mmdebstrap; kubectl)`);
    }
  }

  // 1. images
  if (process.env.TRELLIS_IMAGE) {
    log(`testing ${image} (TRELLIS_IMAGE: not built here)`);
  } else {
    await buildImage();
  }
  await runTest();
}

async function buildImage() {
  if (!process.env.TRELLIS_BASE_IMAGE) {
    log(`base image ${baseImage}`);
    execFileSync("bash", [join(deployDir, "scripts", "base-image.sh")], { stdio: "inherit" });
  }
  log(`building ${image} from Dockerfile (BASE_IMAGE=${baseImage})`);
  // Host network for the build's RUN steps: the bridge's NAT stalls large registry downloads here.
  const buildArgs = ["build", "--network", "host", "--build-arg", `BASE_IMAGE=${baseImage}`, "-t", image];
  // This machine's pnpm store, bind-mounted for the build's RUN steps: the install needs no downloads.
  try {
    const store = execFileSync("pnpm", ["store", "path"], { cwd: repoRoot, encoding: "utf8" }).trim();
    buildArgs.push("-v", `${join(store, "..")}:/pnpm/store`);
    // The host's pnpm verified this lockfile when it installed it; the build need not fetch metadata again.
    buildArgs.push("--build-arg", "PNPM_FLAGS=--offline", "--build-arg", "PNPM_MINIMUM_RELEASE_AGE=0");
  } catch {}
  const buildStart = Date.now();
  // TRELLIS_BUILD_CONTEXT: another source tree to build (e.g. `git archive HEAD | tar -x -C dir`).
  const context = process.env.TRELLIS_BUILD_CONTEXT ?? repoRoot;
  execFileSync("podman", [...buildArgs, "-f", join(context, "Dockerfile"), context], {
    stdio: ["ignore", "ignore", "inherit"],
  });
  const buildMs = Date.now() - buildStart;
  log(`image built in ${secs(buildMs)}`);
  summary.build = secs(buildMs);
}

async function runTest() {
  // 2. a model repository: the seed's configs with the real MobileNetV2 and labels, readable by the image's user
  const repository = await makeSeedRepository({ prefix: `${run}-` });
  cleanups.push(() => rm(repository, { recursive: true, force: true }));
  await chmod(repository, 0o755);
  await podman("volume", "create", "--opt", "type=none", "--opt", "o=bind", "--opt", `device=${repository}`, volume);
  cleanups.push(() => podman("volume", "rm", "-f", volume));
  await podman("network", "create", network);
  cleanups.push(() => podman("network", "rm", "-f", network));

  const manifests = await podmanManifests();
  const manifestFile = join(repository, "..", `${run}.yaml`);
  await writeFile(manifestFile, manifests.map((o) => stringify(o)).join("---\n"));
  cleanups.push(() => rm(manifestFile, { force: true }));
  const deployments = manifests.filter((o) => o.kind === "Deployment").map((o) => o.metadata.name);
  log(`playing deploy/overlays/split: ${deployments.join(", ")} (+ ConfigMap)`);

  // 3. play, wait for readiness
  const playStart = Date.now();
  cleanups.push(async () => {
    await podman("kube", "down", manifestFile);
    // kube down leaves the volumes podman made for ConfigMaps.
    for (const cm of manifests.filter((o) => o.kind === "ConfigMap")) {
      await podman("volume", "rm", "-f", cm.metadata.name).catch(() => {});
    }
  });
  await podman("kube", "play", "--network", network, manifestFile);
  const pods = {};
  for (const d of deployments) {
    const container = `${d}-pod-0-server`;
    playedContainers.push(container);
    const info = JSON.parse(await podman("inspect", container));
    pods[d] = { container, ip: info[0].NetworkSettings.Networks[network].IPAddress };
  }
  const readyAt = {};
  await Promise.all(
    deployments.map(async (d) => {
      await until(`${d} ready`, () => ready(pods[d].ip), 180_000);
      readyAt[d] = Date.now() - playStart;
    }),
  );
  const readyMs = Date.now() - playStart;
  log(
    `all pods ready ${secs(readyMs)} after kube play (${deployments.map((d) => `${d} ${secs(readyAt[d])}`).join(", ")})`,
  );
  const front = pods.trellis.ip;
  // Started in any order, no pod exited on the way (a front whose steps were not up yet waits for them).
  for (const d of deployments) {
    const restarts = JSON.parse(await podman("inspect", pods[d].container))[0].RestartCount ?? 0;
    check(restarts === 0, `${d} came up without a restart (${restarts})`);
  }
  summary.order = process.env.DEPLOY_TEST_ORDER === "reverse" ? "reverse" : "file";

  // 4. the fixture photos through the front
  log("classifying the fixture photos through the front (MobileNetV2, int8)");
  const reference = await referenceTop5OnThisCpu();
  for (const photo of fixturePhotos()) {
    const answer = await classify(front, Buffer.from(readFixtureImage(photo)));
    const expected = STABLE_TOP1[photo]?.label ?? reference[photo].top5_labels[0];
    const source = STABLE_TOP1[photo] ? "README" : "ONNX Runtime on this CPU";
    check(
      answer.top1 === expected,
      `${photo.padEnd(24)} top-1 ${JSON.stringify(answer.top1 ?? answer.error)} (expected ${JSON.stringify(expected)}, ${source})`,
    );
  }
  const chelsea = Buffer.from(readFixtureImage("chelsea.jpg"));

  // 5. inference down: bounded failure naming the step; back up: recovery
  log(`stopping ${pods["trellis-inference"].container}`);
  await podman("stop", "--time", "0", pods["trellis-inference"].container);
  const failStart = Date.now();
  const down = await classify(front, chelsea, FAIL_BOUND_MS + 5_000).catch((err) => ({ error: String(err) }));
  const failMs = Date.now() - failStart;
  console.log(`  while inference is down: HTTP ${down.status} after ${failMs} ms: ${down.error}`);
  check(
    down.status === 503 && /resnet50_inference/.test(down.error),
    "the request fails 503, naming resnet50_inference",
  );
  check(!/\d+\.\d+\.\d+\.\d+|trellis-inference-pod/.test(down.error), "the error names no address");
  check(failMs < FAIL_BOUND_MS, `it fails within ${FAIL_BOUND_MS} ms (no hang)`);
  const frontUnready = await until("front not ready", async () => !(await ready(front)), 15_000).catch(() => -1);
  check(frontUnready >= 0, `the front reports not ready while inference is down (${frontUnready} ms)`);

  log(`restarting ${pods["trellis-inference"].container}`);
  const restartStart = Date.now();
  await podman("start", pods["trellis-inference"].container);
  const recoveryMs = await until(
    "recovery",
    async () => (await classify(front, chelsea, 5_000).catch(() => ({}))).top1 === "Egyptian cat",
    120_000,
  );
  log(`recovered: chelsea.jpg classified through the front ${secs(recoveryMs)} after the restart`);
  check(Date.now() - restartStart < 120_000, "recovery after restart");

  // 6. SIGTERM to the front with requests in flight: every one of them completes. A request counts
  // as in flight once its whole body is written to its own connection; the signal waits for that.
  const inFlight = 24;
  log(`SIGTERM to ${pods.trellis.container} with ${inFlight} requests in flight`);
  const sent = [];
  const requests = Array.from({ length: inFlight }, () => {
    let onSent;
    sent.push(new Promise((r) => (onSent = r)));
    return rawClassify(front, chelsea, onSent);
  });
  await Promise.all(sent);
  await podman("kill", "--signal", "TERM", pods.trellis.container);
  const outcomes = await Promise.all(requests);
  const ok = outcomes.filter((o) => o.top1 === "Egyptian cat").length;
  const dropped = outcomes.filter((o) => o.top1 !== "Egyptian cat");
  console.log(`  in flight at SIGTERM: ${inFlight}, completed: ${ok}, dropped: ${dropped.length}`);
  for (const d of dropped.slice(0, 3)) console.log(`    dropped: ${d.status ?? ""} ${d.error}`);
  check(ok === inFlight && dropped.length === 0, "SIGTERM drains: no in-flight request dropped");
  summary.drain = `${ok}/${inFlight}`;

  console.log(
    `\nsummary: image build ${summary.build ?? "skipped"}, pods started in ${summary.order} order, ready ${secs(readyMs)}, no restarts, ` +
      `failure while down ${failMs} ms, recovery ${secs(recoveryMs)}, in-flight at SIGTERM ${summary.drain} completed`,
  );
}

try {
  await main();
} catch (err) {
  failures.push(err.message);
  console.error(`deploy test: ${err.stack ?? err}`);
}
if (failures.length) {
  // The pods' logs, to see why.
  for (const name of playedContainers) {
    const { stdout, stderr } = await execFile("podman", ["logs", "--tail", "20", name]).catch((e) => e);
    console.error(`--- podman logs ${name}\n${stdout ?? ""}${stderr ?? ""}`);
  }
}
await teardown();
log(failures.length ? `FAILED: ${failures.length} check(s)` : "passed");
process.exit(failures.length ? 1 : 0);
