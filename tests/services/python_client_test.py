#!/usr/bin/python3
"""CTest: runs examples/python/generate_client.py against a live `specula serve`.

Usage: python_client_test.py SPECULA_BINARY STUBS_DIR SOURCE_DIR

Starts the server on the bundled model with an ephemeral port, runs the example client in each
mode, checks that it printed the text, the finish reason and the speculation summary, that the
streamed text equals the unary text (greedy), and that a bad request is reported with its gRPC code
and field. Then stops the server with SIGTERM and checks that it exits cleanly.
"""
import os
import re
import signal
import subprocess
import sys


def main():
    binary, stubs, source = sys.argv[1:4]
    client = os.path.join(source, "examples", "python", "generate_client.py")
    server = subprocess.Popen(
        [binary, "serve", "--model", os.path.join(source, "models", "pyllama-6m"),
         "--drafter", "ngram", "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        match = re.search(r"listening on ([^ ]+:\d+)", line)
        assert match, f"no listening line: {line!r} {server.stderr.read() if server.poll() is not None else ''}"
        target = match.group(1)

        def run(*args):
            return subprocess.run(
                ["/usr/bin/python3", client, "--target", target, "--stubs", stubs, *args],
                capture_output=True, text=True, timeout=120)

        both = run("--prompt", "import os\n", "--max-new-tokens", "24", "--drafter", "ngram")
        assert both.returncode == 0, both.stderr
        out = both.stdout
        assert "== Generate\n" in out and "== GenerateStream\n" in out, out
        unary = out.split("== Generate\n", 1)[1].split("\n[finish:", 1)[0]
        stream = out.split("== GenerateStream\n", 1)[1].split("\n[finish:", 1)[0]
        assert unary == stream, (unary, stream)
        assert unary.strip(), out
        assert out.count("[finish: FINISH_REASON_") == 2, out
        assert "drafter ngram" in out, out
        assert "model pyllama-6m" in both.stderr, both.stderr

        stopped = run("--mode", "stream", "--prompt", "def f(x):\n", "--max-new-tokens", "40",
                      "--stop", "(", "--stop", ",", "--drafter", "none")
        assert stopped.returncode == 0, stopped.stderr
        assert "FINISH_REASON_STOP_STRING" in stopped.stdout, stopped.stdout
        streamed = stopped.stdout.split("== GenerateStream\n", 1)[1].split("\n[finish:", 1)[0]
        assert streamed.strip() and "(" not in streamed and "," not in streamed, streamed

        bad = run("--drafter", "medusa")
        assert bad.returncode == 1, bad.stdout
        assert "INVALID_ARGUMENT" in bad.stderr and "speculation.drafter" in bad.stderr, bad.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert code == 0, f"server exit code {code}: {server.stderr.read()}"
    print("python client test passed")


if __name__ == "__main__":
    main()
