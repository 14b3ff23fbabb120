# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates the virtual environment on first use and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test clean-venv

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,c4]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/t2t demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -q tests

clean-venv:
	rm -rf $(VENV)
