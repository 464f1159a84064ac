# Two commands take a fresh Debian machine (as root) from nothing to green:
#   make demo   - the main job: crash/restore demo on a SmolLM2-135M-layout cache
#   make test   - the whole test suite
# Both install what they need first (apt packages, a venv with the package and its test tools).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvckpt-installed
TVM    := apache-tvm==0.27.0.post1

export XDG_RUNTIME_DIR ?= /tmp/kvckpt-xdg-$(shell id -u)

.PHONY: setup system-deps demo test bench clean

setup: system-deps $(STAMP)

# Mesa's lavapipe gives wgpu-py a Vulkan adapter on machines without a GPU.
system-deps:
	@if ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then \
	  echo "installing mesa-vulkan-drivers (lavapipe)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null; \
	fi
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]" "$(TVM)"
	touch $(STAMP)

demo: setup
	$(BIN)/kvckpt demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/kvckpt bench export

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
