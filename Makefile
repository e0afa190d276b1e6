# dpcompare: `make demo` (A/B comparison on digits), `make lab-demo` (the same across 2 emulated hosts on a
# shaped link) and `make test`; all set up what they need first: `make setup` what the demo needs (torch,
# dpcompare's dependencies, Horovod built for this machine), `make setup-dev` that plus the dev extras (tests,
# lint, docs, trackers, transformers) for `make test` and `make docs`.
VENV ?= .venv
export OMPI_ALLOW_RUN_AS_ROOT ?= 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ?= 1
# `make test` runs the suite on 2 pytest-xdist workers (TEST_WORKERS=0: in one process) (tests/conftest.py's
# XDIST_GROUPS keeps the Slurm, lab and trained-convnet modules on one worker each). Tests marked `solitary`
# (test_load: they count every other process's CPU, a second worker included) run afterwards, alone.
TEST_WORKERS ?= 2

.PHONY: setup setup-dev demo lab-demo test lint bench figures remeasure docs clean

setup:
	@bash scripts/setup.sh

setup-dev:
	@DPCOMPARE_EXTRAS=dev bash scripts/setup.sh

# --bind comm: each rank's communication thread on a core of its own and MPI's waits yielding (the ranks
# themselves stay where the scheduler puts them, as Horovod advises): steadier runs, so ±5 % comes sooner.
demo: setup
	$(VENV)/bin/dpcompare compare --np 2 --strategies ddp,horovod --bind comm --repeats auto --target-ci 5 \
	    --max-repeats 40 --time-budget 150 --workers persistent --model convnet --dataset digits --epochs 3 --out runs/demo --overwrite
	@echo "open runs/demo/report.html (one self-contained file; dpcompare report runs/demo re-renders it)"

# Across 2 emulated hosts (network namespaces) on a 1 Gbit/s link: the mlp's 17 MB of gradients per step cross
# the link, so communication decides the verdict. Needs root, iproute2 and the tbf qdisc (docs/lab.md).
lab-demo: setup
	$(VENV)/bin/dpcompare compare --np 2 --strategies ddp,horovod --lab hosts=2,link=1gbit,name=demo \
	    --repeats auto --target-ci 2 --max-repeats 30 --time-budget 240 --model mlp --width 2048 --dataset digits \
	    --epochs 1 --max-steps 20 --min-steps 15 --warmup-steps 3 --out runs/lab-demo --overwrite
	@echo "open runs/lab-demo/report.html; the same across links: add --sweep link=unlimited,1gbit,200mbit"

test: setup-dev
	$(VENV)/bin/ruff check dpcompare tests bench examples
	@# bytecode written once: where PYTHONDONTWRITEBYTECODE is set, every rank the tests start would compile again
	$(VENV)/bin/python -m compileall -q dpcompare tests bench examples
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) -m 'not solitary' tests
	$(VENV)/bin/python -m pytest -q -m solitary tests

bench: setup
	$(VENV)/bin/python bench/overhead.py

figures: setup
	VENV=$(VENV) bash scripts/figures.sh docs/timeline.png

# Every figure the docs quote, measured again (on a quiet machine: bench/quiet.sh waits for one): bench/remeasure.sh
remeasure: setup
	VENV=$(VENV) bash bench/remeasure.sh

docs: setup-dev
	$(VENV)/bin/python scripts/cli_doc.py --check   # docs/cli.md is generated: python scripts/cli_doc.py
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf runs build *.egg-info
