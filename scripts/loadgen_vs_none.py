#!/usr/bin/python3
"""Markdown rows from a `specula-loadgen --json` file: each target's drafters against its own `none`.

One row per concurrency and drafter; per target (in the order given, or all of them sorted), the
cell is: tokens/s over `none`'s, paired by repeat, median (min) / mean TPOT over `none`'s / p99
ITL per streamed chunk over `none`'s / p99 ITL per token over `none`'s / mean accepted tokens per
step. Ratios are medians of the per-repeat ratios (the loadgen alternates targets and drafters
repeat by repeat, so each repeat's ratio cancels the machine's drift). TPOT and ITL ratios below 1
are better.

With --best, each ratio is instead of the best repeats: the highest tokens/s over `none`'s
highest, the lowest TPOT and p99s over `none`'s lowest (on a machine whose speed jumps between
runs, each setting's least disturbed run; needs several repeats; pooled columns take the best of
all their repeats), and the cell's tokens/s shows the paired min in parentheses as before.

With --control NAME (a second target on the same server: `AA=1 FIXED_LEN=0
scripts/bench_adaptive_serving.sh`), a last column "A/A" holds NAME over the first target for the
same drafter, `none` included, paired by repeat: tokens/s median (min) / TPOT / p99 ITL per chunk /
per token. Both measured one server, so these ratios are the run's spread, not speculation's; and a
column "both" before it pools the two targets' repeats (each drafter over its own target's `none`,
paired by repeat: twice the pairs for each median; accepted length their mean).

  scripts/loadgen_vs_none.py RUN.json [--targets bound,unbounded] [--control control]
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="specula-loadgen --json output")
    p.add_argument("--targets", help="comma-separated targets, in column order (default: all)")
    p.add_argument("--best", action="store_true", help="ratios of each setting's best repeats")
    p.add_argument("--control", help="a target on the same server as the first: adds an A/A column")
    args = p.parse_args()
    with open(args.results) as f:
        results = json.load(f)["results"]
    by = {(r["target"], r["concurrency"], r["drafter"]): r for r in results}
    targets = (args.targets.split(",") if args.targets
               else sorted({r["target"] for r in results}))
    drafters = [d for d in dict.fromkeys(r["drafter"] for r in results) if d != "none"]

    def paired(r, base, key):
        return [x / y for x, y in zip(r[key], base[key])]

    def cell(pairs, accepted=True):
        """Each (result, base) pair's ratios, pooled: "-" if any is missing."""
        if any(r is None or base is None for r, base in pairs):
            return "-"

        def ratio(key):
            if args.best:  # each side's best repeat, over every pair's repeats
                best = max if key == "output_throughput_repeats" else min
                return (best(x for r, _ in pairs for x in r[key]) /
                        best(x for _, base in pairs for x in base[key]))
            return statistics.median(x for r, base in pairs for x in paired(r, base, key))

        text = "%.2f (%.2f) / %.2f / %.2f / %.2f" % (
            ratio("output_throughput_repeats"),
            min(x for r, base in pairs for x in paired(r, base, "output_throughput_repeats")),
            ratio("mean_tpot_ms_repeats"), ratio("p99_itl_ms_repeats"),
            ratio("p99_token_itl_ms_repeats"))
        if accepted:
            text += " / %.2f" % statistics.mean(r["mean_accepted_len"] for r, _ in pairs)
        return text

    if args.control and args.control not in targets:
        targets.append(args.control)
    reference = next((t for t in targets if t != args.control), None)
    columns = targets + (["both", "A/A"] if args.control else [])

    def against_none(t, c, d):
        return (by.get((t, c, d)), by.get((t, c, "none")))

    def aa_cell(c, d):
        return cell([(by.get((args.control, c, d)), by.get((reference, c, d)))], accepted=False)

    print("| concurrency | drafter | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for c in sorted({r["concurrency"] for r in results}):
        if args.control:
            print("| %d | none | %s | 1 | %s |" % (c, " | ".join("1" for _ in targets),
                                                 aa_cell(c, "none")))
        for d in drafters:
            cells = [cell([against_none(t, c, d)]) for t in targets]
            if args.control:
                both = [against_none(t, c, d) for t in (reference, args.control)]
                cells += [cell(both), aa_cell(c, d)]
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
