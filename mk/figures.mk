# paper-figures/ (issue 8). `make figures` reruns the toolkit and regenerates each reproduced
# figure (PNG, PDF, plotted data as HDF5, commands) and the table in paper-figures/README.md.
#   make figures                quick (minutes, fewer seeds and trials)
#   make figures FULL=1         paper-sized runs (more seeds, trials; make fashion's 10 000 images)
#   make figures ONLY=tp1-fig3  one figure (python3 paper-figures/make_figures.py --list)
# Uses the venv of mk/notebooks.mk ($(BUILD)/venv, pinned notebooks/requirements.txt).
.PHONY: figures
figures: tools $(BUILD)/venv/.requirements.txt
	@start=$$(date +%s); \
	$(BUILD)/venv/bin/python paper-figures/make_figures.py --bin=$(abspath $(BUILD)/bin) \
	    $(if $(FULL),--full) $(if $(ONLY),--only=$(ONLY)); rc=$$?; \
	echo "figures: $$(($$(date +%s) - start)) s"; exit $$rc
