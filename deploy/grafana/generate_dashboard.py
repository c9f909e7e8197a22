#!/usr/bin/python3
"""Writes deploy/grafana/specula.json, the Grafana dashboard over the specula_* metrics.

Usage: generate_dashboard.py [OUTPUT]   (default: specula.json next to this script)

The dashboard is generated so that every panel follows the same conventions (datasource and job
variables, $__rate_interval, units); edit the PANELS below and re-run, never the JSON by hand.
deploy/tests/check_dashboard.py checks that the committed JSON equals this script's output, that
every expression parses and that every metric it names exists on live servers.
"""
import json
import os
import sys

JOB = 'job=~"$job"'
RI = "$__rate_interval"


def rate(metric, matchers=JOB, by=""):
    grouping = f"sum by ({by}) " if by else "sum "
    return f"{grouping}(rate({metric}{{{matchers}}}[{RI}]))"


def quantile(q, histogram, by=""):
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket{{{JOB}}}[{RI}])))"


def latency_targets(histogram):
    return [(quantile(q, histogram), f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99)]


# Rows of panels: (title, [(panel title, description, unit, kind, [(expr, legend)])]).
PANELS = [
    ("Throughput", [
        ("Tokens / s", "Generated tokens delivered to clients, and prompt tokens admitted.",
         "tokens/s", "timeseries",
         [(rate("specula_generation_tokens_total"), "generated"),
          (rate("specula_prompt_tokens_total"), "prompt")]),
        ("Finished requests / s", "By finish reason (stop, length, stop_string, cancelled, error).",
         "reqps", "timeseries",
         [(rate("specula_request_success_total", by="finished_reason"), "{{finished_reason}}")]),
        ("Refused requests / s", "Refused before the engine, by gRPC code: RESOURCE_EXHAUSTED = "
         "queue full (--max-queue), INVALID_ARGUMENT = a bad field.",
         "reqps", "timeseries",
         [(rate("specula_request_rejected_total", by="code"), "{{code}}")]),
        ("Engine steps / s", "One target forward each.", "ops", "timeseries",
         [(rate("specula_engine_steps_total"), "router"),
          (rate("specula_target_steps_total"), "target (split)")]),
    ]),
    ("Latency", [
        ("Time to first token", "From arrival to the first token.", "s", "timeseries",
         latency_targets("specula_time_to_first_token_seconds")),
        ("Inter-token latency", "Between two deliveries (one per engine step; a speculative "
         "step may deliver several tokens).", "s", "timeseries",
         latency_targets("specula_inter_token_latency_seconds")),
        ("End-to-end latency", "From arrival to the last token.", "s", "timeseries",
         latency_targets("specula_e2e_request_latency_seconds")),
        ("Engine step time", "As the router sees it (transport included), and the share of it "
         "spent on the router-target path (0 in one process).", "s", "timeseries",
         latency_targets("specula_engine_step_seconds")
         + [(f"{rate('specula_engine_step_transport_seconds_total')} / "
             f"{rate('specula_engine_step_seconds_sum')}", "transport share")]),
    ]),
    ("Queue, batch and KV cache", [
        ("Requests running / waiting", "The router's batch and queue (HPA metrics).", "short",
         "timeseries",
         [(f'sum(specula_num_requests_running{{{JOB},role=~"router|all|"}})', "running"),
          (f"sum(specula_num_requests_waiting{{{JOB}}})", "waiting")]),
        ("Batch size (target)", "Sequences per target forward (split deployment).", "short",
         "timeseries",
         [(quantile(0.5, "specula_target_batch_size"), "p50"),
          (quantile(0.99, "specula_target_batch_size"), "p99")]),
        ("KV cache usage", "Share of the target's KV blocks in use, per pod.", "percentunit",
         "timeseries",
         [(f"max by (instance) (specula_kv_cache_usage_perc{{{JOB}}})", "{{instance}}")]),
        ("Verify tokens per step (target)", "Tokens in each verification forward: pending "
         "tokens + draft trees; the draft budget actually spent.", "short", "timeseries",
         [(f"{rate('specula_target_verify_tokens_total')} / {rate('specula_target_steps_total')}",
           "tokens / step"),
          (f"{rate('specula_target_prefill_tokens_total')}", "prefill tokens / s")]),
    ]),
    ("Speculation", [
        ("Acceptance rate", "Accepted / proposed draft tokens (vLLM's acceptance rate).",
         "percentunit", "timeseries",
         [(f"{rate('specula_spec_decode_num_accepted_tokens_total')} / "
           f"{rate('specula_spec_decode_num_draft_tokens_total')}", "acceptance rate")]),
        ("Mean acceptance length", "1 + accepted tokens per draft: tokens per verify step.",
         "short", "timeseries",
         [(f"1 + {rate('specula_spec_decode_num_accepted_tokens_total')} / "
           f"{rate('specula_spec_decode_num_drafts_total')}", "a")]),
        ("Acceptance per position", "Share of drafts whose token at this depth was accepted.",
         "percentunit", "timeseries",
         [(f"{rate('specula_spec_decode_num_accepted_tokens_per_pos_total', by='position')} "
           f"/ ignoring(position) group_left {rate('specula_spec_decode_num_drafts_total')}",
           "position {{position}}")]),
        ("Dropped drafts", "Drafts dropped per step: a failed or late drafter call, an invalid "
         "tree. Output stays lossless; only speculation is lost.",
         "percentunit", "timeseries",
         [(f"{rate('specula_spec_decode_draft_errors_total')} / "
           f"{rate('specula_engine_steps_total')}", "dropped / step")]),
        ("Draft vs verify time (target)", "Where the target's step time goes (split deployment).",
         "percentunit", "timeseries",
         [(f"{rate('specula_target_draft_seconds_total')} / ({rate('specula_target_draft_seconds_total')}"
           f" + {rate('specula_target_verify_seconds_total')})", "drafting")]),
        ("Drafter calls by drafter", "Drafter service calls per second, per drafter and call "
         "(split deployment).", "ops", "timeseries",
         [(rate("specula_drafter_calls_total", by="drafter, call"), "{{drafter}} {{call}}")]),
        ("Drafter call time by drafter", "p99 per drafter and call (split deployment).", "s",
         "timeseries",
         [(quantile(0.99, "specula_drafter_call_duration_seconds", by="drafter, call"),
           "{{drafter}} {{call}}")]),
        ("Lossy requests", "Requests verified with a LOSSY rule (specdec, typical) at their own "
         "request, per second and as a share of finished requests.", "short", "timeseries",
         [(rate("specula_spec_decode_lossy_requests_total"), "lossy / s"),
          (f"{rate('specula_spec_decode_lossy_requests_total')} / "
           f"{rate('specula_request_success_total')}", "share of finished")]),
    ]),
    ("Draft budget and spare compute", [
        ("Draft budget per sequence", "Draft nodes the adaptive budget gave one sequence for one "
         "step (0 = no draft): how the budget spreads over steps.", "short", "heatmap",
         [(f"sum by (le) (increase(specula_draft_budget_nodes_bucket{{{JOB}}}[{RI}]))",
           "{{le}}")]),
        ("Draft budget quantiles", "Nodes per sequence per step: mean and percentiles.", "short",
         "timeseries",
         [(f"{rate('specula_draft_budget_nodes_sum')} / {rate('specula_draft_budget_nodes_count')}",
           "mean")]
         + [(quantile(q, "specula_draft_budget_nodes"), f"p{int(q * 100)}")
            for q in (0.5, 0.9, 0.99)]),
        ("Predicted / measured step time", "The budget's cost model against the steps as they "
         "ran: 1 = exact, above 1 = it overestimates step time (drafts too little), below 1 = "
         "it underestimates (drafts too much).", "short", "timeseries",
         [(f"{rate('specula_draft_budget_predicted_seconds_total', by='instance')} / "
           f"{rate('specula_draft_budget_measured_seconds_total', by='instance')}",
           "{{instance}}")]),
        ("Predicted speedup", "Tokens/s at the chosen budgets over tokens/s without drafts, as "
         "the cost model predicts it for the last step.", "short", "timeseries",
         [(f"avg by (instance) (specula_draft_budget_predicted_speedup{{{JOB}}})",
           "{{instance}}")]),
        ("Realized speedup", "The drafting audit: measured tokens/s of drafting epochs over "
         "the no-draft epochs next to them (1 = drafting gains nothing); where it stays below 1 "
         "the verdict (0) keeps drafting to short trials.", "short", "timeseries",
         [(f"avg by (instance) (specula_draft_budget_realized_speedup{{{JOB}}})",
           "{{instance}} realized"),
          (f"avg by (instance) (specula_draft_budget_drafting_verdict{{{JOB}}})",
           "{{instance}} verdict")]),
        ("Spare compute", "Tokens the step's forward could add within 5% of its time: room for "
         "more draft nodes at almost no cost.", "short", "timeseries",
         [(f"avg by (instance) (specula_draft_budget_spare_tokens{{{JOB}}})", "{{instance}}")]),
        ("Gap tail (latency bound)", "The streams' p99 gap between chunks without drafts and "
         "the steps' p99.9 overrun of their plans, over the last 1,024 planned steps: with "
         "--max-draft-slowdown X (0.05 by default when serving) a drafted step may take (1 + X) "
         "x the p99 gap less the overrun, or (1 + X) x its own time.", "s", "timeseries",
         [(f"avg by (instance) (specula_draft_budget_gap_p99_seconds{{{JOB}}})",
           "{{instance}} p99 gap"),
          (f"avg by (instance) (specula_draft_budget_overrun_p999_seconds{{{JOB}}})",
           "{{instance}} p99.9 overrun")]),
        ("Row price", "The chance of acceptance a draft node needs to be worth its forward row "
         "(one more row's predicted seconds x the step's tokens/s): the n-gram drafter leaves out "
         "the nodes of weak matches below it (--prune-drafts).", "percentunit", "timeseries",
         [(f"avg by (instance) (specula_draft_budget_row_price{{{JOB}}})", "{{instance}}")]),
        ("kappa and theta", "kappa = a * depth / k over recent drafting steps (SpecFormer; "
         "higher = drafts used better); theta = kappa / predicted speedup (lower is better).",
         "short", "timeseries",
         [(f"avg(specula_spec_decode_kappa{{{JOB}}})", "kappa"),
          (f"avg(specula_spec_decode_theta{{{JOB}}})", "theta")]),
        ("Draft time share (router)", "Drafters' share of recent step time, as the router's "
         "engine loop measures it (all roles).", "percentunit", "timeseries",
         [(f"avg by (instance) (specula_spec_decode_draft_time_share{{{JOB}}})",
           "{{instance}}")]),
        ("Acceptance probability per drafter and position", "P(position accepted | previous "
         "position accepted) over recent steps, as the budget's acceptance model learned it.",
         "percentunit", "timeseries",
         [(f"avg by (drafter, position) (specula_spec_decode_acceptance_prob{{{JOB}}})",
           "{{drafter}} position {{position}}")]),
        ("Draft supply per drafter and position", "P(node at position comes back | previous "
         "node did): how much of its budget a drafter returns (n-gram lookup without a match "
         "returns nothing); the budget values a draft at what comes back.",
         "percentunit", "timeseries",
         [(f"avg by (drafter, position) (specula_draft_budget_supply{{{JOB}}})",
           "{{drafter}} position {{position}}")]),
    ]),
    ("Health", [
        ("Scrape up, per role", "1 = the pod's /metrics answers (role label from the PodMonitor / "
         "scrape config).", "short", "timeseries",
         [(f"sum by (role) (up{{{JOB}}})", "{{role}} up"),
          (f"count by (role) (up{{{JOB}}})", "{{role}} pods")]),
        ("Failing drafter calls / s", "Drafter service calls with a non-OK gRPC code.", "ops",
         "timeseries",
         [(rate("specula_drafter_calls_total", f'{JOB},code!="OK"', by="drafter, code"),
           "{{drafter}} {{code}}")]),
        ("Target sessions and drafter sequences", "Router sessions opened on the target; "
         "sequences whose state the drafter holds.", "short", "timeseries",
         [(f"sum(specula_target_sessions_total{{{JOB}}})", "target sessions"),
          (f"sum(specula_drafter_sequences{{{JOB}}})", "drafter sequences")]),
        ("Process CPU per role", "CPU cores busy per role (process_cpu_seconds_total).", "short",
         "timeseries",
         [(rate("process_cpu_seconds_total", by="role"), "{{role}}")]),
        ("Process memory per role", "Resident memory per role.", "bytes", "timeseries",
         [(f"sum by (role) (process_resident_memory_bytes{{{JOB}}})", "{{role}}")]),
    ]),
]


def build():
    panels = []
    y = 0
    next_id = 1
    for row_title, row_panels in PANELS:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        for i, (title, description, unit, kind, targets) in enumerate(row_panels):
            panel = {
                "type": kind,
                "title": title,
                "description": description,
                "id": next_id,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for k, (expr, legend) in enumerate(targets)],
            }
            if kind == "heatmap":
                # Buckets as Prometheus counts them (one row per `le`), not re-bucketed by Grafana.
                panel["options"] = {"calculate": False, "cellGap": 1,
                                    "color": {"mode": "scheme", "scheme": "Oranges"},
                                    "rowsFrame": {"layout": "le"},
                                    "yAxis": {"axisPlacement": "left", "unit": unit},
                                    "legend": {"show": True},
                                    "tooltip": {"mode": "single", "yHistogram": True}}
                for target in panel["targets"]:
                    target["format"] = "heatmap"
            panels.append(panel)
            next_id += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "Specula",
        "uid": "specula-overview",
        "description": "Speculative-decoding serving: throughput, latency, queue, KV cache, "
                       "acceptance, draft budget, health. Generated by "
                       "deploy/grafana/generate_dashboard.py.",
        "tags": ["specula", "llm", "speculative-decoding"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "job", "label": "Job", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(specula_generation_tokens_total, job)",
                       "refId": "job"},
             "definition": "label_values(specula_generation_tokens_total, job)",
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "refresh": 2,
             "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "specula.json")
    with open(out, "w") as f:
        json.dump(build(), f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
