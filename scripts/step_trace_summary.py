#!/usr/bin/python3
"""How the adaptive draft budget's predictions compare with what its steps measured.

Reads a `--step-trace` file (one JSON line per step, common/spec/step_trace.h) and groups the
decode-only steps by decoding sequences, by what the plan did (none: no drafts; exploit: drafts
the optimum chose; explore: drafts with exploration; audit: none, the drafting audit's no-draft
epoch; audit skip: the same, promised quiet for more than --skip-above steps, so the engine kept
no hidden states of its hidden-state drafters) and by whether the step before drafted
(a drafter's call evicts the target's weights from the caches; a sequence's first drafting
step pays its catch-up). Per group: the plan's predicted ms and tokens, the measured ms (wall)
and tokens, and tokens per ms predicted, measured and without drafts (as planned and as the
undrafted steps after undrafted ones measured).

Then the steps after a draft: the target's median ms of the undrafted decode-only steps 1, 2, ...
steps after the last step that drafted, against those further than --aftermath-steps from any
(per decoding sequences), and what the steps after a draft took beyond those, summed per draft
(a drafter's call and the verify forward evict the target's weights from the caches).

Then the steps that prefilled prompt chunks, by the chunk rows (in 64s) and whether they drafted:
the plan's predicted ms (with and without its drafts) against the measured wall and target ms,
medians (the prefill-step bound is a fraction of the prediction without drafts; a `specula serve`
trace's label is "router": --label-contains router).

Last, where drafting gained or lost time: each decode-only step's wall ms less its tokens at the
far undrafted steps' mean ms per token, summed by what it was (a drafted step that starts a run
of drafted steps or continues one, by the optimum or exploration; the undrafted steps within
--aftermath-steps after either), as a share of all traced steps' wall time (prompt steps
included). Negative: drafting gained.

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
    p.add_argument("--skip-above", type=int, default=33,
                   help="an audit step promised more quiet steps than this skipped the hidden "
                        "states (the engine's drafter_context + 1; default: 32 + 1)")
    p.add_argument("--aftermath-steps", type=int, default=20,
                   help="steps after a draft in the second table; steps further count as far")
    args = p.parse_args()

    groups = collections.defaultdict(list)
    accounted = []  # (what the step was, its line) for the last table
    kind_of = {}  # label -> what its last drafted step was (exploit / explore)
    total_ms = 0.0
    previous = {}  # label -> whether its previous step drafted
    since = {}  # label -> steps since its last drafted step (None: none yet, or a prompt since)
    after_draft = collections.defaultdict(list)  # (decoding, steps since a draft) -> target ms
    prompt_steps = collections.defaultdict(list)  # (chunk rows // 64, drafted) -> lines
    with open(args.trace) as f:
        for text in f:
            line = json.loads(text)
            label = line["label"]
            drafted = line["draft_nodes"] > 0
            after = "after draft" if previous.get(label, False) else "after none"
            previous[label] = drafted
            k = since.get(label)
            k = None if k is None else k + 1
            since[label] = 0 if drafted else (None if line["prefill_tokens"] > 0 else k)
            if args.label_contains and args.label_contains not in label:
                continue
            plan = line.get("plan")
            if not drafted and line["prefill_tokens"] == 0 and plan is not None:
                far = k is None or k > args.aftermath_steps
                after_draft[(plan["decoding"], "far" if far else k)].append(line["target_ms"])
            total_ms += line["wall_ms"]
            if line["prefill_tokens"] > 0 and plan is not None:
                prompt_steps[(line["prefill_tokens"] // 64, drafted)].append(line)
            if line["prefill_tokens"] == 0 and plan is not None:
                if drafted:
                    kind = "explore" if plan["explored"] > 0 else "exploit"
                    kind_of[label] = kind
                    what = kind + (" continues" if after == "after draft" else " starts")
                elif k is not None and k <= args.aftermath_steps and label in kind_of:
                    what = "after " + kind_of[label]
                else:
                    what = "far"
                accounted.append((what, plan["decoding"], line))
            plan = line.get("plan")
            if plan is None or line["prefill_tokens"] > 0 or plan["prefill_tokens"] > 0:
                continue
            if plan.get("audit_off"):  # the drafting audit's no-draft epochs (older traces: none)
                kind = ("audit skip" if plan.get("quiet_steps", 0) > args.skip_above
                        else "audit")
            else:
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
    print("%4s %-10s %-12s %6s %8s %8s %8s %6s %11s %7s %23s %9s" % header)
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
        print("%4d %-10s %-12s %6d %8.3f %8.3f %8.2f %6.2f %11.2f %7.2f %23.2f %9s" % (
            decoding, kind, after, len(lines), pred_ms, wall_ms, pred_tok, tok,
            row["predicted_tokens_per_ms"] or 0, row["tokens_per_ms"] or 0, no_draft_planned,
            "%.2f" % measured if measured is not None else "-"))

    aftermath = []
    print("\nundrafted decode steps by steps since the last draft: target median ms (steps)")
    for decoding in sorted({d for d, _ in after_draft}):
        far = after_draft.get((decoding, "far"))
        if not far:
            continue
        far_ms = statistics.median(far)
        cells, excess = [], 0.0
        for k in range(1, args.aftermath_steps + 1):
            ms = after_draft.get((decoding, k))
            if not ms:
                continue
            median = statistics.median(ms)
            excess += median - far_ms
            cells.append({"steps_since_draft": k, "steps": len(ms), "median_ms": median})
        aftermath.append({"decoding": decoding, "far_steps": len(far), "far_median_ms": far_ms,
                          "after_draft": cells, "excess_ms_per_draft": excess})
        print("%4d far %.3f (%d); " % (decoding, far_ms, len(far)) +
              " ".join("%d:%.3f(%d)" % (c["steps_since_draft"], c["median_ms"], c["steps"])
                       for c in cells) +
              "; excess per draft %.3f ms" % excess)

    prompt_rows = []
    print("\nsteps with prompt chunks: medians (ms)")
    print("%10s %8s %6s %6s %9s %12s %8s %9s %8s" % (
        "chunk rows", "drafted", "steps", "dec", "pred ms", "no-draft ms", "wall ms",
        "target ms", "nodes"))
    for (chunks, drafted), lines in sorted(prompt_steps.items()):
        median = lambda f: statistics.median(f(l) for l in lines)
        row = {"chunk_rows_from": 64 * chunks, "chunk_rows_to": 64 * chunks + 63,
               "drafted": drafted, "steps": len(lines),
               "decoding": median(lambda l: l["plan"]["decoding"]),
               "predicted_ms": median(lambda l: l["plan"]["ms"]),
               "no_draft_ms": median(lambda l: l["plan"]["no_draft_ms"]),
               "wall_ms": median(lambda l: l["wall_ms"]),
               "target_ms": median(lambda l: l["target_ms"]),
               "draft_nodes": median(lambda l: l["draft_nodes"])}
        prompt_rows.append(row)
        print("%4d-%-5d %8s %6d %6.0f %9.2f %12.2f %8.2f %9.2f %8.1f" % (
            row["chunk_rows_from"], row["chunk_rows_to"], "yes" if drafted else "no",
            len(lines), row["decoding"], row["predicted_ms"], row["no_draft_ms"],
            row["wall_ms"], row["target_ms"], row["draft_nodes"]))

    # Per decoding sequences: the far undrafted steps' ms per token is the rate drafting is
    # measured against.
    far_rate = {}
    for decoding in {d for _, d, _ in accounted}:
        far = [l for w, d, l in accounted if w == "far" and d == decoding]
        if far:
            far_rate[decoding] = (sum(l["wall_ms"] for l in far) /
                                  sum(max(l["new_tokens"], 1) for l in far))
    balance = collections.defaultdict(lambda: [0, 0.0])
    for what, decoding, line in accounted:
        if decoding in far_rate and what != "far":
            balance[what][0] += 1
            balance[what][1] += line["wall_ms"] - line["new_tokens"] * far_rate[decoding]
    print("\ntime beyond the far undrafted steps' rate, by what the step was (%% of %.0f ms)" %
          total_ms)
    for what in sorted(balance):
        steps, ms = balance[what]
        print("  %-18s %6d steps %9.1f ms %7.2f%%" % (what, steps, ms,
                                                     100 * ms / total_ms if total_ms else 0.0))
    net = sum(ms for _, ms in balance.values())
    share = 100 * net / total_ms if total_ms > 0 else 0.0
    print("  %-18s %6s       %9.1f ms %7.2f%%" % ("all drafting", "", net, share))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "label_contains": args.label_contains, "groups": rows,
                       "after_draft": aftermath,
                       "prompt_steps": prompt_rows,
                       "balance": {w: {"steps": n, "ms": ms, "share": ms / total_ms}
                                   for w, (n, ms) in balance.items()},
                       "total_ms": total_ms}, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    sys.exit(main())
