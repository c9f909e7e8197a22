// Checks deploy/envoy/envoy.yaml against a rendered overlay (multi-document YAML on stdin). No
// Envoy binary is packaged for Debian, so this checks what ties the proxy to the manifests:
//  1. every route names a defined cluster and has no timeout (a stream lasts a whole generation);
//  2. every upstream address NAME.NAMESPACE.svc... is a rendered headless Service (one DNS record
//     per ready pod, so STRICT_DNS sees every replica) exposing that port for router pods;
//  3. clusters speak HTTP/2 upstream (gRPC) and health-check the service the routers' readiness
//     probe checks, so a draining router leaves the rotation.
// Usage: node validate_envoy.mjs ENVOY_YAML < rendered.yaml   (exit 1 on any problem)
import { readFileSync } from "node:fs";
import { parse, parseAllDocuments } from "yaml";

const problems = [];
const fail = (where, what) => problems.push(`envoy: ${where}: ${what}`);
const envoy = parse(readFileSync(process.argv[2], "utf8"));
const objects = parseAllDocuments(readFileSync(0, "utf8")).map((d) => d.toJS()).filter(Boolean);
const services = objects.filter((o) => o.kind === "Service");
const routerProbes = objects
  .filter((o) => o.kind === "Deployment" && o.spec.template.metadata.labels["app.kubernetes.io/component"] === "router")
  .flatMap((d) => d.spec.template.spec.containers.map((c) => c.readinessProbe?.grpc?.service));
if (routerProbes.length === 0) fail("render", "no router Deployment with a gRPC readiness probe");

const clusters = new Map((envoy.static_resources?.clusters ?? []).map((c) => [c.name, c]));
if (clusters.size === 0) fail("clusters", "none defined");
for (const listener of envoy.static_resources?.listeners ?? []) {
  for (const chain of listener.filter_chains ?? []) {
    for (const filter of chain.filters ?? []) {
      for (const vh of filter.typed_config?.route_config?.virtual_hosts ?? []) {
        for (const r of vh.routes ?? []) {
          const where = `listener ${listener.name} route ${JSON.stringify(r.match)}`;
          if (!clusters.has(r.route?.cluster)) fail(where, `cluster ${r.route?.cluster} is not defined`);
          if (r.route?.timeout !== "0s") fail(where, "needs timeout: 0s (streams last a whole generation)");
        }
      }
    }
  }
}
for (const [name, c] of clusters) {
  const where = `cluster ${name}`;
  const http2 = c.typed_extension_protocol_options?.["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    ?.explicit_http_config?.http2_protocol_options;
  if (!http2) fail(where, "upstream must be HTTP/2 (explicit_http_config.http2_protocol_options)");
  const checked = (c.health_checks ?? []).map((h) => h.grpc_health_check?.service_name);
  if (!checked.length || !checked.every((s) => routerProbes.includes(s))) {
    fail(where, `gRPC health check ${JSON.stringify(checked)} must be the routers' readiness service ${JSON.stringify(routerProbes)}`);
  }
  for (const group of c.load_assignment?.endpoints ?? []) {
    for (const e of group.lb_endpoints ?? []) {
      const { address, port_value: port } = e.endpoint?.address?.socket_address ?? {};
      const svc = services.find((s) => s.metadata.name === String(address).split(".")[0]);
      if (!/\.svc(\.|$)/.test(String(address)) || !svc) {
        fail(where, `${address} is not a rendered Service's cluster DNS name`);
      } else if (svc.spec.clusterIP !== "None") {
        fail(where, `Service ${svc.metadata.name} is not headless: STRICT_DNS would see one address`);
      } else if (!svc.spec.ports.some((p) => p.port === port)) {
        fail(where, `Service ${svc.metadata.name} has no port ${port}`);
      } else if (svc.spec.selector?.["app.kubernetes.io/component"] !== "router") {
        fail(where, `Service ${svc.metadata.name} does not select router pods`);
      }
    }
  }
}
for (const p of problems) console.error(p);
if (problems.length) process.exit(1);
console.log(`envoy: ${clusters.size} cluster(s) consistent with the rendered manifests`);
