#!/usr/bin/python3
"""How the adaptive draft budget's predictions compare with what its steps measured.

Reads a `--step-trace` file (one JSON line per step, common/spec/step_trace.h) and groups the
decode-only steps by decoding sequences, by what the plan did (none: no drafts; exploit: drafts
the optimum chose; explore: drafts with exploration) and by whether the step before drafted
(a drafter's call evicts the target's weights from the caches; a sequence's first drafting
step pays its catch-up). Per group: the plan's predicted ms and tokens, the measured ms (wall)
and tokens, and tokens per ms predicted, measured and without drafts (as planned and as the
undrafted steps after undrafted ones measured).

  specula bench ... --draft-lens adaptive --step-trace trace.jsonl
  scripts/step_trace_summary.py trace.jsonl [--label-contains "b1 repeat"] [--json out.json]
"""
import argparse
import collections
import json
import signal
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--label-contains", default="repeat",
                   help="only lines whose label contains this (default: bench's timed repeats; "
                        "'' = all)")
    p.add_argument("--json", help="also write the table here")
    args = p.parse_args()

    groups = collections.defaultdict(list)
    previous = {}  # label -> whether its previous step drafted
    with open(args.trace) as f:
        for text in f:
            line = json.loads(text)
            label = line["label"]
            drafted = line["draft_nodes"] > 0
            after = "after draft" if previous.get(label, False) else "after none"
            previous[label] = drafted
            if args.label_contains and args.label_contains not in label:
                continue
            plan = line.get("plan")
            if plan is None or line["prefill_tokens"] > 0 or plan["prefill_tokens"] > 0:
                continue
            kind = "none" if plan["nodes"] == 0 else ("explore" if plan["explored"] > 0 else
                                                       "exploit")
            groups[(plan["decoding"], kind, after)].append(line)

    # The price of not drafting as measured: undrafted steps after undrafted ones, per batch.
    measured_none = {}
    for (decoding, kind, after), lines in groups.items():
        if kind == "none" and after == "after none":
            measured_none[decoding] = statistics.mean(l["wall_ms"] for l in lines)

    rows = []
    header = ("dec", "plan", "step before", "steps", "pred ms", "wall ms", "pred tok", "tok",
              "pred tok/ms", "tok/ms", "no-draft tok/ms planned", "measured")
    print("%4s %-8s %-12s %6s %8s %8s %8s %6s %11s %7s %23s %9s" % header)
    for key in sorted(groups):
        lines = groups[key]
        decoding, kind, after = key
        mean = lambda f: statistics.mean(f(l) for l in lines)
        pred_ms = mean(lambda l: l["plan"]["ms"])
        wall_ms = mean(lambda l: l["wall_ms"])
        pred_tok = mean(lambda l: l["plan"]["tokens"])
        tok = mean(lambda l: l["new_tokens"])
        no_draft_planned = mean(lambda l: l["plan"]["no_draft_tokens"] / l["plan"]["no_draft_ms"]
                                if l["plan"]["no_draft_ms"] > 0 else 0.0)
        measured = decoding / measured_none[decoding] if decoding in measured_none else None
        row = {"decoding": decoding, "plan": kind, "step_before": after, "steps": len(lines),
               "predicted_ms": pred_ms, "wall_ms": wall_ms, "predicted_tokens": pred_tok,
               "tokens": tok,
               "predicted_tokens_per_ms": pred_tok / pred_ms if pred_ms > 0 else None,
               "tokens_per_ms": tok / wall_ms if wall_ms > 0 else None,
               "no_draft_tokens_per_ms_planned": no_draft_planned,
               "no_draft_tokens_per_ms_measured": measured}
        rows.append(row)
        print("%4d %-8s %-12s %6d %8.3f %8.3f %8.2f %6.2f %11.2f %7.2f %23.2f %9s" % (
            decoding, kind, after, len(lines), pred_ms, wall_ms, pred_tok, tok,
            row["predicted_tokens_per_ms"] or 0, row["tokens_per_ms"] or 0, no_draft_planned,
            "%.2f" % measured if measured is not None else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "label_contains": args.label_contains, "groups": rows},
                      f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    sys.exit(main())
