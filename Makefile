# The two set-up-and-go commands of the README. Each creates or updates .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test test-compile test-torch bench golden venv

venv:
	@VENV=$(VENV) bash scripts/setup_env.sh

## make run: the default cost suite for this device + a short time-to-target race + report
run: venv
	$(VENV)/bin/routerbench run $(ARGS)

## make test: the test suite (fails when pytest collects no test)
test: venv
	$(PY) -m pytest -q $(ARGS)

## make test-compile: the compile tests with the full router x impl matrix (cold: ~9 min on 2 CPU cores)
test-compile: venv
	$(PY) -m pytest -q -m compile --compile-matrix $(ARGS)

## make bench: the pytest-benchmark suite (tests/benchmarks)
bench: venv
	$(PY) -m pytest tests/benchmarks --benchmark-only $(ARGS)

## make golden: rewrite tests/golden/behaviour.json (what the tiny sweep and training run record); read its git diff
golden: venv
	$(PY) -m pytest -q tests/test_golden.py --update-golden -p no:cacheprovider

## make test-torch TORCH_SPEC=torch==2.11.0: the torch-sensitive tests (routers, two-phase, lean,
## compile scopes, backends, capture guard, ops) in a venv of their own for that torch release;
## ARGS=--compile-matrix adds every router x impl under both compile scopes
TORCH_SPEC ?= torch==2.11.0
TORCH_VENV ?= .venv-$(subst ==,-,$(TORCH_SPEC))
TORCH_TESTS := tests/test_routers.py tests/test_router_identities.py tests/test_two_phase.py tests/test_lean.py \
	tests/test_compile_scope.py tests/test_backends.py tests/test_guard.py tests/test_ops.py
test-torch:
	@VENV=$(TORCH_VENV) TORCH_SPEC=$(TORCH_SPEC) bash scripts/setup_env.sh
	$(TORCH_VENV)/bin/python -m pytest -q -p no:cacheprovider $(TORCH_TESTS) $(ARGS)
