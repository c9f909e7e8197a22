#!/usr/bin/env bash
# Offline checks of deploy/prometheus and deploy/prometheus-adapter (CTest: deploy_prometheus):
# the rule files parse (promtool check rules), behave as specified on synthetic series (promtool
# test rules), prometheus.yml is a valid config, and the adapter's metricsQuery templates are
# valid PromQL once the adapter fills them in.
# Exit 77 (CTest: skipped) only where promtool is missing; scripts/setup.sh installs prometheus.
set -euo pipefail
cd "$(dirname "$0")/.."  # deploy/
if ! command -v promtool >/dev/null; then
  echo "SKIPPED: promtool is not installed; scripts/setup.sh installs the prometheus package"
  exit 77
fi
promtool check rules prometheus/rules/*.yml
promtool test rules prometheus/tests/*.test.yml
(cd prometheus && promtool check config prometheus.yml)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
queries="$(grep -h 'metricsQuery:' prometheus-adapter/config.yaml | sed -e "s/^ *metricsQuery: *'//" -e "s/' *$//")"
[ -n "$queries" ] || { echo "FAILED: no metricsQuery in prometheus-adapter/config.yaml" >&2; exit 1; }
{
  echo "groups:"
  echo "  - name: adapter"
  echo "    rules:"
  i=0
  while IFS= read -r q; do
    # What the adapter substitutes for one pod of one namespace.
    q="${q//<<.Series>>/specula_num_requests_waiting}"
    q="${q//<<.LabelMatchers>>/namespace=\"default\",pod=~\"specula-router-.*\"}"
    q="${q//<<.GroupBy>>/pod}"
    i=$((i + 1))
    printf "      - record: adapter:query%d\n        expr: '%s'\n" "$i" "$q"
  done <<<"$queries"
} >"$work/adapter-rules.yml"
promtool check rules "$work/adapter-rules.yml"
echo "deploy prometheus: OK"
