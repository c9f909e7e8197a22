#!/usr/bin/python3
"""scripts/plot_loadgen.py on a synthetic specula-loadgen summary and on flat result files: every
chart is a PNG; no speedup chart without a "none" run. Exits 77 (skipped) without matplotlib.

    /usr/bin/python3 tests/loadgen/plot_loadgen_test.py SOURCE_DIR
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

if importlib.util.find_spec("matplotlib") is None:
    print("SKIP: python3-matplotlib is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

SCRIPT = os.path.join(sys.argv[1], "scripts", "plot_loadgen.py")


def row(drafter, c, tps, per_position):
    return {"target": "all", "drafter": drafter, "max_concurrency": c, "concurrency": c,
            "output_throughput": tps, "output_throughput_median": tps,
            "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0, "median_tpot_ms": 5.0,
            "p99_tpot_ms": 8.0, "median_itl_ms": 4.0, "p99_itl_ms": 9.0,
            "median_e2el_ms": 100.0, "num_drafts": 10 if per_position else 0,
            "accepted_per_position": per_position}


def run(args):
    out = subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def pngs(directory):
    found = sorted(f for f in os.listdir(directory) if f.endswith(".png"))
    for f in found:
        with open(os.path.join(directory, f), "rb") as png:
            assert png.read(8) == b"\x89PNG\r\n\x1a\n", f
    return found


with tempfile.TemporaryDirectory() as tmp:
    summary = os.path.join(tmp, "bench.json")
    rows = [row("none", c, 100.0 * c, []) for c in (1, 4)]
    rows += [row("ngram", c, 180.0 * c, [7, 4, 2]) for c in (1, 4)]
    with open(summary, "w") as f:
        json.dump({"results": rows}, f)
    run([summary])
    assert pngs(tmp) == ["bench-acceptance.png", "bench-latency.png", "bench-speedup.png",
                         "bench-throughput.png"], pngs(tmp)

    flat = os.path.join(tmp, "flat")
    os.makedirs(flat)
    for i, r in enumerate(rows[2:]):
        del r["concurrency"], r["output_throughput_median"]
        with open(os.path.join(flat, f"run{i}.json"), "w") as f:
            json.dump(r, f)
    out_dir = os.path.join(tmp, "charts")
    run(["--out-dir", out_dir, "--prefix", "x"] + [os.path.join(flat, f) for f in os.listdir(flat)])
    # No "none" run: no speedup chart.
    assert pngs(out_dir) == ["x-acceptance.png", "x-latency.png", "x-throughput.png"], pngs(out_dir)

    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"foo": 1}, f)
    out = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
    assert out.returncode != 0 and "output_throughput" in out.stderr, out.stderr
print("ok")
