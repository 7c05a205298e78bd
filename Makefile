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

.PHONY: setup demo test test-slow lint clean oracles

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "$(TRITON)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: $(STAMP)
	$(VENV)/bin/attnmeta demo

oracles: $(ORACLES)

$(ORACLES): | $(STAMP)
	-$(PY) -m pip download -q --no-deps "$(SGLANG)" -d .cache/sglang && touch $@

test: $(STAMP) $(ORACLES)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-slow: $(STAMP) $(ORACLES)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .cache
