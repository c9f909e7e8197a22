// Validates one rendered kustomize overlay (multi-document YAML on stdin):
//  1. every object against the Kubernetes OpenAPI schemas bundled in kubernetes-models (and the
//     Prometheus Operator CRD schemas for PodMonitor), so wrong types, missing required fields and
//     bad enums fail offline;
//  2. the deployment rules of deploy/README.md that schemas cannot express: gRPC probes, resources,
//     non-root, grace period >= drain, selectors that select something, $(VAR)s that exist, GPUs.
// Usage: node validate_manifests.mjs OVERLAY_NAME < rendered.yaml   (exit 1 on any problem)
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const overlay = process.argv[2] ?? "?";
const problems = [];
const fail = (where, what) => problems.push(`${overlay}: ${where}: ${what}`);

// apiVersion -> module holding its model classes.
function moduleFor(apiVersion) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  }
  return `kubernetes-models/${apiVersion}`;
}

const docs = parseAllDocuments(readFileSync(0, "utf8"));
const objects = [];
for (const doc of docs) {
  if (doc.errors.length) fail("yaml", doc.errors.map((e) => e.message).join("; "));
  const obj = doc.toJS();
  if (obj) objects.push(obj);
}
if (objects.length === 0) fail("render", "no objects");

for (const obj of objects) {
  const where = `${obj.kind}/${obj.metadata?.name}`;
  let mod;
  try {
    mod = await import(moduleFor(obj.apiVersion));
  } catch {
    fail(where, `no schema for apiVersion ${obj.apiVersion}`);
    continue;
  }
  const Model = mod[obj.kind];
  if (!Model) {
    fail(where, `no schema for kind ${obj.kind} in ${obj.apiVersion}`);
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(where, `schema: ${e.message}`);
  }
}

const byKind = (kind) => objects.filter((o) => o.kind === kind);
const deployments = byKind("Deployment");
const configMaps = new Map(byKind("ConfigMap").map((c) => [c.metadata.name, c]));
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const podLabels = deployments.map((d) => d.spec.template.metadata.labels);
const selectsPods = (selector) =>
  selector && Object.keys(selector).length > 0 && podLabels.some((l) => matches(selector, l));

for (const d of deployments) {
  const where = `Deployment/${d.metadata.name}`;
  const pod = d.spec.template.spec;
  if (!matches(d.spec.selector.matchLabels, d.spec.template.metadata.labels)) {
    fail(where, "selector does not match the pod template's labels");
  }
  if (pod.securityContext?.runAsNonRoot !== true) fail(where, "pod must set runAsNonRoot");
  for (const c of pod.containers) {
    const cw = `${where} container ${c.name}`;
    const args = c.args ?? [];
    const flag = (name) => args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
    const port = Number(flag("port"));
    if (!args.includes("serve")) fail(cw, "does not run `specula serve`");
    if (flag("host") !== "0.0.0.0") fail(cw, "--host must be 0.0.0.0 to be reachable");
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      if (c[probe]?.grpc?.port !== port) fail(cw, `${probe} must be a gRPC probe on --port`);
    }
    if (!c.readinessProbe?.grpc?.service?.startsWith("specula.v1.")) {
      fail(cw, "readinessProbe must check the role's service (specula.v1.*)");
    }
    if (!c.ports?.some((p) => p.name === "metrics" && p.containerPort === Number(flag("metrics-port")))) {
      fail(cw, "needs a `metrics` port equal to --metrics-port (PodMonitor scrapes it by name)");
    }
    for (const r of ["cpu", "memory"]) {
      if (!c.resources?.requests?.[r]) fail(cw, `resources.requests.${r} missing`);
    }
    if (!c.resources?.limits?.memory) fail(cw, "resources.limits.memory missing");
    if (c.securityContext?.allowPrivilegeEscalation !== false) {
      fail(cw, "allowPrivilegeEscalation must be false");
    }
    // $(NAME) in args expands only from env / envFrom; an unknown name stays literal.
    const env = new Set((c.env ?? []).map((e) => e.name));
    for (const ref of c.envFrom ?? []) {
      const cm = configMaps.get(ref.configMapRef?.name);
      if (!cm) fail(cw, `envFrom ConfigMap ${ref.configMapRef?.name} is not rendered`);
      for (const k of Object.keys(cm?.data ?? {})) env.add(k);
    }
    for (const a of args) {
      for (const [, name] of a.matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        if (!env.has(name)) fail(cw, `${a}: $(${name}) is not defined`);
      }
    }
    // Drain: preStop sleep + --shutdown-grace-s must fit in the termination grace period.
    let grace = flag("shutdown-grace-s");
    const graceVar = /^\$\((\w+)\)$/.exec(grace ?? "");
    if (graceVar) {
      for (const ref of c.envFrom ?? []) {
        grace = configMaps.get(ref.configMapRef?.name)?.data?.[graceVar[1]] ?? grace;
      }
    }
    const preStop = c.lifecycle?.preStop?.exec?.command;
    const sleep = preStop?.[0] === "sleep" ? Number(preStop[1]) : 0;
    const needed = Number(grace ?? 5) + sleep;
    if (!((pod.terminationGracePeriodSeconds ?? 30) > needed)) {
      fail(where, `terminationGracePeriodSeconds must exceed preStop + --shutdown-grace-s (${needed} s)`);
    }
    // A server listens only after --connect-timeout-s of waiting for its upstream at most.
    const startup = (c.startupProbe?.periodSeconds ?? 10) * (c.startupProbe?.failureThreshold ?? 3);
    const connect = Number(flag("connect-timeout-s") ?? 0);
    if (startup <= connect) {
      fail(cw, `startupProbe window ${startup} s <= --connect-timeout-s ${connect} s: restarts while waiting`);
    }
    const role = flag("role");
    const gpus = c.resources?.limits?.["nvidia.com/gpu"];
    if ((role === "target" || role === "drafter") && overlay === "gpu-split" && gpus !== "1" && gpus !== 1) {
      fail(cw, `a ${role} needs exactly one nvidia.com/gpu`);
    }
    if ((role === "router" || role === "all") && gpus) fail(cw, `role ${role} should not hold a GPU here`);
    for (const addr of ["target-address", "drafter-address"]) {
      const value = flag(addr);
      if (!value) continue;
      const [host, p] = value.split(":");
      const svc = byKind("Service").find((s) => s.metadata.name === host);
      if (!svc) fail(cw, `--${addr}: no Service ${host}`);
      else if (!svc.spec.ports.some((sp) => sp.port === Number(p))) fail(cw, `--${addr}: Service ${host} has no port ${p}`);
    }
  }
}

for (const s of byKind("Service")) {
  if (!selectsPods(s.spec.selector)) fail(`Service/${s.metadata.name}`, "selects no pod");
  const component = s.spec.selector?.["app.kubernetes.io/component"];
  if (component !== "router" && s.spec.type && s.spec.type !== "ClusterIP") {
    fail(`Service/${s.metadata.name}`, "internal services must stay ClusterIP");
  }
}
for (const kind of ["PodDisruptionBudget", "NetworkPolicy"]) {
  for (const o of byKind(kind)) {
    const sel = kind === "NetworkPolicy" ? o.spec.podSelector.matchLabels : o.spec.selector.matchLabels;
    if (!selectsPods(sel)) fail(`${kind}/${o.metadata.name}`, "selects no pod");
  }
}
// Every specula pod is covered by a NetworkPolicy, and the internal roles admit only their caller.
const callers = { target: "router", drafter: "target" };
for (const labels of podLabels) {
  const component = labels["app.kubernetes.io/component"];
  const policies = byKind("NetworkPolicy").filter((p) => matches(p.spec.podSelector.matchLabels, labels));
  if (policies.length === 0) fail(`pods ${component}`, "no NetworkPolicy selects them");
  if (!callers[component]) continue;
  for (const p of policies) {
    for (const rule of p.spec.ingress ?? []) {
      const grpcPort = rule.ports?.some((port) => port.port !== 9464);
      const from = rule.from ?? [];
      const onlyCaller =
        from.length > 0 &&
        from.every((f) => f.podSelector?.matchLabels?.["app.kubernetes.io/component"] === callers[component]);
      if (grpcPort && !onlyCaller) {
        fail(`NetworkPolicy/${p.metadata.name}`, `${component} gRPC must be reachable only from the ${callers[component]}`);
      }
    }
  }
}
for (const pm of byKind("PodMonitor")) {
  if (!selectsPods(pm.spec.selector.matchLabels)) fail(`PodMonitor/${pm.metadata.name}`, "selects no pod");
}
// HPA custom metrics must be ones the Prometheus adapter's rules serve.
const adapterUrl = new URL("../prometheus-adapter/config.yaml", import.meta.url);
const adapterNames = new Set(
  (parseAllDocuments(readFileSync(adapterUrl, "utf8"))[0].toJS().rules ?? []).map((r) => r.name?.as),
);
for (const h of byKind("HorizontalPodAutoscaler")) {
  for (const m of h.spec.metrics ?? []) {
    if (m.type === "Pods" && !adapterNames.has(m.pods.metric.name)) {
      fail(`HorizontalPodAutoscaler/${h.metadata.name}`, `metric ${m.pods.metric.name} is not served by deploy/prometheus-adapter/config.yaml`);
    }
  }
  const ref = h.spec.scaleTargetRef;
  if (!deployments.some((d) => ref.kind === "Deployment" && d.metadata.name === ref.name)) {
    fail(`HorizontalPodAutoscaler/${h.metadata.name}`, `scales a missing ${ref.kind}/${ref.name}`);
  }
}

if (problems.length) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(`${overlay}: ${objects.length} objects valid (${[...new Set(objects.map((o) => o.kind))].join(", ")})`);
