#!/usr/bin/python3
"""PNG charts of specula-loadgen results (Debian's python3-matplotlib; run with /usr/bin/python3).

    /usr/bin/python3 scripts/plot_loadgen.py [--out-dir DIR] [--prefix NAME] FILE...

Each FILE is specula-loadgen's --json summary ({"results": [rows]}), one flat vLLM result object
(--result-dir), or JSON lines of such objects. Rows are grouped by (target, drafter, concurrency);
repeats are reduced to their median. Writes, into DIR (default: the first file's directory):

    NAME-throughput.png   output tokens/s vs concurrency, one line per target and drafter
    NAME-latency.png      TTFT / TPOT / ITL / E2EL median and highest percentile vs concurrency
    NAME-acceptance.png   acceptance rate per draft position, per drafter (all runs pooled)
    NAME-speedup.png      output tokens/s relative to the same target's drafter "none"
                          (only when "none" was run)

NAME defaults to the first file's name without its extension.
"""

import argparse
import json
import os
import re
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

METRICS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")]


def load_rows(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = []
    for doc in docs:
        if isinstance(doc, dict) and isinstance(doc.get("results"), list):
            rows.extend(doc["results"])
        elif isinstance(doc, dict):
            rows.append(doc)
        else:
            raise SystemExit(f"{path}: not a specula-loadgen result")
    for row in rows:
        if "output_throughput" not in row:
            raise SystemExit(f"{path}: a row has no output_throughput (not a loadgen result)")
    return rows


def concurrency_of(row):
    return row.get("concurrency", row.get("max_concurrency")) or 0


def throughput_of(row):
    return row.get("output_throughput_median", row["output_throughput"])


def group(rows):
    """{(target, drafter): {concurrency: [rows]}}, in first-seen order."""
    groups = {}
    for row in rows:
        key = (row.get("target", row.get("label", "server")), row.get("drafter", "default"))
        groups.setdefault(key, defaultdict(list))[concurrency_of(row)].append(row)
    return groups


def label(key, groups):
    targets = {t for t, _ in groups}
    return key[1] if len(targets) == 1 else f"{key[0]} {key[1]}"


def median_of(rows, field):
    values = [r[field] for r in rows if isinstance(r.get(field), (int, float))]
    return statistics.median(values) if values else None


def percentile_keys(rows, metric):
    """The pXX_metric_ms keys present, highest percentile last."""
    found = set()
    for r in rows:
        for k in r:
            m = re.fullmatch(r"p([0-9.]+)_" + metric + "_ms", k)
            if m:
                found.add((float(m.group(1)), k))
    return [k for _, k in sorted(found)]


def concurrency_axis(ax, groups):
    """Log-2 x axis with a plain tick at every concurrency that was run."""
    cs = sorted({c for by_c in groups.values() for c in by_c})
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("concurrency (max requests in flight)")


def plot_throughput(groups, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, by_c in groups.items():
        cs = sorted(by_c)
        ax.plot(cs, [statistics.median(throughput_of(r) for r in by_c[c]) for c in cs], marker="o",
                label=label(key, groups))
    concurrency_axis(ax, groups)
    ax.set_ylabel("output tokens/s (median of repeats)")
    ax.set_title("Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(groups, rows, path):
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (metric, name) in zip(axes.flat, METRICS):
        pkeys = percentile_keys(rows, metric)
        top = pkeys[-1] if pkeys else None
        for i, (key, by_c) in enumerate(groups.items()):
            cs = sorted(by_c)
            color = f"C{i % 10}"
            ax.plot(cs, [median_of(by_c[c], f"median_{metric}_ms") for c in cs], marker="o",
                    color=color, label=f"{label(key, groups)} median")
            if top:
                word = top.split("_")[0]
                ax.plot(cs, [median_of(by_c[c], top) for c in cs], marker="^", linestyle="--",
                        color=color, label=f"{label(key, groups)} {word}")
        concurrency_axis(ax, groups)
        ax.set_title(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("Latency percentiles")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_acceptance(groups, path):
    pooled = {}
    for key, by_c in groups.items():
        drafts = sum(r.get("num_drafts", 0) for rs in by_c.values() for r in rs)
        accepted = []
        for rs in by_c.values():
            for r in rs:
                for d, a in enumerate(r.get("accepted_per_position", [])):
                    accepted += [0] * (d + 1 - len(accepted))
                    accepted[d] += a
        if drafts > 0 and accepted:
            pooled[key] = [a / drafts for a in accepted]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not pooled:
        ax.text(0.5, 0.5, "no speculation in these runs", ha="center", va="center")
    width = 0.8 / max(len(pooled), 1)
    for i, (key, rates) in enumerate(pooled.items()):
        xs = [d + 1 + (i - (len(pooled) - 1) / 2) * width for d in range(len(rates))]
        ax.bar(xs, rates, width=width, label=label(key, groups))
    if pooled:
        ax.set_xticks(range(1, max(len(r) for r in pooled.values()) + 1))
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance rate per position")
    ax.grid(True, axis="y", alpha=0.3)
    if pooled:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup(groups, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drew = False
    for key, by_c in groups.items():
        target, drafter = key
        base = groups.get((target, "none"))
        if drafter == "none" or base is None:
            continue
        cs = [c for c in sorted(by_c) if c in base]
        ratios = [statistics.median(throughput_of(r) for r in by_c[c]) /
                  statistics.median(throughput_of(r) for r in base[c]) for c in cs]
        ax.plot(cs, ratios, marker="o", label=label(key, groups))
        drew = True
    if not drew:
        plt.close(fig)
        return False
    ax.axhline(1.0, color="grey", linewidth=1)
    concurrency_axis(ax, groups)
    ax.set_ylabel("output tokens/s / no speculation")
    ax.set_title("Speedup vs no speculation (same run, same prompts)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--prefix", default=None)
    args = parser.parse_args()
    rows = [row for f in args.files for row in load_rows(f)]
    if not rows:
        raise SystemExit("no results to plot")
    out_dir = args.out_dir or os.path.dirname(args.files[0]) or "."
    prefix = args.prefix or os.path.splitext(os.path.basename(args.files[0]))[0]
    if len(args.files) > 1 and not args.prefix:
        prefix = "loadgen"
    os.makedirs(out_dir, exist_ok=True)
    groups = group(rows)
    written = []
    for name, draw in [("throughput", lambda p: plot_throughput(groups, p)),
                       ("latency", lambda p: plot_latency(groups, rows, p)),
                       ("acceptance", lambda p: plot_acceptance(groups, p)),
                       ("speedup", lambda p: plot_speedup(groups, p))]:
        path = os.path.join(out_dir, f"{prefix}-{name}.png")
        if draw(path) is not False:
            written.append(path)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
