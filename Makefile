# dpcompare: `make demo` (A/B comparison on digits) and `make test`; both set up everything first.
VENV ?= .venv
export OMPI_ALLOW_RUN_AS_ROOT ?= 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ?= 1

.PHONY: setup demo test lint bench figures docs clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/dpcompare compare --np 2 --strategies ddp,horovod --repeats auto --target-ci 5 \
	    --max-repeats 60 --time-budget 260 --workers persistent --model convnet --dataset digits --epochs 3 --out runs/demo --overwrite
	@echo "open runs/demo/report.html (one self-contained file; dpcompare report runs/demo re-renders it)"

test: setup
	$(VENV)/bin/ruff check dpcompare tests bench
	$(VENV)/bin/python -m pytest -q tests

bench: setup
	$(VENV)/bin/python bench/overhead.py

figures: setup
	VENV=$(VENV) bash scripts/figures.sh docs/timeline.png

docs: setup
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf runs build *.egg-info
