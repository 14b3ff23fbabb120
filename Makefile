# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates the virtual environment on first use and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Pinned versions for a reproducible install (see the file's header); empty to resolve afresh.
CONSTRAINTS ?= constraints.txt

DEMO_DIR ?= runs/demo

.PHONY: demo finetune test test-durations lint format lock clean-venv

$(STAMP): pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test,c4]'
	touch $(STAMP)

# Pretrain the tiny preset with span corruption on the built-in corpus; rerunning resumes
# from runs/demo (delete it to start over).
demo: $(STAMP)
	$(VENV)/bin/t2t train --gin_file=gin/experiments/tiny_builtin_demo.gin \
	  --gin.MODEL_DIR="'$(DEMO_DIR)'"

# Fine-tune the demo's checkpoint on the built-in task builtin_package; reports its accuracy.
finetune: $(STAMP)
	$(VENV)/bin/t2t train --gin_file=gin/experiments/tiny_builtin_finetune.gin \
	  --gin.INIT_CHECKPOINT="'$(DEMO_DIR)'" --gin.MODEL_DIR="'$(DEMO_DIR)_package'"

# Four workers on two cores: many tests wait on a training subprocess or the storage emulator,
# and the workers beyond two keep the cores busy meanwhile (2 -> 3 workers: 22.3 -> 19.6 min on
# 2 cores; 3 -> 4, with tests/durations.json refreshed: 21.0 -> 19.0 min, 1,327 tests).
WORKERS ?= 4
# Each file's seconds go to $(VENV)/test-durations.json (not tracked): where the time went.
test: $(STAMP) lint
	$(PY) -m pytest -n $(WORKERS) --dist loadfile -q tests --record-durations=$(VENV)/test-durations.json

# The suite as `make test` runs it, recording each file's seconds into tests/durations.json,
# from which the suite orders its files (longest first) in later runs.
test-durations: $(STAMP)
	$(PY) -m pytest -n $(WORKERS) --dist loadfile -q tests --record-durations=tests/durations.json

# The formatter's check, the linter (pyflakes, pycodestyle, import order) and the layer
# contracts of docs/architecture.md (pyproject.toml's [tool.importlinter]); part of `make test`.
# `make format` rewrites the files the check would refuse.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Re-resolve the dependencies in a scratch environment and rewrite constraints.txt's pins
# (its header is kept); then run `make clean-venv test` before committing the new pins.
lock:
	rm -rf .lock-venv
	python3 -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[test,c4]'
	{ grep '^#' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude-editable \
	  | sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .lock-venv

clean-venv:
	rm -rf $(VENV)
