# `make demo` and `make test` each set everything up on a fresh machine first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch is pinned to the CPU build that CI machines carry; triton to the
# release whose CPU interpreter (TRITON_INTERPRET=1) the tests run under.
TORCH  ?= torch==2.13.0
TRITON ?= triton==3.6.0

# SGLang's released wheel, read by the tests as an independent oracle (its DSV4 metadata
# kernels run on the CPU); downloaded, never committed. Offline, those tests skip.
SGLANG ?= sglang==0.5.23
ORACLES := .cache/sglang/.downloaded

# The engine integrations' tests run against SGLang's and vLLM's real classes, in a second environment:
# SGLang pins torch 2.14.1 (its imports need torchvision), while the main one keeps the CPU torch.
# vLLM 0.33's attention-backend interface imports there as well (its wheel, --no-deps).
SGL_VENV  ?= .venv-sglang
SGL_PY    := $(SGL_VENV)/bin/python
SGL_STAMP := $(SGL_VENV)/.installed
SGL_TORCH ?= torch==2.14.1 torchvision==0.29.1
VLLM      ?= vllm==0.33.0

.PHONY: setup demo test test-slow test-sglang sglang-venv lint clean oracles disk-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "== setting up $(VENV): torch (CPU build), triton, attnmeta and its test tools"
	python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq "$(TORCH)" "$(TRITON)"
	$(PY) -m pip install -qq -e ".[dev]"
	touch $@

demo: $(STAMP)
	$(VENV)/bin/attnmeta demo

oracles: $(ORACLES)

# downloaded with the engines' venv's pip, so the two venvs can be set up side by side
$(ORACLES): | $(SGL_VENV)/bin/python
	-$(SGL_PY) -m pip download -qq --no-deps "$(SGLANG)" -d .cache/sglang && touch $@

# The CPU suites run as five processes side by side (tools/test_suites.sh), so a two-core CI machine stays busy
# to the end: attnmeta's own tests in .venv as three shards of about equal time (tests/durations.json), the engine
# integrations' in .venv-sglang as two; each prints its wall time when all have ended, then the total. .venv-sglang
# (most of a fresh machine's setup: about 2.5 min of one core) is set up in the background from the start, beside
# .venv and then beside attnmeta's shards; the integrations' shards start when it has ended. attnmeta's tests read
# SGLang's wheel (the oracles), which that setup downloads in its first seconds: they start once it is there.
test: disk-check
	@mkdir -p .cache && rm -f .cache/setup-sglang.rc
	@echo "== .venv-sglang: set up in the background (its log: .cache/setup-sglang.log)"
	@( s=$$(date +%s); $(MAKE) --no-print-directory $(SGL_STAMP) > .cache/setup-sglang.log 2>&1; \
	   echo "$$? $$(( $$(date +%s) - s ))" > .cache/setup-sglang.rc ) &
	@$(MAKE) --no-print-directory $(STAMP)
	@while [ ! -f $(ORACLES) ] && [ ! -f .cache/setup-sglang.rc ]; do sleep 1; done
	@echo "== ruff"
	$(PY) -m ruff check .
	@echo "== the CPU suites: attnmeta's (.venv, three shards) and the engine integrations' (.venv-sglang, two)"
	@bash tools/test_suites.sh $(PY) $(SGL_PY) .cache/setup-sglang.rc

sglang-venv: disk-check $(SGL_STAMP)

# Setting the venvs up needs room (about 2 GB for .venv, 9 GB for .venv-sglang while pip unpacks torch);
# a full disk otherwise surfaces as pip's OSError halfway through. Checked before anything is installed.
disk-check:
	@need=0; [ -f $(STAMP) ] || need=$$((need + 2)); [ -f $(SGL_STAMP) ] || need=$$((need + 9)); \
	  free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  if [ $$free -lt $$need ]; then \
	    echo "make: setting up the venvs needs about $$need GB free here; $$free GB are. Free some disk space and re-run." >&2; \
	    exit 1; fi

$(SGL_VENV)/bin/python:
	@echo "== setting up $(SGL_VENV) (about 7 GB): SGLang 0.5.23 and vLLM 0.33 with the torch they pin, for the"
	@echo "   integration tests, which drive attnmeta's backends through the engines' own classes"
	python3 -m venv $(SGL_VENV)
	$(SGL_PY) -m pip install -qq --upgrade pip

$(SGL_STAMP): pyproject.toml tests/integrations/requirements-sglang.txt | $(ORACLES)
	$(SGL_PY) -m pip install -qq $(SGL_TORCH)
	$(SGL_PY) -m pip install -qq --no-deps .cache/sglang/sglang-*.whl -r tests/integrations/requirements-sglang.txt
	$(SGL_PY) -m pip install -qq --no-deps "$(VLLM)"
	@# SGLang's and vLLM's GPU requirements are left out on purpose (installed --no-deps): pip's list of them is noise
	$(SGL_PY) -m pip install -qq --no-warn-conflicts -e ".[dev]"
	touch $@

test-sglang: $(SGL_STAMP)
	ATTNMETA_SGLANG_VENV=1 $(SGL_PY) -m pytest -q tests/integrations

# The slow tier, Triton's interpreter checking int32 overflow throughout, as two processes (a two-core machine: about
# 50 min; as one process it was more than two hours): the 2000-step runs per backend and the long fuzz; the variants'
# 2000-step runs and the documented commands. Logs under .cache/slow-*.log.
SLOW := ATTNMETA_TRITON_SANITIZE=1 $(PY) -m pytest -q -p no:cacheprovider -m slow --durations=10
test-slow: $(STAMP) $(ORACLES)
	@mkdir -p .cache
	@echo "== the slow tier: two processes (.cache/slow-backends.log, .cache/slow-variants.log)"
	@( $(SLOW) -k "not variants" tests/runtime/test_engine_modes.py tests/test_fuzz.py > .cache/slow-backends.log 2>&1; \
	   echo $$? > .cache/slow-backends.rc ) & \
	 $(SLOW) -k "variants or documented" tests/runtime/test_engine_modes.py tests/test_readme_commands.py \
	   > .cache/slow-variants.log 2>&1; echo $$? > .cache/slow-variants.rc; wait; \
	 failed=0; for s in backends variants; do echo "== $$s"; \
	   if [ "$$(cat .cache/slow-$$s.rc)" != 0 ]; then cat .cache/slow-$$s.log; failed=1; else tail -n 1 .cache/slow-$$s.log; fi; \
	 done; exit $$failed

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) $(SGL_VENV) .pytest_cache .cache
