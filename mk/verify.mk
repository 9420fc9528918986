# Exact verification of the generated kernels (issue 20 items 3-4; tuner/README.md "Exact
# verification"): every shipped kernel of the classes this CPU runs, then the mutation suite,
# whose last line is `caught K/N`. Minutes of compiling: neither `make check` nor CI runs it.
VERIFY_MUTANTS ?= 200
VERIFY_SEED    ?= 1
.PHONY: verify-kernels
verify-kernels: tools
	$(BUILD)/bin/tptune verify --mutants=$(VERIFY_MUTANTS) --seed=$(VERIFY_SEED)
