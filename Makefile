# The two commands a new user needs: `make demo` and `make test`. Both create .venv at the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,torch,jobs,ppo,grpo]'
	touch $(STAMP)

install: $(STAMP)

# The main job: PPO on CartPole, placed by the disaggregated config on an embedded Ray with two
# simulated nodes; prints the placement map, a progress bar, and where the learning curve is.
demo: $(STAMP)
	$(BIN)/rlinfra run examples/ppo_cartpole/disaggregated.yaml

lint: $(STAMP)
	$(BIN)/ruff check rlinfra tests benchmarks examples
	$(BIN)/ruff format --check rlinfra tests benchmarks examples
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
