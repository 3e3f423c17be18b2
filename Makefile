# The two commands a new user needs: `make demo` and `make test`. Both create .venv at the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,torch,jobs,ppo]'
	touch $(STAMP)

install: $(STAMP)

# For now the main job is the placement planner on the bundled examples; the PPO job replaces it.
demo: $(STAMP)
	@for config in examples/placement/*.yaml; do \
		echo "== rlinfra plan $$config"; \
		$(BIN)/rlinfra plan $$config || exit 1; \
	done

lint: $(STAMP)
	$(BIN)/ruff check rlinfra tests benchmarks examples
	$(BIN)/ruff format --check rlinfra tests benchmarks examples

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
