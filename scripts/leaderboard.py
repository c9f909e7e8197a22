#!/usr/bin/env python3
"""The drafter leaderboard (issue 17) from `specula bench --json` runs (scripts/leaderboard.sh).

  scripts/leaderboard.py GREEDY.json T1.json [--json OUT.json]

One table: per temperature, batch size and drafter, the best fixed budget (by median speedup over
no speculation in the same run) and the adaptive budget: speedup (median, min), a (tokens per
target step), theta (kappa / speedup, lower is better), the drafter's share of the step time; and
per drafter its memory (weights + peak per-sequence state) and training cost (training.json next
to its checkpoint). Prints Markdown; --json writes the same rows.
"""
import argparse
import json
import os
import sys


def training_cost(model_dir):
    """'9.4 min, 500 x 8 records' from model_dir/training.json, '' when there is none."""
    path = os.path.join(model_dir or "", "training.json")
    if not model_dir or not os.path.exists(path):
        return ""
    with open(path) as f:
        t = json.load(f)
    parts = []
    if t.get("seconds_this_run"):
        parts.append(f"{t['seconds_this_run'] / 60:.1f} min")
    if t.get("steps"):
        batch = t.get("batch_size")
        parts.append(f"{t['steps']} steps" + (f" x {batch}" if batch else ""))
    if t.get("tokens_seen"):
        parts.append(f"{t['tokens_seen'] / 1e6:.1f}M tok")
    base = t.get("base_training")  # a fine-tuned LM (train-lm --init-from): its base's training too
    if base:
        parts.append(f"after {base.get('steps', '?')} steps, "
                     f"{base.get('tokens_seen', 0) / 1e6:.1f}M tok of pretraining")
    if t.get("init_encoder_from"):  # SpecDec started from a trained LM: its training counts too
        parts.append(f"encoder from {os.path.basename(t['init_encoder_from'].rstrip('/'))}")
    return ", ".join(parts)


def weights_mb(model_dir):
    path = os.path.join(model_dir or "", "model.safetensors")
    return os.path.getsize(path) / 2**20 if model_dir and os.path.exists(path) else 0.0


def family_of(drafter, settings):
    """The settings key of a variant: 'beagle-chain' -> 'beagle'."""
    for family in sorted(settings, key=len, reverse=True):
        if drafter == family or drafter.startswith(family + "-"):
            return family
    return drafter


def rows_of(path):
    with open(path) as f:
        data = json.load(f)
    settings = data.get("drafter_settings", {})
    temperature = data.get("temperature", 0.0)
    groups = {}  # (batch, drafter) -> {"fixed": [rows], "adaptive": row}
    baseline = {}
    for r in data.get("results", []):
        if r["drafter"] == "none":
            baseline[r["batch_size"]] = r
            continue
        g = groups.setdefault((r["batch_size"], r["drafter"]), {"fixed": [], "adaptive": None})
        if r.get("draft_budget", "fixed") == "adaptive":
            g["adaptive"] = r
        else:
            g["fixed"].append(r)
    out = []
    for (batch, drafter), g in sorted(groups.items()):
        family = family_of(drafter, settings)
        model = settings.get(family, {}).get("model", "")
        best = max(g["fixed"], key=lambda r: r["speedup_median"]) if g["fixed"] else None
        ad = g["adaptive"]
        state = max(r["peak_drafter_state_mb"] for r in g["fixed"] + ([ad] if ad else []))

        def figures(r):
            if r is None:
                return None
            return {"speedup": r["speedup_median"], "speedup_min": r["speedup_min"],
                    "a": r["mean_accepted_len"], "theta": r["theta"],
                    "draft_share": r["draft_share_median"], "tokens_per_s": r["tokens_per_s_median"],
                    "nodes": r["mean_draft_tokens"]}

        out.append({
            "temperature": temperature, "batch": batch, "drafter": drafter,
            "none_tokens_per_s": baseline.get(batch, {}).get("tokens_per_s_median"),
            "best_fixed_k": best["draft_len"] if best else None,
            "fixed": figures(best), "adaptive": figures(ad),
            "weights_mb": weights_mb(model), "peak_state_mb": state,
            "training": training_cost(model),
        })
    return out


def cell(f, key, fmt):
    return "-" if f is None or f.get(key) is None else fmt.format(f[key])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="specula bench --json outputs (greedy, T = 1)")
    parser.add_argument("--json", help="write the table's rows here")
    args = parser.parse_args()
    rows = []
    for path in args.runs:
        rows += rows_of(path)
    if not rows:
        print("no results", file=sys.stderr)
        return 1
    head = ["T", "batch", "drafter", "best k", "speedup (min)", "a", "theta", "draft %",
            "adaptive speedup (min)", "a", "theta", "draft %", "weights + state MB", "training"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    last = None
    for r in rows:
        key = (r["temperature"], r["batch"])
        if key != last and r["none_tokens_per_s"]:
            print(f"| {r['temperature']:g} | {r['batch']} | none ({r['none_tokens_per_s']:.0f} tok/s) |"
                  + " |" * (len(head) - 3))
        last = key
        f, a = r["fixed"], r["adaptive"]
        speed = lambda x: "-" if x is None else f"{x['speedup']:.2f}x ({x['speedup_min']:.2f}x)"
        cells = [f"{r['temperature']:g}", str(r["batch"]), r["drafter"],
                 str(r["best_fixed_k"] or "-"), speed(f), cell(f, "a", "{:.2f}"),
                 cell(f, "theta", "{:.2f}"),
                 "-" if f is None else f"{100 * f['draft_share']:.0f}%",
                 speed(a), cell(a, "a", "{:.2f}"), cell(a, "theta", "{:.2f}"),
                 "-" if a is None else f"{100 * a['draft_share']:.0f}%",
                 f"{r['weights_mb']:.1f} + {r['peak_state_mb']:.2f}", r["training"] or "-"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": args.runs, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
