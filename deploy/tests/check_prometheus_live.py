#!/usr/bin/python3
"""CTest deploy_prometheus_live: a real Prometheus scraping a real `specula serve` under load.

Usage: check_prometheus_live.py SPECULA_BINARY STUBS_DIR SOURCE_DIR

Starts `specula serve` (bundled model, ngram drafter) and `prometheus` on 127.0.0.1 free ports;
Prometheus scrapes it every second with deploy/prometheus's rule files, once as is and once
through the documented `specula_` -> `vllm:` relabel line (taken from prometheus.yml, so the
documentation is what is tested). While requests run, it asks Prometheus's HTTP API for the
dashboard's key queries, the recording rules and vLLM dashboards' own queries on the renamed
series (model_name-filtered, as vLLM's Grafana example asks: acceptance rate, TTFT, TPOT, E2E,
queue/prefill/decode/inference time, token histograms, request_success by finished_reason, ...),
and requires non-empty, finite answers.
Exit 77 (skipped) only where the prometheus binary is missing; scripts/setup.sh installs it.
"""
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_dashboard import Server, dashboard_exprs  # noqa: E402

# Dashboard panels whose first query must answer with a finite number under load.
KEY_PANELS = ["Tokens / s", "Time to first token", "Inter-token latency", "End-to-end latency",
              "Requests running / waiting", "KV cache usage", "Acceptance rate",
              "Mean acceptance length", "Acceptance per position", "Scrape up, per role",
              "Draft budget per sequence", "Draft budget quantiles",
              "Predicted / measured step time", "Predicted speedup", "Spare compute",
              "kappa and theta", "Draft time share (router)",
              "Acceptance probability per drafter and position"]
RECORDED = ["specula:generation_tokens:rate5m", "specula:spec_decode_acceptance_rate:rate5m",
            "specula:spec_decode_mean_acceptance_length:rate5m",
            "specula:time_to_first_token_seconds:p99_5m", "specula:request_errors:ratio_rate5m",
            "specula:spec_decode_kappa:avg5m", "specula:spec_decode_theta:avg5m",
            "specula:draft_budget_predicted_over_measured:ratio_rate5m",
            "specula:draft_budget_nodes:mean_rate5m"]
# What an unmodified vLLM dashboard asks (vLLM's Grafana example filters every query on
# model_name), on the relabelled job.
M = '{job="vllm-names",model_name="pyllama-6m"}'
VLLM = [f'rate(vllm:spec_decode_num_accepted_tokens_total{M}[30s]) / '
        f'rate(vllm:spec_decode_num_draft_tokens_total{M}[30s])',
        f'histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{M}[30s])))',
        f'vllm:num_requests_running{M}',
        f'vllm:kv_cache_usage_perc{M}',
        f'rate(vllm:generation_tokens_total{M}[30s])',
        f'histogram_quantile(0.9, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{M}[30s])))',
        f'histogram_quantile(0.5, sum by (le) '
        f'(rate(vllm:request_time_per_output_token_seconds_bucket{M}[30s])))',
        f'sum by (finished_reason) (increase(vllm:request_success_total{M}[30s]))',
        f'vllm:request_success_total{{job="vllm-names",model_name="pyllama-6m",finished_reason="abort"}}',
        f'rate(vllm:request_queue_time_seconds_sum{M}[30s])',
        f'rate(vllm:request_prefill_time_seconds_sum{M}[30s])',
        f'rate(vllm:request_decode_time_seconds_sum{M}[30s])',
        f'rate(vllm:request_inference_time_seconds_sum{M}[30s])',
        f'sum by (le) (increase(vllm:request_prompt_tokens_bucket{M}[30s]))',
        f'sum by (le) (increase(vllm:request_generation_tokens_bucket{M}[30s]))',
        f'histogram_quantile(0.99, sum by (le) (rate(vllm:request_params_max_tokens_bucket{M}[30s])))',
        f'histogram_quantile(0.99, sum by (le) '
        f'(rate(vllm:request_max_num_generation_tokens_bucket{M}[30s])))',
        f'rate(vllm:iteration_tokens_total_sum{M}[30s])',
        f'vllm:num_preemptions_total{M}']

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return [float(s["value"][1]) for s in body["data"]["result"]]


def main():
    binary, stubs, source = sys.argv[1:4]
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("SKIPPED: prometheus is not installed; scripts/setup.sh installs the prometheus package")
        return 77
    deploy = os.path.join(source, "deploy")
    with open(os.path.join(deploy, "prometheus", "prometheus.yml")) as f:
        relabel = re.search(r"^\s*# (metric_relabel_configs: .*)$", f.read(), re.M)
    if not relabel:
        print("FAILED: no commented metric_relabel_configs line in prometheus.yml", file=sys.stderr)
        return 1
    with open(os.path.join(deploy, "grafana", "specula.json")) as f:
        dashboard = json.load(f)
    panels = {}

    def collect(items):
        for p in items:
            if p.get("targets"):
                panels[p["title"]] = p["targets"][0]["expr"]
            collect(p.get("panels", []))

    collect(dashboard["panels"])

    work = tempfile.mkdtemp()
    server = prom = None
    stop_load = threading.Event()
    problems = []
    try:
        model = os.path.join(source, "models", "pyllama-6m")
        server = Server(binary, ["--model", model, "--drafter", "ngram"])
        metrics = urllib.parse.urlparse(server.metrics_url).netloc
        rules = os.path.join(deploy, "prometheus", "rules")
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{rules}/*.yml"]
scrape_configs:
  - job_name: specula
    static_configs: [{{targets: ["{metrics}"], labels: {{role: all}}}}]
  - job_name: vllm-names
    static_configs: [{{targets: ["{metrics}"]}}]
    {relabel.group(1)}
""")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"))

        client = os.path.join(source, "examples", "python", "generate_client.py")

        def load():
            prompts = ["import os\nimport sys\n", "def main():\n", "class Foo:\n    def __init__"]
            i = 0
            while not stop_load.is_set():
                subprocess.run(["/usr/bin/python3", client, "--target", server.address,
                                "--stubs", stubs, "--prompt", prompts[i % len(prompts)],
                                "--max-new-tokens", "32", "--mode", "stream"],
                               capture_output=True, timeout=120)
                i += 1

        loader = threading.Thread(target=load)
        loader.start()

        exprs = {f"panel {t}": panels[t] for t in KEY_PANELS if t in panels}
        missing = [t for t in KEY_PANELS if t not in panels]
        if missing:
            problems.append(f"dashboard panels not found: {missing}")
        exprs.update({f"rule {r}": r for r in RECORDED})
        exprs.update({f"vLLM query {q}": q for q in VLLM})
        exprs = {k: re.sub(r"\$\{?job\}?", ".*", v.replace("$__rate_interval", "30s"))
                 for k, v in exprs.items()}
        deadline = time.time() + 90
        answers = {}
        while time.time() < deadline:
            time.sleep(2)
            try:
                answers = {k: query(base, e) for k, e in exprs.items()}
            except (OSError, RuntimeError):  # not up yet
                continue
            if all(v and all(math.isfinite(x) for x in v) for v in answers.values()):
                break
        stop_load.set()
        loader.join()
        for name, values in answers.items() if answers else []:
            if not values or not all(math.isfinite(x) for x in values):
                problems.append(f"{name}: {values or 'empty'} (expr {exprs[name]})")
        if not answers:
            with open(os.path.join(work, "prometheus.log")) as f:
                problems.append("Prometheus never answered:\n" + f.read()[-3000:])
        print(f"prometheus live: {len(answers)} queries answered: " + ", ".join(
            f"{k.split(' ', 1)[1][:40]}={v[0]:.3g}" for k, v in answers.items() if v))
    finally:
        stop_load.set()
        if prom:
            prom.send_signal(signal.SIGTERM)
            prom.wait(timeout=30)
        if server:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print("FAILED:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
