#!/usr/bin/python3
"""The planning and the verdict of scripts/soak.sh (Debian's python3, standard library only).

  soak.py plan OUT_DIR      writes the request mix as JSONL files for specula-loadgen:
                            refs.jsonl (one greedy `drafter: none` request per distinct greedy
                            request: the references) and chunk-NNN.jsonl (the soak itself), plus
                            plan.json (what each request asked for)
  soak.py analyze OUT_DIR   reads plan.json, the loadgen result objects, rss.tsv, events.tsv and
                            metrics-end*.txt; writes summary.json, prints the table; exit 1 when a
                            request was lost, a greedy output differs from its reference, an
                            error nobody asked for came back, a server died or its memory grew
                            past RSS_LIMIT_PCT after the warm-up.

Settings come from the environment (soak.sh passes them): REQUESTS, CHUNKS, SEED, PROMPTS,
DRAFTERS, PROMPT_DIR, WARMUP_CHUNKS, RSS_LIMIT_PCT, MODE.
"""
import json
import os
import random
import sys

# gRPC status codes (grpc/status.h).
CODES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
         5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
         9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
         13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}
# What the client's own gRPC library says when the connection went away without a status.
TRANSPORT_WORDS = ("socket closed", "connection reset", "broken pipe", "failed to connect",
                   "connection refused", "goaway", "stream removed", "rst_stream", "eof")
CONTEXT = 512  # the bundled model's context length
VOCAB = 4096   # its vocabulary; id 0 is <|endoftext|>, the only special token
STOPS = [["\n"], ["):", "\n\n"], ["return"]]
OUTPUT_LENS = [8, 16, 24]
EDGE_OUTPUT = 16  # prompts at the context's edge: CONTEXT - EDGE_OUTPUT tokens, then 16


def env(name, default):
    value = os.environ.get(name, "")
    return type(default)(value) if value != "" else default


def prompt_pool(rng, count, prompt_dir):
    """`count` text prompts of 40-160 characters (about 10-45 tokens) cut at line starts from
    held-out sources: short, so that the soak's time goes to decoding, not prefill."""
    files = sorted(os.path.join(prompt_dir, f) for f in os.listdir(prompt_dir)
                   if f.endswith(".py"))
    if not files:
        sys.exit(f"soak.py: no .py files in {prompt_dir}")
    prompts = []
    while len(prompts) < count:
        with open(rng.choice(files), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines(keepends=True)
        if len(lines) < 20:
            continue
        start = rng.randrange(0, len(lines) - 10)
        text = ""
        for line in lines[start:]:
            if len(text) + len(line) > 160:
                break
            text += line
        if len(text) >= 40 and text.strip():
            prompts.append(text)
    return prompts


def plan(out):
    rng = random.Random(env("SEED", 1))
    n = env("REQUESTS", 10000)
    chunks = max(1, min(env("CHUNKS", 10), n))
    drafters = [d for d in env("DRAFTERS", "none,ngram,draft-model,specformer,beagle,"
                                           "beagle-chain").split(",") if d]
    tree_drafters = [d for d in drafters if d in ("specformer", "beagle", "beagle-chain")] or \
        drafters
    texts = prompt_pool(rng, env("PROMPTS", 12), env("PROMPT_DIR", "/usr/lib/python3.11/test"))
    # Two prompts whose length + output fills the context exactly (a tree drafter must not push
    # the step past it), as token ids.
    edges = [[rng.randrange(1, VOCAB) for _ in range(CONTEXT - EDGE_OUTPUT)] for _ in range(2)]
    requests = []
    for i in range(n):
        r = {"i": i, "output_len": rng.choice(OUTPUT_LENS), "drafter": rng.choice(drafters),
             "ignore_eos": rng.random() < 0.8}
        u = rng.random()
        if u < 0.005:  # at the context's edge, with a tree drafter
            r["edge"] = rng.randrange(len(edges))
            r["output_len"] = EDGE_OUTPUT
            r["drafter"] = rng.choice(tree_drafters)
        else:
            r["prompt"] = rng.randrange(len(texts))
        if rng.random() < 0.2:
            r["max_draft_tokens"] = rng.choice([1, 4, 8, 16])
        if rng.random() < 0.4:  # sampled
            r["temperature"] = rng.choice([0.5, 0.8, 1.0])
            if rng.random() < 0.5:
                r["top_p"] = rng.choice([0.8, 0.9, 0.95])
            if rng.random() < 0.3:
                r["top_k"] = rng.choice([10, 50])
            if rng.random() < 0.7:
                r["seed"] = rng.randrange(1 << 32)
        if rng.random() < 0.25:
            r["stop"] = rng.choice(STOPS)
        v = rng.random()
        if v < 0.1:  # the client gives up mid-stream
            r["cancel_after_ms"] = round(rng.uniform(1, 300), 1)
        elif v < 0.2:  # a short deadline: some expire while queued, some mid-stream
            r["timeout_ms"] = round(rng.uniform(1, 150), 1)
        w = rng.random()
        if w < 0.005:
            r["bad"] = "drafter"  # INVALID_ARGUMENT: an unknown drafter
            r["drafter"] = "no-such-drafter"
        elif w < 0.01:
            r["bad"] = "too_long"  # OUT_OF_RANGE: prompt + max_new_tokens > context
            r["output_len"] = CONTEXT
        requests.append(r)

    def line(r, drafter=None, plain=False):
        j = {"output_len": r["output_len"], "ignore_eos": r["ignore_eos"],
             "drafter": drafter or r["drafter"]}
        if "edge" in r:
            j["prompt_ids"] = edges[r["edge"]]
        else:
            j["prompt"] = texts[r["prompt"]]
        if "stop" in r:
            j["stop"] = r["stop"]
        if plain:
            return j
        for key in ("max_draft_tokens", "temperature", "top_p", "top_k", "seed",
                    "cancel_after_ms", "timeout_ms"):
            if key in r:
                j[key] = r[key]
        return j

    # One reference per distinct greedy request (prompt, length, stop strings, ignore_eos).
    refs = {}
    for r in requests:
        if "temperature" not in r and "bad" not in r:
            refs.setdefault(ref_key(r), line(r, drafter="none", plain=True))
    with open(os.path.join(out, "refs.jsonl"), "w") as f:
        for j in refs.values():
            f.write(json.dumps(j) + "\n")
    per_chunk = (n + chunks - 1) // chunks
    files = []
    for c in range(chunks):
        part = requests[c * per_chunk:(c + 1) * per_chunk]
        if not part:
            break
        name = f"chunk-{c:03d}.jsonl"
        with open(os.path.join(out, name), "w") as f:
            for r in part:
                f.write(json.dumps(line(r)) + "\n")
        files.append({"file": name, "first": part[0]["i"], "count": len(part)})
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump({"mode": env("MODE", "all-in-one"), "requests": requests, "refs": list(refs),
                   "chunks": files}, f)
    print(f"soak.py: {n} requests in {len(files)} chunks, {len(refs)} greedy references, "
          f"{len(texts)} prompts")


def ref_key(r):
    prompt = f"edge{r['edge']}" if "edge" in r else f"p{r['prompt']}"
    return json.dumps([prompt, r["output_len"], r.get("stop", []), r["ignore_eos"]])


def read_json(path):
    with open(path) as f:
        return json.load(f)


def code_of(error):
    return int(error.split(":", 1)[0]) if error else 0


def rss_verdict(out, warmup_end, limit):
    """Per server process: RSS at the warm-up's end (or, for a process started later, one chunk
    after its start), at the end, and the largest drift from it."""
    samples = {}
    path = os.path.join(out, "rss.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for row in f:
                t, role, pid, kb = row.split()
                samples.setdefault((role, pid), []).append((float(t), int(kb)))
    events = []
    if os.path.exists(os.path.join(out, "events.tsv")):
        with open(os.path.join(out, "events.tsv")) as f:
            events = [(float(t), what) for t, what in (row.split(None, 1) for row in f)]
    chunk_ends = sorted(t for t, what in events if what.startswith("chunk-end"))
    procs = []
    for (role, pid), rows in sorted(samples.items(), key=lambda kv: kv[1][0][0]):
        start = rows[0][0]
        # The warm-up ends for this process at the run's warm-up end or, if it started later,
        # at the first chunk end after the next one.
        base_t = warmup_end
        if start > warmup_end:
            later = [t for t in chunk_ends if t > start]
            base_t = later[1] if len(later) > 1 else None
        if base_t is None:
            procs.append({"role": role, "pid": int(pid), "samples": len(rows),
                          "note": "started too late to have a warm-up"})
            continue
        before = [kb for t, kb in rows if t <= base_t]
        after = [kb for t, kb in rows if t > base_t]
        if not before or not after:
            procs.append({"role": role, "pid": int(pid), "samples": len(rows),
                          "note": "no samples on one side of the warm-up end"})
            continue
        base = before[-1]
        drift = max(abs(kb - base) for kb in after) * 100.0 / base
        procs.append({"role": role, "pid": int(pid), "samples": len(rows),
                      "start_mb": rows[0][1] / 1024, "warmup_end_mb": base / 1024,
                      "max_mb": max(kb for _, kb in rows) / 1024, "end_mb": after[-1] / 1024,
                      "end_drift_pct": (after[-1] - base) * 100.0 / base,
                      "max_drift_pct": drift, "flat": drift <= limit})
    return procs


def metric_values(path):
    """name{labels} value lines of a Prometheus text page -> {name: sum of values}."""
    values = {}
    if not os.path.exists(path):
        return values
    with open(path) as f:
        for row in f:
            if row.startswith("#") or not row.strip():
                continue
            name, _, value = row.rpartition(" ")
            name = name.split("{", 1)[0]
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return values


def analyze(out):
    p = read_json(os.path.join(out, "plan.json"))
    requests = p["requests"]
    limit = env("RSS_LIMIT_PCT", 5.0)
    refs_run = read_json(os.path.join(out, "results", "refs.json"))
    ref_text = {}
    for key, err, text in zip(p["refs"], refs_run["errors"], refs_run["generated_texts"]):
        if err:
            sys.exit(f"soak.py: the reference run failed for {key}: {err}")
        ref_text[key] = text
    codes, by_kind, lost, unexpected, mismatches = {}, {}, [], [], []
    server_deadlines = []
    greedy_checked = sampled_ok = draft_errors = 0
    results = 0
    per_chunk = []  # speculation per chunk: does it come back after a drafter restart?
    with open(os.path.join(out, "events.tsv")) as f:
        events = [(float(t), what.strip()) for t, what in (row.split(None, 1) for row in f)]
    # A soak stopped early is judged on the chunks it started.
    started = {int(what.split()[1]) for _, what in events if what.startswith("chunk-start")}
    chunks = [c for k, c in enumerate(p["chunks"]) if k in started]
    sent = sum(c["count"] for c in chunks)
    for chunk in chunks:
        path = os.path.join(out, "results", chunk["file"].replace(".jsonl", ".json"))
        if not os.path.exists(path):
            for r in requests[chunk["first"]:chunk["first"] + chunk["count"]]:
                lost.append({"i": r["i"], "why": "no result file (loadgen died?)"})
            continue
        run = read_json(path)
        draft_errors += run.get("draft_errors", 0)
        per_chunk.append({key: run.get(key, 0) for key in (
            "duration", "completed", "failed", "output_throughput", "draft_tokens",
            "accepted_tokens", "draft_errors")})
        errors, texts = run["errors"], run["generated_texts"]
        for k in range(chunk["count"]):
            r = requests[chunk["first"] + k]
            if k >= len(errors):
                lost.append({"i": r["i"], "why": "no record"})
                continue
            results += 1
            code = code_of(errors[k])
            name = CODES.get(code, str(code))
            codes[name] = codes.get(name, 0) + 1
            kind = ("bad_" + r["bad"] if "bad" in r else "cancel" if "cancel_after_ms" in r
                    else "deadline" if "timeout_ms" in r else "plain")
            by_kind.setdefault(kind, {})
            by_kind[kind][name] = by_kind[kind].get(name, 0) + 1
            message = errors[k].lower()
            if code == 4 and "timeout_ms" not in r:
                if message.split(":", 1)[1].strip() == "deadline exceeded":
                    # The client library's own words: no answer within REQUEST_TIMEOUT_S.
                    lost.append({"i": r["i"], "why": "no answer within the client's timeout",
                                 "error": errors[k]})
                else:
                    # The server's answer, e.g. the router's --target-step-deadline-s after the
                    # target (or the whole machine) was paused: answered, so not lost.
                    server_deadlines.append({"i": r["i"], "drafter": r["drafter"],
                                             "error": errors[k]})
            elif code in (2, 14) and any(w in message for w in TRANSPORT_WORDS):
                lost.append({"i": r["i"], "why": "connection dropped", "error": errors[k]})
            elif code != 0 and not expected(r, code):
                unexpected.append({"i": r["i"], "drafter": r["drafter"], "error": errors[k]})
            if code != 0:
                continue
            if "temperature" in r:
                sampled_ok += 1
            elif "bad" not in r:
                greedy_checked += 1
                want = ref_text[ref_key(r)]
                if texts[k] != want:
                    mismatches.append({"i": r["i"], "drafter": r["drafter"], "got": texts[k],
                                       "want": want})
    warmup_chunks = min(env("WARMUP_CHUNKS", 2), max(len(chunks) - 1, 0))
    ends = [t for t, what in events if what.startswith("chunk-end")]
    warmup_end = ends[warmup_chunks - 1] if warmup_chunks > 0 and ends else \
        min(t for t, _ in events)
    rss = rss_verdict(out, warmup_end, limit)
    leftovers = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("metrics-end"):
            m = metric_values(os.path.join(out, name))
            left = {k: m[k] for k in ("specula_num_requests_running",
                                      "specula_num_requests_waiting",
                                      "specula_kv_cache_usage_perc", "specula_drafter_sequences")
                    if m.get(k, 0) != 0}
            if left:
                leftovers[name] = left
    crashed = []
    if os.path.exists(os.path.join(out, "crashed.txt")):
        with open(os.path.join(out, "crashed.txt")) as f:
            crashed = [row.strip() for row in f if row.strip()]
    restarts = [what for _, what in events if what.startswith("drafter-restart")]
    summary = {
        "mode": p.get("mode", env("MODE", "all-in-one")), "requests": sent,
        "requests_planned": len(requests), "results": results, "chunks": len(chunks),
        "chunks_planned": len(p["chunks"]), "warmup_chunks": warmup_chunks,
        "lost": len(lost), "greedy_checked": greedy_checked, "greedy_mismatches": len(mismatches),
        "sampled_completed": sampled_ok, "unexpected_errors": len(unexpected),
        "server_deadlines": len(server_deadlines),
        "codes": codes, "codes_by_kind": by_kind, "draft_errors": draft_errors,
        "drafter_restarts": len(restarts), "per_chunk": per_chunk, "rss": rss,
        "rss_limit_pct": limit,
        "rss_max_drift_pct": max([x["max_drift_pct"] for x in rss if "max_drift_pct" in x],
                                 default=None),
        "state_left_after_idle": leftovers, "servers_died": crashed,
        "duration_s": max(t for t, _ in events) - min(t for t, _ in events),
        "lost_examples": lost[:10], "mismatch_examples": mismatches[:10],
        "unexpected_examples": unexpected[:10], "server_deadline_examples": server_deadlines[:10],
    }
    failed = []
    if lost:
        failed.append(f"{len(lost)} lost")
    if mismatches:
        failed.append(f"{len(mismatches)} greedy mismatches")
    if unexpected:
        failed.append(f"{len(unexpected)} unexpected errors")
    if crashed:
        failed.append("server died: " + "; ".join(crashed))
    if leftovers:
        failed.append(f"state left after idle: {leftovers}")
    if any(x.get("flat") is False for x in rss):
        failed.append(f"RSS drift past {limit}%")
    if not any("max_drift_pct" in x for x in rss) and len(chunks) > warmup_chunks + 1:
        failed.append("no RSS samples after the warm-up")
    summary["verdict"] = "FAIL: " + ", ".join(failed) if failed else "PASS"
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print_table(summary)
    return 1 if failed else 0


def expected(r, code):
    """Whether a request's own settings ask for this error."""
    if "cancel_after_ms" in r and code == 1:
        return True
    if "timeout_ms" in r and code == 4:
        return True
    return {"drafter": 3, "too_long": 11}.get(r.get("bad")) == code


def print_table(s):
    if s["chunks"] < s["chunks_planned"]:
        print(f"soak stopped early: {s['chunks']} of {s['chunks_planned']} chunks run "
              f"({s['requests']} of {s['requests_planned']} requests)")
    print(f"soak ({s['mode']}): {s['results']}/{s['requests']} requests answered in "
          f"{s['duration_s']:.0f} s, {s['drafter_restarts']} drafter restarts")
    print(f"  lost {s['lost']}   greedy mismatches {s['greedy_mismatches']} "
          f"(of {s['greedy_checked']} greedy completions checked)   unexpected errors "
          f"{s['unexpected_errors']}   sampled completed {s['sampled_completed']}   draft_errors "
          f"{s['draft_errors']}")
    if s["server_deadlines"]:
        print(f"  DEADLINE_EXCEEDED answered by the server to {s['server_deadlines']} requests "
              f"without a deadline of their own (not lost; e.g. a paused machine: "
              f"{s['server_deadline_examples'][0]['error'][:120]})")
    print("  status codes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["codes"].items())))
    for kind, codes in sorted(s["codes_by_kind"].items()):
        print(f"    {kind:<16}" + ", ".join(f"{k} {v}" for k, v in sorted(codes.items())))
    print("  per chunk: s / tok/s / drafted / accepted / draft_errors: " + "  ".join(
        f"{c['duration']:.0f}/{c['output_throughput']:.0f}/{c['draft_tokens']}/"
        f"{c['accepted_tokens']}/{c['draft_errors']}" for c in s["per_chunk"]))
    print(f"  RSS (MB; drift after the warm-up of {s['warmup_chunks']} chunks, limit "
          f"{s['rss_limit_pct']}%):")
    print(f"    {'process':<10} {'pid':>8} {'start':>8} {'warm-up':>8} {'max':>8} {'end':>8} "
          f"{'end %':>7} {'max %':>7}")
    for x in s["rss"]:
        if "max_drift_pct" not in x:
            print(f"    {x['role']:<10} {x['pid']:>8}  {x['note']}")
            continue
        print(f"    {x['role']:<10} {x['pid']:>8} {x['start_mb']:>8.1f} {x['warmup_end_mb']:>8.1f} "
              f"{x['max_mb']:>8.1f} {x['end_mb']:>8.1f} {x['end_drift_pct']:>+7.2f} "
              f"{x['max_drift_pct']:>7.2f}")
    for key in ("lost_examples", "mismatch_examples", "unexpected_examples"):
        for e in s[key][:3]:
            print(f"  {key[:-9]}: {json.dumps(e)[:300]}")
    if s["state_left_after_idle"]:
        print(f"  state left after idle: {s['state_left_after_idle']}")
    print(f"  verdict: {s['verdict']}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("plan", "analyze"):
        sys.exit(__doc__)
    if sys.argv[1] == "plan":
        plan(sys.argv[2])
        return 0
    return analyze(sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
