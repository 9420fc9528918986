# limits/: finite-width convergence (issue 5). `make limits-demo` runs the acceptance experiment.
.PHONY: limits-demo
limits-demo: tools
	$(BUILD)/bin/gplimits --arch=mlp --depth=2 --phi=relu --widths=32..2048 --seeds=200 \
	    --output=$(BUILD)/limits-demo.h5
