# GP regression (issue 7): `make fashion` runs NNGP regression on Fashion-MNIST (first 10 000 train,
# first 10 000 test images), ReLU and erf at depths 1..8 and an RBF baseline, noise by the training
# marginal likelihood; installs Debian's dataset-fashion-mnist if missing. Results in $(BUILD)/fashion.
.PHONY: fashion
FASHION_OUT ?= $(BUILD)/fashion

fashion: $(BUILD)/bin/gpregress
	@sh scripts/fashion.sh $(BUILD)/bin/gpregress $(FASHION_OUT)
