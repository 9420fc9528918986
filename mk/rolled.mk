# bench/rolled (issue 14): the acceptance measurements side by side in one run, whole processes:
# gpkernel's transformer against an independent numpy recursion, its cnn2d against
# neural-tangents, and netsor check of the transformer at T = 2000, L = 24 (scripts/bench-rolled.sh).
# `make bench-rolled` (full size, minutes), `make bench-rolled TOY=1` (tiny sizes, about 10 s once
# the venv exists), STRICT=1 to fail unless every bar is met. Python only here: a venv of its own
# ($(BUILD)/venv-nt from the pinned bench/rolled/requirements.txt; PyPI; neural-tangents pulls in
# TensorFlow through tf2jax, about 2.6 GB), never needed by the toolkit or by `make check`.
NT_VENV    := $(BUILD)/venv-nt
NT_VENV_OK := $(NT_VENV)/.requirements.txt

$(NT_VENV_OK): bench/rolled/requirements.txt scripts/python-venv.sh
	@PYTHON3=$(PYTHON3) sh scripts/python-venv.sh $(NT_VENV) bench/rolled/requirements.txt

# The toolkit's own Python package goes into the same venv (cffi over libtpk.a, as check-python
# installs it), so item (e) times tpk.kernel in neural-tangents' process beside its compiled call.
.PHONY: bench-rolled
bench-rolled: tools $(STATIC) $(NT_VENV_OK)
	@TPK_BUILD=$(BUILD) $(NT_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	    --force-reinstall --no-deps ./python
	@sh scripts/bench-rolled.sh $(BUILD) $(if $(TOY),--toy) $(if $(STRICT),--strict)
