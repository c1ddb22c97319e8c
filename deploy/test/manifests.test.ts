/**
 * Every kustomize overlay renders with `kubectl kustomize` and each object in it
 * validates against the Kubernetes API schemas (kubernetes-models); the split
 * overlay has what a stage deployment needs: probes, resources, HPA, PDB, drain time.
 */
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";

const deployDir = join(import.meta.dirname, "..");
const overlaysDir = join(deployDir, "overlays");
const overlays = readdirSync(overlaysDir).sort();

interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; annotations?: Record<string, string> };
  // biome-ignore lint/suspicious/noExplicitAny: rendered YAML, checked field by field below
  spec: any;
}

function render(overlay: string): K8sObject[] {
  const out = execFileSync("kubectl", ["kustomize", join(overlaysDir, overlay)], { encoding: "utf8" });
  return parseAllDocuments(out).map((d) => d.toJSON() as K8sObject);
}

/** The kubernetes-models class for an apiVersion + kind, e.g. apps/v1 Deployment -> kubernetes-models/apps/v1/Deployment. */
async function modelOf(apiVersion: string, kind: string) {
  const mod = await import(/* @vite-ignore */ `kubernetes-models/${apiVersion}/${kind}`);
  return mod[kind] as new (
    data: object,
  ) => { validate(): void };
}

/** Validates one object; CRDs (KServe) have no model: their containers validate as core/v1 Containers. */
async function validate(obj: K8sObject): Promise<void> {
  if (obj.apiVersion.startsWith("serving.kserve.io/")) {
    const { Container } = await import("kubernetes-models/v1/Container");
    const containers: object[] =
      obj.kind === "ServingRuntime" ? obj.spec.containers : [obj.spec.predictor.model ?? obj.spec.predictor];
    expect(containers.length).toBeGreaterThan(0);
    for (const c of containers) new Container({ name: "c", ...c }).validate();
    return;
  }
  const Model = await modelOf(obj.apiVersion, obj.kind);
  new Model(obj).validate();
}

const rendered = new Map(overlays.map((o) => [o, render(o)]));
const DRAIN_FLAG = /^--exit-timeout-secs=(\d+)$/;

describe("deploy/overlays", () => {
  it("has the overlays the README names", () => {
    expect(overlays).toEqual(expect.arrayContaining(["all-in-one", "split", "gpu", "kserve"]));
  });

  it("the validator rejects a broken manifest (the check can fail)", async () => {
    const [deployment] = (rendered.get("split") ?? []).filter((o) => o.kind === "Deployment");
    const broken = structuredClone(deployment!);
    broken.spec.template.spec.containers[0].ports[0].containerPort = "http";
    await expect(validate(broken)).rejects.toThrow(/containerPort must be integer/);
    delete broken.spec.selector;
    await expect(validate(broken)).rejects.toThrow(/selector/);
  });

  for (const overlay of overlays) {
    it(`${overlay}: renders and every object validates against the Kubernetes schemas`, async () => {
      const objects = rendered.get(overlay)!;
      expect(objects.length).toBeGreaterThan(0);
      for (const obj of objects) {
        try {
          await validate(obj);
        } catch (err) {
          throw new Error(`${overlay}: ${obj.kind}/${obj.metadata.name}: ${(err as Error).message}`);
        }
      }
    });
  }

  for (const overlay of overlays.filter((o) => o !== "kserve")) {
    it(`${overlay}: every Deployment has probes, resources, a PDB, scrape annotations and time to drain`, () => {
      const objects = rendered.get(overlay)!;
      const deployments = objects.filter((o) => o.kind === "Deployment");
      expect(deployments.length).toBeGreaterThan(0);
      const pdbs = objects.filter((o) => o.kind === "PodDisruptionBudget");
      for (const d of deployments) {
        const pod = d.spec.template;
        const where = `${overlay}: ${d.metadata.name}`;
        expect(pod.metadata.annotations, where).toMatchObject({
          "prometheus.io/scrape": "true",
          "prometheus.io/port": "8002",
          "prometheus.io/path": "/metrics",
        });
        for (const c of pod.spec.containers) {
          expect(c.readinessProbe?.httpGet?.path, where).toBe("/v2/health/ready");
          expect(c.livenessProbe?.httpGet?.path, where).toBe("/v2/health/live");
          expect(Object.keys(c.resources?.requests ?? {}), where).toEqual(expect.arrayContaining(["cpu", "memory"]));
          expect(Object.keys(c.resources?.limits ?? {}), where).toContain("memory");
          const drain = (c.args as string[]).map((a) => DRAIN_FLAG.exec(a)?.[1]).find(Boolean);
          expect(drain, `${where}: --exit-timeout-secs`).toBeDefined();
          const window =
            (c.args as string[]).map((a) => /^--shutdown-drain-secs=(\d+)$/.exec(a)?.[1]).find(Boolean) ?? "0";
          expect(pod.spec.terminationGracePeriodSeconds, where).toBeGreaterThan(Number(drain) + Number(window) + 5); // + preStop
          // A model that fails to load exits the server (as tritonserver does), so the pod is never ready without it.
          if (c.image.startsWith("trellis-server")) expect(c.args, where).toContain("--exit-on-error=true");
        }
        const labels = d.spec.selector.matchLabels as Record<string, string>;
        const pdb = pdbs.find((p) => Object.entries(p.spec.selector.matchLabels).every(([k, v]) => labels[k] === v));
        expect(pdb, `${where}: PodDisruptionBudget`).toBeDefined();
      }
    });
  }

  it("split: the front and three stages, each its own Deployment, Service and CPU HPA", () => {
    const objects = rendered.get("split")!;
    const names = (kind: string) =>
      objects
        .filter((o) => o.kind === kind)
        .map((o) => o.metadata.name)
        .sort();
    const stages = ["trellis", "trellis-inference", "trellis-postprocess", "trellis-preprocess"];
    expect(names("Deployment")).toEqual(stages);
    expect(names("Service")).toEqual(stages);
    const hpas = objects.filter((o) => o.kind === "HorizontalPodAutoscaler");
    expect(hpas.map((h) => h.spec.scaleTargetRef.name).sort()).toEqual(stages);
    for (const h of hpas) {
      expect(h.spec.metrics, h.metadata.name).toContainEqual({
        type: "Resource",
        resource: { name: "cpu", target: { type: "Utilization", averageUtilization: 70 } },
      });
    }
    // Each stage loads only its own model; the front reaches all three through the endpoints ConfigMap.
    const args = (name: string) =>
      objects.find((o) => o.kind === "Deployment" && o.metadata.name === name)!.spec.template.spec.containers[0]
        .args as string[];
    for (const s of ["preprocess", "inference", "postprocess"]) {
      expect(args(`trellis-${s}`)).toContain(`--load-model=resnet50_${s}`);
    }
    expect(args("trellis")).toEqual(
      expect.arrayContaining(["--load-model=resnet50_ensemble", "--endpoints=/etc/trellis/endpoints.json"]),
    );
    const configMap = objects.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("trellis-endpoints"))!;
    expect(JSON.parse((configMap as unknown as { data: Record<string, string> }).data["endpoints.json"]!)).toEqual({
      resnet50_preprocess: "http://trellis-preprocess:8001",
      resnet50_inference: "http://trellis-inference:8001",
      resnet50_postprocess: "http://trellis-postprocess:8001",
    });
    const front = objects.find((o) => o.kind === "Deployment" && o.metadata.name === "trellis")!;
    expect(front.spec.template.spec.volumes).toContainEqual({
      name: "endpoints",
      configMap: { name: configMap.metadata.name },
    });
  });

  it("split-queue-hpa: the inference HPA also scales on nv_inference_pending_request_count", () => {
    const hpa = rendered
      .get("split-queue-hpa")!
      .find((o) => o.kind === "HorizontalPodAutoscaler" && o.metadata.name === "trellis-inference")!;
    expect(hpa.spec.metrics).toContainEqual({
      type: "Pods",
      pods: {
        metric: { name: "nv_inference_pending_request_count" },
        target: { type: "AverageValue", averageValue: "32" },
      },
    });
  });

  it("gpu: Triton is its own Deployment requesting an nvidia.com/gpu; the front loads the TensorRT ensemble", () => {
    const objects = rendered.get("gpu")!;
    const triton = objects.find((o) => o.kind === "Deployment" && o.metadata.name === "trellis-triton")!;
    const c = triton.spec.template.spec.containers[0];
    expect(c.resources.limits["nvidia.com/gpu"]).toBe(1);
    expect(c.image).toMatch(/^nvcr\.io\/nvidia\/tritonserver:\d\d\.\d\d-py3$/);
    const front = objects.find((o) => o.kind === "Deployment" && o.metadata.name === "trellis")!;
    expect(front.spec.template.spec.containers[0].args).toContain("--load-model=resnet50_ensemble_trt");
  });

  it("kserve: a ServingRuntime for the image and an InferenceService using it", () => {
    const objects = rendered.get("kserve")!;
    const runtime = objects.find((o) => o.kind === "ServingRuntime")!;
    const isvc = objects.find((o) => o.kind === "InferenceService")!;
    expect(isvc.spec.predictor.model.runtime).toBe(runtime.metadata.name);
    expect(runtime.spec.protocolVersions).toContain("v2");
    const c = runtime.spec.containers[0];
    expect(c.readinessProbe.httpGet.path).toBe("/v2/health/ready");
    expect(c.args).toContain("--model-repository=/mnt/models");
  });
});
