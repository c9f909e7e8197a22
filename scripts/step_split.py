#!/usr/bin/python3
"""Where a decoding step's CPU time goes, from a `perf record` profile of `specula`.

Release builds have no frame pointers, so call graphs are unreliable; this attributes each sample
by the function it landed in (self time) to one of a few buckets: the model's matmuls and
attention, the other model kernels, verification, KV commit, host copies, the drafter, LibTorch's
op dispatch and allocation, the kernel, and idle spinning of the kernels' worker pool.

  perf record -F 999 -o perf.data build/bin/specula bench ...
  scripts/step_split.py perf.data [--json out.json] [--label NAME]
"""
import argparse
import json
import re
import subprocess
import sys

# (bucket, dso regex or None, symbol regex); the first match wins.
RULES = [
    ("process start-up", r"ld-linux", r""),
    ("matmul", None, r"SmallMatmul|sgemm|dgemm|gemm_|Linear|addmm|mkl_|blas_"),
    ("attention", None, r"AttendRows|PagedAttention|MaskedAttention|softmax"),
    ("other model kernels", None, r"SiluMul|RotateRow|RmsNorm|Rope|Embedding|WriteKv"),
    ("verification", None, r"Verify|Probabilities|Argmax|SampleFrom|SampleRows|Shaped"),
    ("KV commit", None, r"KeepOnly|CommitPaths|index_copy|IndexCopy"),
    ("drafter", None, r"Drafter|Ngram|ngram|Beagle|SpecFormer|ParallelSpec|SpecDec"),
    ("pool spin / wait", None, r"WorkSharingPool::WorkerLoop|WorkSharingPool::Run|sched_yield|"
                               r"futex|gomp|GOMP|omp_"),
    ("host copies", None, r"memcpy|memmove|copy_kernel|copy_|_copy"),
    ("allocation", None, r"malloc|_int_free|free|unlink_chunk|CPUAllocator|alloc_cpu|"
                         r"TensorImpl|StorageImpl|mmap|munmap"),
    ("LibTorch dispatch", r"libtorch|libc10", r""),
    ("kernel (page faults, scheduling)", r"kernel", r""),
]


def Parse(perf_data):
    out = subprocess.run(
        ["perf", "report", "-i", perf_data, "--no-children", "--sort", "dso,symbol", "--stdio",
         "-g", "none", "--percent-limit", "0"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()))
    return rows


def Bucket(dso, kind, symbol):
    for name, dso_re, sym_re in RULES:
        if dso_re is not None:
            target = "kernel" if kind == "k" else dso
            if re.search(dso_re, target) and (not sym_re or re.search(sym_re, symbol)):
                return name
            continue
        if re.search(sym_re, symbol):
            return name
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf_data")
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    totals = {}
    for pct, dso, kind, symbol in Parse(args.perf_data):
        b = Bucket(dso, kind, symbol)
        totals[b] = totals.get(b, 0.0) + pct
    startup = totals.pop("process start-up", 0.0)
    run = sum(totals.values())
    shares = {k: 100.0 * v / run for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    print(f"{args.label}  (start-up excluded: {startup:.1f}% of samples)")
    for k, v in shares.items():
        print(f"  {k:34s} {v:5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "startup_share": startup, "shares": shares}, f,
                      indent=1)


if __name__ == "__main__":
    sys.exit(main())
