# Temper: two commands.
#   make up    set everything up and start Temper on http://127.0.0.1:$${TEMPER_PORT:-8000}
#   make test  run the default test suite (make test-all: without its slow/gpu marker filter)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up install test test-all

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	bash scripts/install.sh

up: install
	bash scripts/up.sh

test: install
	bash scripts/test.sh

test-all: install
	bash scripts/test.sh -m ""
