# notebooks/ (issue 8). `make check-notebooks`: a Python venv from the pinned
# notebooks/requirements.txt (PyPI; pip is skipped while the venv's stamp is newer than the file),
# toy-sized inputs written by the toolkit (scripts/notebook-data.sh -> $(BUILD)/notebook-data), then
# every notebook executed headless with nbclient (executed copies in $(BUILD)/notebooks); any cell
# error fails the target. Python is needed here and by `make figures` only, never by the toolkit.
PYTHON3  ?= python3
VENV     := $(BUILD)/venv
VENV_PY  := $(VENV)/bin/python
VENV_OK  := $(VENV)/.requirements.txt
NB_DATA  := $(abspath $(BUILD)/notebook-data)

$(VENV_OK): notebooks/requirements.txt scripts/python-venv.sh
	@PYTHON3=$(PYTHON3) sh scripts/python-venv.sh $(VENV) notebooks/requirements.txt

.PHONY: venv notebook-data check-notebooks
venv: $(VENV_OK)

notebook-data: tools
	@TPK_BIN=$(abspath $(BUILD)/bin) sh scripts/notebook-data.sh $(NB_DATA)

# The notebooks use the Python package too (05-gp-regression): installed into the venv first.
check-notebooks: tools $(STATIC) $(VENV_OK)
	@start=$$(date +%s); \
	TPK_BUILD=$(BUILD) $(VENV_PY) -m pip install --quiet --disable-pip-version-check \
	    --force-reinstall --no-deps ./python && \
	TPK_BIN=$(abspath $(BUILD)/bin) sh scripts/notebook-data.sh $(NB_DATA) && \
	TPK_NB_DATA=$(NB_DATA) TPK_BIN=$(abspath $(BUILD)/bin) \
	    $(VENV_PY) notebooks/run_notebooks.py $(BUILD)/notebooks; \
	rc=$$?; echo "check-notebooks: $$(($$(date +%s) - start)) s"; exit $$rc
