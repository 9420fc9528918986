# limits/: finite-width convergence (issue 5). `make limits-demo` runs the acceptance experiment.
.PHONY: limits-demo
limits-demo: tools
	$(BUILD)/bin/gplimits --arch=mlp --depth=2 --phi=relu --widths=32..2048 --seeds=200 \
	    --output=$(BUILD)/limits-demo.h5

# Item 5 at proper size: the RMS kernel-error exponent of every architecture (deep MLPs, RNN,
# transformer, batchnorm, GRU), 128 networks per width, as a table (scripts/limits-archs.sh;
# LIMITS_SEEDS=S, LIMITS_ONLY="rnn gru" to change). About 25 min of CPU on 2 cores.
.PHONY: limits-archs
limits-archs: tools
	@sh scripts/limits-archs.sh $(BUILD) $(BUILD)/limits-archs
