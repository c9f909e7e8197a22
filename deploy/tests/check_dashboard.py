#!/usr/bin/python3
"""CTest deploy_dashboard: the Grafana dashboard and the Prometheus rules against live servers.

Usage: check_dashboard.py SPECULA_BINARY STUBS_DIR SOURCE_DIR

1. deploy/grafana/specula.json is what deploy/grafana/generate_dashboard.py writes (not edited
   by hand, not stale).
2. Every PromQL expression of the dashboard parses: each becomes a recording rule in a temporary
   file checked by `promtool check rules` (a deliberately broken one must be rejected).
3. Every metric the dashboard and the rule files (deploy/prometheus/rules) name exists: on the
   live /metrics of `specula serve` in one process (role all) and of a split router -> target ->
   drafter stack, each started on free ports with the bundled model after a few requests
   (examples/python/generate_client.py), or as a recording rule, or is Prometheus's own `up`.
4. Every live /metrics page passes `promtool check metrics` but for the one known lint:
   `specula_iteration_tokens_total` is a histogram whose name ends in `_total` because vLLM V1
   names it `vllm:iteration_tokens_total` (dashboards query `..._total_bucket`); renaming it
   would break the `specula_` -> `vllm:` relabel parity. Any other finding fails, and so does
   the known one no longer showing up (the exception would be stale).
Exit 77 (skipped) only where promtool is missing; scripts/setup.sh installs the prometheus package.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

import yaml

PROMETHEUS_OWN = {"up"}
# `promtool check metrics` findings accepted on purpose (see 4. above).
KNOWN_LINT = {'specula_iteration_tokens_total non-counter metrics should not have "_total" suffix'}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}


def dashboard_exprs(dashboard):
    exprs = []

    def walk(panels):
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query or "")
        if match:
            exprs.append(match.group(1))
    return exprs


def grafana_to_promql(expr):
    """Grafana's variables, replaced the way Grafana would before sending the query."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr):
    """Metric names an expression selects: identifiers outside strings, label matchers, ranges
    and grouping clauses that are not functions, keywords or parts of numbers/durations."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        rest = s[m.end():].lstrip()
        if m.group(0) in KEYWORDS or rest.startswith("("):
            continue
        names.add(m.group(0))
    return names


def promtool_parses(exprs, workdir, name):
    path = os.path.join(workdir, name)
    rules = [{"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(exprs)]
    with open(path, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    result = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
    return result.returncode == 0, result.stdout + result.stderr


class Server:
    """One `specula serve` child on free ports (--port 0, --metrics-port -1)."""

    def __init__(self, binary, args):
        # stderr to a file: a pipe nobody reads would block a server that logs every request.
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([binary, "serve", "--port", "0", "--metrics-port", "-1", *args],
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on ([^ ]+):(\d+) .*metrics on (http://[^ ,)]+/metrics)", line)
        if not match:
            self.stop()
            self.stderr.seek(0)
            raise RuntimeError(f"specula serve {' '.join(args)}: no listening line: {line!r} "
                               f"{self.stderr.read()[-3000:]}")
        self.name = " ".join(args[:2]) if args[0] == "--role" else "all-in-one"
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.metrics_url = match.group(3)

    def metrics(self):
        with urllib.request.urlopen(self.metrics_url, timeout=30) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def exported_names(text):
    """Series names a /metrics page offers, histogram/summary suffixes included."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names.update({name + "_bucket", name + "_sum", name + "_count"})
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def lint_findings(text):
    """`promtool check metrics` on one /metrics page: its findings, one per line."""
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                            text=True)
    findings = {line.strip() for line in (result.stdout + result.stderr).splitlines()
                if line.strip()}
    if result.returncode not in (0, 3) or (result.returncode == 3) != bool(findings):
        raise RuntimeError(f"promtool check metrics: exit {result.returncode}: {findings}")
    return findings


def load(client, stubs, router):
    """A few requests so labelled families (positions, drafter calls, rejections) have series."""
    def run(*args):
        return subprocess.run(["/usr/bin/python3", client, "--target", router, "--stubs", stubs,
                               *args], capture_output=True, text=True, timeout=120)

    ok = run("--prompt", "import os\nimport sys\n", "--max-new-tokens", "24", "--mode", "unary")
    if ok.returncode != 0:
        raise RuntimeError(f"request to {router} failed: {ok.stderr}")
    bad = run("--drafter", "no-such-drafter", "--mode", "unary")  # INVALID_ARGUMENT, on purpose
    if bad.returncode == 0:
        raise RuntimeError(f"a request naming an unknown drafter succeeded on {router}")


def main():
    binary, stubs, source = sys.argv[1:4]
    if not shutil.which("promtool"):
        print("SKIPPED: promtool is not installed; scripts/setup.sh installs the prometheus package")
        return 77
    deploy = os.path.join(source, "deploy")
    problems = []
    work = tempfile.mkdtemp()
    try:
        # 1. Generated, not stale.
        dashboard_path = os.path.join(deploy, "grafana", "specula.json")
        fresh = os.path.join(work, "specula.json")
        subprocess.run(["/usr/bin/python3", os.path.join(deploy, "grafana", "generate_dashboard.py"),
                        fresh], check=True)
        with open(dashboard_path) as a, open(fresh) as b:
            if a.read() != b.read():
                problems.append("deploy/grafana/specula.json differs from generate_dashboard.py's "
                                "output: re-run deploy/grafana/generate_dashboard.py")
        with open(dashboard_path) as f:
            exprs = [grafana_to_promql(e) for e in dashboard_exprs(json.load(f))]
        if len(exprs) < 20:
            problems.append(f"only {len(exprs)} expressions found in the dashboard")

        # 2. Every expression parses (and the check can fail).
        parsed, out = promtool_parses(exprs, work, "dashboard-rules.yml")
        if not parsed:
            problems.append(f"promtool rejects a dashboard expression:\n{out}")
        parsed, _ = promtool_parses(["sum(rate(specula_generation_tokens_total[1m])"], work,
                                    "broken-rules.yml")
        if parsed:
            problems.append("promtool accepted a broken expression: the parse check is void")

        # 3. Every named metric exists.
        recorded, rule_exprs = set(), []
        rules_dir = os.path.join(deploy, "prometheus", "rules")
        for name in sorted(os.listdir(rules_dir)):
            with open(os.path.join(rules_dir, name)) as f:
                for group in yaml.safe_load(f)["groups"]:
                    for rule in group["rules"]:
                        if "record" in rule:
                            recorded.add(rule["record"])
                        rule_exprs.append((f"{name}: {rule.get('record') or rule['alert']}",
                                           rule["expr"]))
        wanted = {}
        for where, expr in [("dashboard", e) for e in exprs] + rule_exprs:
            for name in metric_names(expr):
                wanted.setdefault(name, where)
        if not any(n.startswith("specula_") for n in wanted):
            problems.append("no specula_ metric found in the expressions: the extraction is broken")

        model = os.path.join(source, "models", "pyllama-6m")
        client = os.path.join(source, "examples", "python", "generate_client.py")
        exported, lint_seen = set(), set()
        servers = []
        try:
            servers.append(Server(binary, ["--model", model, "--drafter", "ngram"]))
            load(client, stubs, servers[-1].address)
            drafter = Server(binary, ["--role", "drafter", "--model", model, "--drafter", "ngram"])
            servers.append(drafter)
            # --drafter none: n-gram at the drafter service, so its call series exist
            target = Server(binary, ["--role", "target", "--model", model, "--drafter", "none",
                                     "--drafter-address", drafter.address])
            servers.append(target)
            # A fixed budget: every step calls the drafter service (an adaptive one may not draft
            # for one short request, and a sequence that never drafts sends the service nothing).
            servers.append(Server(binary, ["--role", "router", "--model", model,
                                           "--target-address", target.address,
                                           "--draft-budget", "fixed", "--draft-len", "4"]))
            load(client, stubs, servers[-1].address)
            for server in servers:
                text = server.metrics()
                exported |= exported_names(text)
                findings = lint_findings(text)
                lint_seen |= findings
                for finding in sorted(findings - KNOWN_LINT):
                    problems.append(f"promtool check metrics ({server.name}): {finding}")
        finally:
            for server in reversed(servers):
                server.stop()
        for finding in sorted(KNOWN_LINT - lint_seen):
            problems.append(f"known lint no longer reported, remove it from KNOWN_LINT: {finding}")
        if not lint_findings("# HELP bad_total A gauge.\n# TYPE bad_total gauge\nbad_total 1\n"):
            problems.append("promtool check metrics finds nothing in a bad page: the lint is void")
        for name, where in sorted(wanted.items()):
            if name in exported or name in recorded or name in PROMETHEUS_OWN:
                continue
            problems.append(f"{where}: metric {name} is not exported by any live server "
                            "(nor a recording rule)")
        print(f"dashboard: {len(exprs)} expressions parse; {len(wanted)} metric names checked "
              f"against {len(exported)} live series names and {len(recorded)} recording rules")
    finally:
        shutil.rmtree(work)
    for p in problems:
        print("FAILED:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
