#!/usr/bin/python3
"""Markdown rows from a `specula-loadgen --json` file: each target's drafters against its own `none`.

One row per concurrency and drafter; per target (in the order given, or all of them sorted), the
cell is: tokens/s over `none`'s, paired by repeat, median (min) / mean TPOT over `none`'s / p99
ITL per streamed chunk over `none`'s / p99 ITL per token over `none`'s / mean accepted tokens per
step. Ratios are medians of the per-repeat ratios (the loadgen alternates targets and drafters
repeat by repeat, so each repeat's ratio cancels the machine's drift). TPOT and ITL ratios below 1
are better.

  scripts/loadgen_vs_none.py RUN.json [--targets bound,unbounded]
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="specula-loadgen --json output")
    p.add_argument("--targets", help="comma-separated targets, in column order (default: all)")
    args = p.parse_args()
    with open(args.results) as f:
        results = json.load(f)["results"]
    by = {(r["target"], r["concurrency"], r["drafter"]): r for r in results}
    targets = (args.targets.split(",") if args.targets
               else sorted({r["target"] for r in results}))
    drafters = [d for d in dict.fromkeys(r["drafter"] for r in results) if d != "none"]

    def paired(r, none, key):
        return [x / y for x, y in zip(r[key], none[key])]

    print("| concurrency | drafter | " + " | ".join(targets) + " |")
    print("|---|---|" + "---|" * len(targets))
    for c in sorted({r["concurrency"] for r in results}):
        for d in drafters:
            cells = []
            for t in targets:
                r, none = by.get((t, c, d)), by.get((t, c, "none"))
                if r is None or none is None:
                    cells.append("-")
                    continue
                tps = paired(r, none, "output_throughput_repeats")
                cells.append("%.2f (%.2f) / %.2f / %.2f / %.2f / %.2f" % (
                    statistics.median(tps), min(tps),
                    statistics.median(paired(r, none, "mean_tpot_ms_repeats")),
                    statistics.median(paired(r, none, "p99_itl_ms_repeats")),
                    statistics.median(paired(r, none, "p99_token_itl_ms_repeats")),
                    r["mean_accepted_len"]))
            print("| %d | %s | %s |" % (c, d, " | ".join(cells)))
    for t in targets:
        rows = [by[(t, c, "none")] for c in sorted({r["concurrency"] for r in results})
                if (t, c, "none") in by]
        print("\n%s `none`: tokens/s %s, p99 ITL ms %s" % (
            t, " / ".join("%.0f" % r["output_throughput_median"] for r in rows),
            " / ".join("%.2f" % r["p99_itl_ms_median"] for r in rows)), end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
