# The set-up commands of the README (make run, make test, make venv). Each creates or updates .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test test-compile test-torch test-kernels test-slurm bench golden venv

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

## make test-slurm: the depth study on a real SLURM (tests/test_slurm.py): starts a one-node cluster
## here (scripts/slurm_local.sh, which installs slurmctld, slurmd, slurm-client and munge with apt-get
## when they are missing), runs the tests against it, then stops the daemons it started, by pid
test-slurm: venv
	@out=$$(bash scripts/slurm_local.sh) || exit 1; \
	eval "$$(printf '%s\n' "$$out" | grep '^export ')"; \
	started=$$(printf '%s\n' "$$out" | sed -n 's/^# started: *//p'); \
	echo "setup: SLURM at $$SLURM_CONF (started here: $$started)"; \
	rc=0; ROUTERBENCH_REQUIRE_SLURM=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_slurm.py $(ARGS) || rc=$$?; \
	if [ -n "$$started" ] && [ "$$started" != "none" ]; then bash scripts/slurm_local.sh --stop --only "$$started"; fi; \
	exit $$rc

## make test-kernels: the Triton kernels' tests after installing the kernels extra (triton 3.7.1, the
## peers): fused against naive, opcheck and planted bugs under Triton's interpreter
## (tests/test_fused.py), the paths a GPU times and each kernel's byte model (tests/test_fused_timed.py),
## the sm_90 compile check of every autotune config (tests/test_fused_compile.py),
## and the peers under the interpreter (tests/test_peers.py, tests/test_parity.py)
KERNEL_TESTS := tests/test_fused.py tests/test_fused_timed.py tests/test_fused_compile.py tests/test_peers.py tests/test_parity.py
test-kernels: venv
	@if [ ! -f $(VENV)/.routerbench-kernels ] || [ pyproject.toml -nt $(VENV)/.routerbench-kernels ]; then \
	  echo "setup: installing the kernels extra into $(VENV)"; t0=$$(date +%s); \
	  PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e ".[kernels]" \
	    > $(VENV)/.kernels-pip.log 2>&1 || { cat $(VENV)/.kernels-pip.log; exit 1; }; \
	  $(PY) -c "import triton; print('setup: triton', triton.__version__)" && \
	  echo "setup: the kernels extra took $$(($$(date +%s) - t0)) s" && touch $(VENV)/.routerbench-kernels; fi
	TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider $(KERNEL_TESTS) $(ARGS)

## make bench: the pytest-benchmark suite (tests/benchmarks)
bench: venv
	$(PY) -m pytest tests/benchmarks --benchmark-only $(ARGS)

## make golden: rewrite tests/golden/behaviour.json (what the tiny sweep and training run record); read its git diff
golden: venv
	$(PY) -m pytest -q tests/test_golden.py --update-golden -p no:cacheprovider

## make test-torch TORCH_SPEC=torch==2.11.0: the torch-sensitive tests (routers, two-phase, lean,
## compile scopes, backends, capture guard, ops, and the fused kernels' sm_90 compile check under
## the triton that release brings) in a venv of their own for that torch release;
## ARGS=--compile-matrix adds every router x impl under both compile scopes
TORCH_SPEC ?= torch==2.11.0
TORCH_VENV ?= .venv-$(subst ==,-,$(TORCH_SPEC))
TORCH_TESTS := tests/test_routers.py tests/test_router_identities.py tests/test_two_phase.py tests/test_lean.py \
	tests/test_compile_scope.py tests/test_backends.py tests/test_guard.py tests/test_ops.py \
	tests/test_fused_compile.py
test-torch:
	@VENV=$(TORCH_VENV) TORCH_SPEC=$(TORCH_SPEC) bash scripts/setup_env.sh
	$(TORCH_VENV)/bin/python -m pytest -q -p no:cacheprovider $(TORCH_TESTS) $(ARGS)
