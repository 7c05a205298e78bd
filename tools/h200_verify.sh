#!/usr/bin/env bash
# The GPU checks the project's claims rest on, in stages that each fit one 10-minute device call on a
# fresh H200 (tools/h200.sh sets the machine up first):
#
#   run(command="bash tools/h200.sh bash tools/h200_verify.sh tier engine", carry=[".whl", ".sgl"])
#
# Stages (each writes its log under $OUT, else /tmp/attnmeta-verify, and prints a summary line):
#   tier      the GPU tier without the SGLang tests (pytest -m cuda tests/gpu; FlashInfer MLA included), about 3
#             minutes on a warm H200, 9.5 on a fresh H100 (2026-12-08): give it a call of its own
#   engine    SGLang's real engine, every case, four at a time (tests/gpu/test_sglang_engine.py), about 4
#   sglang    attnmeta_flashinfer beside SGLang's own FlashInfer backend (test_sglang_flashinfer.py), about 3
#   sanitize  compute-sanitizer memcheck over the GPU tier, file by file (more than one call: pass test files
#             through ATTNMETA_SANITIZE_FILES to split it)
#   initrace  compute-sanitizer initcheck (kernels only, after a positive control; then whole) and racecheck over
#             the staging, guard and graph tests, about 8
#   safety    two backends on one set of engine buffers (tools/shared_buffers.py: SGLang's own and attnmeta's, triton
#             and flashinfer, pages 1 and 16, 330 steps a block), then the same under compute-sanitizer memcheck (10
#             steps a block), about 4
#   bench     tools/bench_sglang.py against SGLang's own backends, page 1, with a profile at bs 64, about 3
#   replay    SGLang's capture sequence on real graphs, and the replayed step on SGLang's own buffers against SGLang's
#             own triton and flashinfer at pages 1 and 16, TRT-LLM MHA at 16 and fa3 at 1 and 16, every step compared,
#             about 5
#   replaytree  the same for fa3 under EAGLE's defaults (topk 4: the tree verify), about 2
#   replaymla the same for FlashInfer MLA (its partition planned on the GPU) and FlashMLA, about 2
#   enginetime-a, enginetime-b  SGLang's real engine, one engine at a time: decode (triton page 1, or the kind
#             ATTNMETA_ENGINETIME_KIND names: flashinfer, fa3), EAGLE topk 1 and 4, SGLang's own backend and attnmeta's (-a SGLang's first in each pair, -b attnmeta's), each
#             timed at batches 1, 16 and 64 (median of 5 decodes of 128 tokens), about 6 each
#   engineprofile  the same engines at batch 1 (plain and EAGLE topk 4; the kind as enginetime's), with the host time of the metadata,
#             the runners' load_batch, graph launches, forwards and waits on the GPU counted
#             (tests/gpu/engine_profile.py), about 4
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/attnmeta-verify}
mkdir -p "$OUT/eng"
T0=$(date +%s)
since() { echo "$(( $(date +%s) - T0 ))s"; }
summary() { grep -E "passed|failed|ERROR SUMMARY|^E  " "$1" | tail -n 4; }

for stage in "$@"; do
  case "$stage" in
    tier)
      python3 -m pytest -q -m cuda tests/gpu -p no:cacheprovider --ignore=tests/gpu/test_sglang_engine.py \
        --ignore=tests/gpu/test_sglang_flashinfer.py > "$OUT/tier.log" 2>&1
      summary "$OUT/tier.log" ;;
    engine)
      ATTNMETA_ENGINE_OUT="$OUT/eng" python3 -m pytest -q -m cuda -n 4 tests/gpu/test_sglang_engine.py \
        -p no:cacheprovider > "$OUT/engine.log" 2>&1
      summary "$OUT/engine.log" ;;
    sglang)
      python3 -m pytest -q -m cuda tests/gpu/test_sglang_flashinfer.py -p no:cacheprovider > "$OUT/sglang.log" 2>&1
      summary "$OUT/sglang.log" ;;
    sanitize)
      # memcheck over the GPU tier (SGLang's engine runs in processes of its own: the engine stage), file by file
      for t in ${ATTNMETA_SANITIZE_FILES:-tests/gpu/test_*.py}; do
        case "$t" in *sglang_engine*) continue ;; esac
        n=$(basename "$t" .py)
        compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -q -m cuda "$t" -k "not gpu_time" \
          -p no:cacheprovider > "$OUT/memcheck_$n.log" 2>&1
        echo "$n: $(summary "$OUT/memcheck_$n.log" | tr '\n' ' ')"
      done ;;
    initrace)
      # initcheck (a read of memory nobody wrote) and racecheck over the staging, guard and graph tests.
      # initcheck's host-API check flags copy nodes inside a replayed graph whose source an earlier kernel
      # node of the same graph writes (torch's reference attention in the demo model); kernels' reads are
      # what the guard's record is about, so the kernel-only run is the verdict, after a positive control
      # shows it still catches an unwritten read
      compute-sanitizer --tool initcheck --check-api-memory-access no python3 tools/initcheck_control.py \
        > "$OUT/initcheck-control.log" 2>&1
      echo "initcheck control (must report errors): $(summary "$OUT/initcheck-control.log" | tr '\n' ' ')"
      for run in "initcheck --check-api-memory-access no" "initcheck" "racecheck"; do
        name=$(echo "$run" | tr ' ' '_' | tr -d '-')
        # shellcheck disable=SC2086
        compute-sanitizer --tool $run --print-limit 5 python3 -m pytest -q -m cuda \
          tests/gpu/test_cuda_capture_sequence.py tests/gpu/test_cuda_staging.py tests/gpu/test_cuda_graphs.py \
          -p no:cacheprovider > "$OUT/$name.log" 2>&1
        echo "$run: $(summary "$OUT/$name.log" | tr '\n' ' ')"
      done ;;
    safety)
      python3 tools/shared_buffers.py --kinds triton,flashinfer --pages 1,16 --steps 330 > "$OUT/shared.log" 2>&1
      grep -E "steps, error|BatchError|marker" "$OUT/shared.log"
      compute-sanitizer --tool memcheck --print-limit 5 python3 tools/shared_buffers.py --kinds triton,flashinfer \
        --pages 1 --steps 10 > "$OUT/shared_memcheck.log" 2>&1
      echo "memcheck: $(grep -E "steps, error|ERROR SUMMARY" "$OUT/shared_memcheck.log" | tr '\n' ' ')" ;;
    bench)
      python3 tools/bench_sglang.py --kinds triton,flashinfer,mla --pages 1 --iters 100 --profile 64 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
      grep "^|" "$OUT/bench.log" ;;
    replay)
      python3 -m pytest -q -m cuda tests/gpu/test_cuda_capture_sequence.py -p no:cacheprovider > "$OUT/replay.log" 2>&1
      summary "$OUT/replay.log"
      python3 tools/bench_sglang.py --kinds triton,flashinfer --pages 1,16 --iters 60 --json "$OUT/replay.json" \
        > "$OUT/replay-bench.log" 2>&1
      grep "^|" "$OUT/replay-bench.log"
      python3 tools/bench_sglang.py --kinds trtllm_mha --pages 16 --eagle-pages 16 --iters 40 \
        --json "$OUT/replay-trtllm.json" > "$OUT/replay-trtllm.log" 2>&1
      grep "^|" "$OUT/replay-trtllm.log" | tail -n +3
      # FlashAttention-3: SGLang's own fa3 and attnmeta_fa3 import SGLang's kernel package (its stand-in here)
      PYTHONPATH="$PWD/tests/gpu/standin${PYTHONPATH:+:$PYTHONPATH}" SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
        python3 tools/bench_sglang.py --kinds fa3 --pages 1,16 --eagle-pages 16 --iters 40 \
        --json "$OUT/replay-fa3.json" > "$OUT/replay-fa3.log" 2>&1
      grep "^|" "$OUT/replay-fa3.log" | tail -n +3 ;;
    replaytree)
      # FlashAttention-3 under EAGLE's defaults (topk 4): the tree verify and draft extend against SGLang's own fa3
      PYTHONPATH="$PWD/tests/gpu/standin${PYTHONPATH:+:$PYTHONPATH}" SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
        python3 tools/bench_sglang.py --kinds fa3-tree --pages 16 --sizes 8 --eagle-pages 1,16 --iters 40 \
        --json "$OUT/replay-tree.json" > "$OUT/replay-tree.log" 2>&1
      grep "^|" "$OUT/replay-tree.log" | tail -n +3 ;;
    replaymla)
      python3 tools/bench_sglang.py --kinds mla-device,flashmla --pages 1 --iters 40 --json "$OUT/replay-mla.json" \
        > "$OUT/replay-mla.log" 2>&1
      grep "^|" "$OUT/replay-mla.log" ;;
    enginetime-a|enginetime-b)
      # one engine at a time, each timed at batches 1, 16 and 64 (REPS decodes of 128 tokens after a warm
      # one), after a warm-up engine; -a runs SGLang's own backend first in each pair, -b attnmeta's
      export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
      export PYTHONPATH="$PWD/tests/gpu/standin${PYTHONPATH:+:$PYTHONPATH}"
      export ATTNMETA_ENGINE_BATCHES=1,16,64 ATTNMETA_ENGINE_REPS=5
      k=${ATTNMETA_ENGINETIME_KIND:-triton}  # or flashinfer, fa3
      # ATTNMETA_ENGINETIME_PAIRS picks pairs by their topk suffix ("plain 1 4", the default; a whole run of one
      # order is about 7 engines, past one 10-minute device call: split it, e.g. "plain 1" then "4")
      pairs=""
      for t in ${ATTNMETA_ENGINETIME_PAIRS:-plain 1 4}; do
        if [ "$t" = plain ]; then pairs="$pairs $k:1,attnmeta_$k:1"; else pairs="$pairs $k:1:$t,attnmeta_$k:1:$t"; fi
      done
      order=""
      for p in $pairs; do
        a=${p%,*}; b=${p#*,}
        if [ "$stage" = enginetime-a ]; then order="$order $a $b"; else order="$order $b $a"; fi
      done
      f="$OUT/$stage-$k.json"
      # the first engine of a call runs plain decode about a third slower whichever it is: one thrown away first
      # shellcheck disable=SC2086
      first=${order# }
      ATTNMETA_ENGINE_WARMUP="${first%% *}" python3 tests/gpu/sglang_engine.py "$f" $order > "$f.log" 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1]))
for k, v in d.items():
    print(k, v.get('error', ''), {b: (t['tok_per_s'], t['step_ms'], t.get('round_ms')) for b, t in v.get('timed', {}).items()})" "$f" ;;
    engineprofile)
      # where the host time of a decode step and an EAGLE round goes (tests/gpu/engine_profile.py), batch 1,
      # SGLang's own triton and attnmeta_triton, plain decode and EAGLE topk 4
      export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
      export PYTHONPATH="$PWD/tests/gpu/standin${PYTHONPATH:+:$PYTHONPATH}"
      export ATTNMETA_ENGINE_BATCHES=${ATTNMETA_ENGINE_BATCHES:-1} ATTNMETA_ENGINE_REPS=5
      export ATTNMETA_ENGINE_PROFILE="$OUT/eng/profile"
      f="$OUT/engineprofile.json"
      k=${ATTNMETA_ENGINETIME_KIND:-triton}
      # ATTNMETA_ENGINEPROFILE_CASES: a subset (default: both backends, EAGLE topk 4 and plain decode)
      # shellcheck disable=SC2086
      python3 tests/gpu/sglang_engine.py "$f" ${ATTNMETA_ENGINEPROFILE_CASES:-$k:1:4 attnmeta_$k:1:4 $k:1 attnmeta_$k:1} \
        > "$f.log" 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1]))
for k, v in d.items():
    print(k, v.get('error', ''), {b: (t['step_ms'], t.get('round_ms'), t.get('rounds')) for b, t in v.get('timed', {}).items()})
    for pid, p in v.get('profile', {}).items():
        if p['after_mark']: print('   ', pid, p['after_mark'], '\n    waits from', p.get('sync_sites'), '\n    staged', p.get('staged'))" "$f" ;;
    *)
      echo "unknown stage $stage: tier, engine, sglang, sanitize, initrace, bench, replay, replaymla, enginetime-a, enginetime-b or engineprofile" >&2; exit 2 ;;
  esac
  echo "== $stage done at $(since)"
done
