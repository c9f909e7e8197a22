# Shared by the serving benchmarks: `serve NAME ARGS...` starts `$BIN/specula serve ARGS...` in the
# background (output and pid under $LOGS, which the caller creates and cleans up) and prints
# "PORT METRICS_PORT" once the server listens.
serve() {
  local name="$1"
  shift
  "$BIN/specula" serve "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" &
  echo $! >"$LOGS/$name.pid"
  for _ in $(seq 1 600); do
    if grep -q "listening on" "$LOGS/$name.out"; then
      local line
      line="$(grep "listening on" "$LOGS/$name.out")"
      echo "$(sed -E 's/.*listening on [^ ]+:([0-9]+).*/\1/' <<<"$line")" \
        "$(sed -nE 's/.*metrics on http:\/\/[^ ]+:([0-9]+).*/\1/p' <<<"$line")"
      return 0
    fi
    sleep 0.2
  done
  echo "serve: $name did not start: $(cat "$LOGS/$name.err")" >&2
  return 1
}

