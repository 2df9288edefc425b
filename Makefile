# Set-up on a fresh machine:  `make demo` (the whole pipeline on Fashion-MNIST)  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# The torch/torchvision pair that works on our CPU machines; GPU users install their own build.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test install data docs

demo: install data
	$(PY) cli.py demo

test: install data
	$(PY) -m pytest -q

# the docs site (mkdocs.yml) into site/; --strict: a broken link or reference fails
docs: install
	$(VENV)/bin/mkdocs build --strict

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q -e '.[test,recoloradv,docs]'
	$(PY) -m pip install -q --no-deps 'torchattacks==3.5.1'  # the attack extra without its stale requests pin
	$(PY) -m pip install -q --no-deps 'nvidia-nvimgcodec-cu13==0.9.0.20'  # its CPU backend: tests of --decode hw's decoder path
	touch $@

# Fashion-MNIST from the Debian package; without root/apt, point --data at the four idx files.
data:
	@if [ -d /usr/share/datasets/fashion-mnist ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get install -y -q dataset-fashion-mnist >/dev/null || (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null); \
	elif command -v sudo >/dev/null; then sudo apt-get install -y -q dataset-fashion-mnist; \
	else echo "Fashion-MNIST missing: install the Debian package dataset-fashion-mnist, or pass --data DIR holding its four idx files"; fi
