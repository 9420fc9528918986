# Attention at 1/sqrt(n) (theory.md §5, issue 5 item 3): `make attention-demo` runs the toy study
# of §5.4 (s = 4 tokens, Sigma^x = I, H = 2) over widths 4..1024 against the hierarchical limit.
.PHONY: attention-demo
attention-demo: tools
	$(BUILD)/bin/gpattention --widths=4..1024 --networks=4000 --score-samples=4000 \
	    --output=$(BUILD)/attention-demo.h5
