# python/ (issue 17): the Python package `tpk`, cffi over the public headers with libtpk.a linked in
# (python/setup.py). `make check-python`: a venv of its own ($(BUILD)/venv-python, from
# python/requirements-test.txt, pinned; PyPI), `pip install ./python` into it (which runs
# `make $(BUILD)/lib/libtpk.a` and `make python-link-flags` here), then pytest on python/tests,
# whose references are numpy recursions, never the library. Not part of `make check`: it needs
# pip and the network. The C toolkit never needs Python.
PY_VENV    := $(BUILD)/venv-python
PY_VENV_OK := $(PY_VENV)/.requirements.txt

.PHONY: python-link-flags check-python
# What a program linking libtpk.a needs after it, for setup.py (one line, the last one printed).
python-link-flags:
	@echo $(LDLIBS_ALL)

$(PY_VENV_OK): python/requirements-test.txt scripts/python-venv.sh
	@PYTHON3=$(PYTHON3) sh scripts/python-venv.sh $(PY_VENV) python/requirements-test.txt

check-python: $(STATIC) $(PY_VENV_OK)
	@start=$$(date +%s); \
	TPK_BUILD=$(BUILD) $(PY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	    --force-reinstall --no-deps ./python && \
	cd $(BUILD) && TPK_THREADS=fixed $(abspath $(PY_VENV))/bin/python -m pytest -q -p no:cacheprovider \
	    $(CURDIR)/python/tests; \
	rc=$$?; echo "check-python: $$(($$(date +%s) - start)) s"; exit $$rc
