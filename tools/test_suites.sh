#!/usr/bin/env bash
# make test's CPU suites, four processes side by side so both cores of a CI machine stay busy to the end:
# attnmeta's runtime tests and the rest of its own in .venv, the engine integrations' in .venv-sglang as two halves
# (by file: a module's servers are built once, in one process). The main suite prints as it runs; each side
# suite's log is printed whole when it failed, else its last lines; every suite's wall time is printed.
#   tools/test_suites.sh <.venv python> <.venv-sglang python>
set -u
PY=$1 SGL_PY=$2
mkdir -p .cache
mapfile -t files < <(ls tests/integrations/test_*.py | sort)
half=$(( ${#files[@]} / 2 ))
side() {  # side <name> <command...>: in the background, its log and exit status under .cache
  local name=$1; shift
  ( start=$SECONDS; "$@" > ".cache/test-$name.log" 2>&1; rc=$?
    echo "$rc $(( SECONDS - start ))" > ".cache/test-$name.rc" ) &
}
rm -f .cache/test-*.rc
side runtime "$PY" -m pytest -q -p no:cacheprovider tests/runtime
side integrations-1 env ATTNMETA_SGLANG_VENV=1 "$SGL_PY" -m pytest -q -p no:cacheprovider "${files[@]:0:half}"
side integrations-2 env ATTNMETA_SGLANG_VENV=1 "$SGL_PY" -m pytest -q -p no:cacheprovider "${files[@]:half}"
start=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider --ignore=tests/runtime; failed=$?
echo "== the main suite: ${SECONDS}s from the start ($(( SECONDS - start ))s)"
wait
for name in runtime integrations-1 integrations-2; do
  read -r rc took < ".cache/test-$name.rc" || { rc=1; took=?; }
  echo "== $name (${took}s; full log .cache/test-$name.log)"
  if [ "$rc" -ne 0 ]; then cat ".cache/test-$name.log"; failed=1; else tail -n 3 ".cache/test-$name.log"; fi
done
exit $(( failed != 0 ))
