# The two commands README starts with.
PY ?= python3
LAB_GPUS ?= 4xP40,8xP40,1xP100,2xH200

.PHONY: demo test lint lab-up lab-down bench

test: lint
	$(PY) -m pytest -q -ra

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

demo:
	$(PY) -m p40lab.demo --gpus $(LAB_GPUS)

lab-up:
	$(PY) -m p40lab up --gpus $(LAB_GPUS)

lab-down:
	$(PY) -m p40lab down

bench:
	$(PY) benchmarks/bench_lab.py
