#!/usr/bin/env python3
"""Start-up time and resident memory of `specula serve` (docs/BENCHMARKS.md, issue 13).

Launches `specula serve --model MODEL --port 0` REPEATS times with OpenBLAS's kernels switched at
start-up (the default) and with SPECULA_NO_BLAS_RELAUNCH=1, and prints the time from launch to the
"listening" line and VmRSS one second later.
Usage: scripts/bench_startup.py [BINARY] [MODEL] [REPEATS]
"""
import os
import re
import subprocess
import sys
import time

binary = sys.argv[1] if len(sys.argv) > 1 else "build/bin/specula"
model = sys.argv[2] if len(sys.argv) > 2 else "models/pyllama-6m"
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3


def start(extra_env):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("SPECULA_NO_BLAS_RELAUNCH", None)
    env.update(extra_env)
    t0 = time.time()
    proc = subprocess.Popen([binary, "serve", "--model", model, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    elapsed = None
    for line in proc.stdout:
        if "listening" in line.lower():
            elapsed = time.time() - t0
            break
    if elapsed is None:
        sys.exit(f"{binary} serve exited before listening (code {proc.wait()})")
    time.sleep(1)
    with open(f"/proc/{proc.pid}/status") as f:
        rss_mb = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) // 1024
    proc.terminate()
    proc.wait()
    return elapsed, rss_mb


for _ in range(repeats):
    for label, env in (("switched", {}), ("no-switch", {"SPECULA_NO_BLAS_RELAUNCH": "1"})):
        t, rss = start(env)
        print(f"{label:10s} {t:.2f} s to listening, {rss} MB resident")
