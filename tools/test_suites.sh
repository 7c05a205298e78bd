#!/usr/bin/env bash
# make test's CPU suites, five processes side by side so both cores of a CI machine stay busy to the end:
# attnmeta's own tests in .venv as three shards of about equal time, the engine integrations' in .venv-sglang as
# two (tools/shards.py, by tests/durations.json; by file, so a module's servers are built once, in one process).
# Each suite's log is printed whole when it failed, else its last lines, with its wall time; then the total.
# A third argument is the command that sets .venv-sglang up: it runs beside attnmeta's shards, and the
# integrations' shards start when it has ended (their wall time includes that wait).
#   tools/test_suites.sh <.venv python> <.venv-sglang python> [<command that sets .venv-sglang up>]
set -u
PY=$1 SGL_PY=$2 SETUP=${3:-true}
mkdir -p .cache
mapfile -t own < <(find tests -name 'test_*.py' -not -path 'tests/integrations/*' | sort)
mapfile -t engines < <(ls tests/integrations/test_*.py | sort)
side() {  # side <name> <command...>: in the background, its log and exit status under .cache
  local name=$1; shift
  ( start=$SECONDS; "$@" > ".cache/test-$name.log" 2>&1; rc=$?
    echo "$rc $(( SECONDS - start ))" > ".cache/test-$name.rc" ) &
}
after_setup() {  # after_setup <command...>: the command, once .venv-sglang's setup has ended well
  while [ ! -f .cache/setup-sglang.rc ]; do sleep 1; done
  read -r rc took < .cache/setup-sglang.rc
  if [ "$rc" -ne 0 ]; then echo "setting up .venv-sglang failed ($SETUP):"; cat .cache/setup-sglang.log; return 1; fi
  "$@"
}
rm -f .cache/test-*.rc .cache/test-*.log .cache/setup-sglang.*
start=$SECONDS
( s=$SECONDS; bash -c "$SETUP" > .cache/setup-sglang.log 2>&1; echo "$? $(( SECONDS - s ))" > .cache/setup-sglang.rc ) &
names=()
for k in 0 1 2; do
  mapfile -t part < <("$PY" tools/shards.py 3 $k "${own[@]}")
  side "attnmeta-$k" "$PY" -m pytest -q -p no:cacheprovider --durations=0 "${part[@]}"
  names+=("attnmeta-$k")
done
for k in 0 1; do
  mapfile -t part < <("$PY" tools/shards.py 2 $k "${engines[@]}")
  side "integrations-$k" after_setup env ATTNMETA_SGLANG_VENV=1 "$SGL_PY" -m pytest -q -p no:cacheprovider --durations=0 \
    "${part[@]}"
  names+=("integrations-$k")
done
wait
failed=0
read -r rc took < .cache/setup-sglang.rc
echo "== .venv-sglang's setup (${took}s, beside attnmeta's shards)"
for name in "${names[@]}"; do
  read -r rc took < ".cache/test-$name.rc" || { rc=1; took=?; }
  echo "== $name (${took}s; full log .cache/test-$name.log)"
  if [ "$rc" -ne 0 ]; then cat ".cache/test-$name.log"; failed=1; else grep -E "passed|failed" ".cache/test-$name.log" | tail -n 1; fi
done
echo "== the CPU suites: $(( SECONDS - start ))s"
exit $(( failed != 0 ))
