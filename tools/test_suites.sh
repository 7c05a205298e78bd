#!/usr/bin/env bash
# make test's CPU suites, five processes side by side so both cores of a CI machine stay busy to the end:
# attnmeta's own tests in .venv as three shards of about equal time, the engine integrations' in .venv-sglang as
# two (tools/shards.py, by tests/durations.json; by file, so a module's servers are built once, in one process).
# Each suite's log is printed whole when it failed, else its last lines, with its wall time; then the total.
# A third argument names the file where a setup of .venv-sglang running beside (make test's) writes its exit status
# and seconds when it ends: the integrations' shards start then (their wall time includes that wait).
#   tools/test_suites.sh <.venv python> <.venv-sglang python> [<.venv-sglang's setup status file>]
set -u
PY=$1 SGL_PY=$2 SETUP=${3:-}
mkdir -p .cache
mapfile -t own < <(find tests -name 'test_*.py' -not -path 'tests/integrations/*' | sort)
mapfile -t engines < <(ls tests/integrations/test_*.py | sort)
side() {  # side <name> <command...>: in the background, its log and exit status under .cache
  local name=$1; shift
  ( start=$SECONDS; "$@" > ".cache/test-$name.log" 2>&1; rc=$?
    echo "$rc $(( SECONDS - start ))" > ".cache/test-$name.rc" ) &
}
after_setup() {  # after_setup <command...>: the command, once .venv-sglang's setup has ended well
  [ -z "$SETUP" ] || while [ ! -f "$SETUP" ]; do sleep 1; done
  [ -z "$SETUP" ] || read -r rc took < "$SETUP"
  if [ -n "$SETUP" ] && [ "$rc" -ne 0 ]; then
    echo "setting up .venv-sglang failed (its log: ${SETUP%.rc}.log):"; cat "${SETUP%.rc}.log"; return 1
  fi
  "$@"
}
rm -f .cache/test-*.rc .cache/test-*.log
start=$SECONDS
names=()
for k in 0 1 2; do
  mapfile -t part < <("$PY" tools/shards.py 3 $k "${own[@]}")
  [ -n "${part[0]:-}" ] || continue  # an empty shard (one empty line): pytest given no file runs every test
  side "attnmeta-$k" "$PY" -m pytest -q -p no:cacheprovider --durations=0 "${part[@]}"
  names+=("attnmeta-$k")
done
for k in 0 1; do
  mapfile -t part < <("$PY" tools/shards.py 2 $k "${engines[@]}")
  [ -n "${part[0]:-}" ] || continue
  side "integrations-$k" after_setup env ATTNMETA_SGLANG_VENV=1 "$SGL_PY" -m pytest -q -p no:cacheprovider --durations=0 \
    "${part[@]}"
  names+=("integrations-$k")
done
wait
failed=0
if [ -n "$SETUP" ]; then
  read -r rc took < "$SETUP"
  echo "== .venv-sglang's setup (${took}s from make test's start, beside .venv's and attnmeta's shards)"
fi
for name in "${names[@]}"; do
  read -r rc took < ".cache/test-$name.rc" || { rc=1; took=?; }
  echo "== $name (${took}s; full log .cache/test-$name.log)"
  if [ "$rc" -ne 0 ]; then cat ".cache/test-$name.log"; failed=1; else grep -E "passed|failed" ".cache/test-$name.log" | tail -n 1; fi
done
echo "== the CPU suites: $(( SECONDS - start ))s"
exit $(( failed != 0 ))
