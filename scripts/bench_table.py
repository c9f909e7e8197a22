#!/usr/bin/env python3
"""Markdown tables from a `specula bench --json` file, for docs/BENCHMARKS.md.

  scripts/bench_table.py RESULTS.json            one row per batch size and drafter: the median
                                                 speedup at each fixed budget (the best in bold),
                                                 and at the best budget a, kappa, theta, draft
                                                 share and the drafter's peak state
  scripts/bench_table.py RESULTS.json --plain    the same without Markdown bold

Speedups are medians over the run's repeats of (tokens/s with the drafter) / (tokens/s of no
speculation in the same repeat), as `specula bench` reports them.
"""
import argparse
import json
import sys
from collections import OrderedDict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="specula bench --json output")
    parser.add_argument("--plain", action="store_true", help="no Markdown bold")
    args = parser.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    rows = data.get("results", [])
    if not rows:
        print(f"{args.results}: no results", file=sys.stderr)
        return 1
    budgets = sorted({r["draft_len"] for r in rows
                      if r["drafter"] != "none" and r.get("draft_budget") == "fixed"})
    table = OrderedDict()  # (batch, drafter) -> {draft_len: row}
    baseline = {}
    for r in rows:
        if r["drafter"] == "none":
            baseline[r["batch_size"]] = r
            continue
        if r.get("draft_budget", "fixed") != "fixed":
            continue
        table.setdefault((r["batch_size"], r["drafter"]), {})[r["draft_len"]] = r

    bold = (lambda s: s) if args.plain else (lambda s: f"**{s}**")
    head = ["batch", "drafter"] + [f"k={k}" for k in budgets] + [
        "best k", "a", "kappa", "theta", "draft %", "drafter MB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    last_batch = None
    for (batch, drafter), by_len in table.items():
        if batch != last_batch and batch in baseline:
            b = baseline[batch]
            print(f"| {batch} | none ({b['tokens_per_s_median']:.0f} tok/s) |"
                  + " |" * (len(head) - 2))
        last_batch = batch
        best = max(by_len.values(), key=lambda r: r["speedup_median"])
        cells = []
        for k in budgets:
            r = by_len.get(k)
            if r is None:
                cells.append("-")
                continue
            text = f"{r['speedup_median']:.2f}x"
            cells.append(bold(text) if r is best else text)
        cells += [str(best["draft_len"]), f"{best['mean_accepted_len']:.2f}",
                  f"{best['kappa']:.2f}", f"{best['theta']:.2f}",
                  f"{100 * best['draft_share_median']:.0f}%",
                  f"{best['peak_drafter_state_mb']:.2f}"]
        print(f"| {batch} | {drafter} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
