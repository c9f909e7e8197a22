#!/usr/bin/python3
"""scripts/soak.py analyze on synthetic soak outputs: a clean run passes; a client-side timeout
and a dropped connection count as lost, a greedy text unlike its reference as a mismatch, an error
the request did not ask for as unexpected, a grown RSS as drift, a dead server as a death; each
fails the verdict (exit 1). The asked-for cancels, deadlines and invalid requests do not.

    /usr/bin/python3 tests/loadgen/soak_analyze_test.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(sys.argv[1], "scripts", "soak.py")


def soak_dir(root, errors, texts, rss_mb, crashed="", chunks_run=2):
    """Four requests in two chunks: greedy plain, sampled, cancel, invalid drafter."""
    os.makedirs(os.path.join(root, "results"))
    requests = [
        {"i": 0, "prompt": 0, "output_len": 8, "ignore_eos": True, "drafter": "beagle"},
        {"i": 1, "prompt": 0, "output_len": 8, "ignore_eos": True, "drafter": "ngram",
         "temperature": 0.8, "seed": 3},
        {"i": 2, "prompt": 0, "output_len": 8, "ignore_eos": True, "drafter": "none",
         "cancel_after_ms": 5},
        {"i": 3, "prompt": 0, "output_len": 8, "ignore_eos": True, "drafter": "no-such-drafter",
         "bad": "drafter"},
    ]
    key = json.dumps(["p0", 8, [], True])
    plan = {"requests": requests, "refs": [key],
            "chunks": [{"file": "chunk-000.jsonl", "first": 0, "count": 2},
                       {"file": "chunk-001.jsonl", "first": 2, "count": 2}]}
    with open(os.path.join(root, "plan.json"), "w") as f:
        json.dump(plan, f)
    with open(os.path.join(root, "results", "refs.json"), "w") as f:
        json.dump({"errors": [""], "generated_texts": ["x = 1"]}, f)
    for c in range(chunks_run):
        with open(os.path.join(root, "results", f"chunk-00{c}.json"), "w") as f:
            json.dump({"errors": errors[2 * c:2 * c + 2], "generated_texts": texts[2 * c:2 * c + 2],
                       "draft_errors": 0}, f)
    with open(os.path.join(root, "events.tsv"), "w") as f:
        f.write("100.0 chunk-start 0\n110.0 chunk-end 0\n")
        if chunks_run == 2:
            f.write("110.1 chunk-start 1\n120.0 chunk-end 1\n")
    with open(os.path.join(root, "rss.tsv"), "w") as f:
        for t, mb in zip((101, 105, 109, 112, 116, 119), rss_mb):
            f.write(f"{t}.0 all 42 {mb * 1024}\n")
    if crashed:
        with open(os.path.join(root, "crashed.txt"), "w") as f:
            f.write(crashed + "\n")


def analyze(errors, texts, rss_mb=(100, 150, 200, 201, 202, 203), crashed="", chunks_run=2):
    with tempfile.TemporaryDirectory() as root:
        soak_dir(root, errors, texts, rss_mb, crashed, chunks_run)
        out = subprocess.run([sys.executable, SCRIPT, "analyze", root], capture_output=True,
                             text=True, env=dict(os.environ, WARMUP_CHUNKS="1"))
        with open(os.path.join(root, "summary.json")) as f:
            return out.returncode, json.load(f), out.stdout


GOOD_ERRORS = ["", "", "1: Cancelled", "3: unknown drafter 'no-such-drafter'"]
GOOD_TEXTS = ["x = 1", "anything", "", ""]

code, s, table = analyze(GOOD_ERRORS, GOOD_TEXTS)
assert code == 0, table
assert s["verdict"] == "PASS", s
assert s["lost"] == 0 and s["greedy_mismatches"] == 0 and s["unexpected_errors"] == 0, s
assert s["greedy_checked"] == 1 and s["sampled_completed"] == 1, s
assert s["codes"] == {"OK": 2, "CANCELLED": 1, "INVALID_ARGUMENT": 1}, s
assert s["codes_by_kind"]["cancel"] == {"CANCELLED": 1}, s
# RSS: 200 MB at the end of the warm-up chunk, at most 203 after: 1.5%.
assert abs(s["rss_max_drift_pct"] - 1.5) < 1e-9, s
assert "lost 0" in table and "verdict: PASS" in table, table

# A plain request the client gave up on after its generous timeout, and a dropped connection.
code, s, _ = analyze(["4: Deadline Exceeded", "", "14: Socket closed", GOOD_ERRORS[3]],
                     GOOD_TEXTS)
assert code == 1 and s["lost"] == 2, s
assert "2 lost" in s["verdict"], s

# The server's own DEADLINE_EXCEEDED (a step deadline after a pause) is answered, not lost.
code, s, _ = analyze(["4: engine step: no answer to a step within 30000 ms", "",
                      GOOD_ERRORS[2], GOOD_ERRORS[3]], GOOD_TEXTS)
assert code == 0 and s["lost"] == 0 and s["server_deadlines"] == 1, s

# A greedy completion that is not the reference.
code, s, _ = analyze(GOOD_ERRORS, ["x = 2"] + GOOD_TEXTS[1:])
assert code == 1 and s["greedy_mismatches"] == 1, s
assert s["mismatch_examples"][0]["want"] == "x = 1", s

# An error the request did not ask for (the sampled one) is unexpected, not lost.
code, s, _ = analyze(["", "13: engine failed", GOOD_ERRORS[2], GOOD_ERRORS[3]], GOOD_TEXTS)
assert code == 1 and s["unexpected_errors"] == 1 and s["lost"] == 0, s

# Memory that keeps growing after the warm-up.
code, s, _ = analyze(GOOD_ERRORS, GOOD_TEXTS, rss_mb=(100, 150, 200, 205, 210, 215))
assert code == 1 and "RSS drift" in s["verdict"], s
assert abs(s["rss_max_drift_pct"] - 7.5) < 1e-9, s

# A server that died.
code, s, _ = analyze(GOOD_ERRORS, GOOD_TEXTS, crashed="all (pid 42) exited: SIGABRT")
assert code == 1 and "server died" in s["verdict"], s
# Stopped after the first chunk: judged on it alone (the second chunk was never started).
code, s, table = analyze(GOOD_ERRORS, GOOD_TEXTS, chunks_run=1)
assert code == 0 and s["requests"] == 2 and s["requests_planned"] == 4 and s["lost"] == 0, s
assert "stopped early: 1 of 2 chunks" in table, table
print("ok")
