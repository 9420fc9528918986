# Fuzzing the NETSOR front end with libFuzzer (clang), under ASan + UBSan.
#   make fuzz             build build/fuzz_netsor and run it for FUZZ_SECONDS (default 30)
FUZZ_SECONDS ?= 30
FUZZ_SRC := tests/fuzz/fuzz_netsor.c netsor/load.c netsor/lex.c netsor/parse.c netsor/check.c netsor/elab.c \
            netsor/roll.c netsor/family.c netsor/flimit.c netsor/program.c kernels/phi.c kernels/gauss.c \
            kernels/gauss_quad.c core/error.c
# the rolled evaluator's plan runs at load; its numerical callees (GEMM, maps, the tap
# convolution) come uninstrumented from libtpk.a, which the plan never enters; libtpk's
# OpenMP (gcc's GOMP entry points) links against LLVM's libomp (libomp-dev, install-deps.sh)
.PHONY: fuzz
$(BUILD)/fuzz_netsor: $(FUZZ_SRC) $(STATIC) $(wildcard netsor/*.h kernels/*.h include/tpk/*.h) | $(DEPS_OK)
	@mkdir -p $(@D)
	clang-14 -g -O1 -std=c11 -D_XOPEN_SOURCE=700 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all -Iinclude $(FUZZ_SRC) $(STATIC) $(PKG_LIBS) -fopenmp -lz -ldl -lm -o $@
fuzz: $(BUILD)/fuzz_netsor
	@mkdir -p $(BUILD)/fuzz-corpus
	@rc=0; $(BUILD)/fuzz_netsor -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	    -print_final_stats=1 $(BUILD)/fuzz-corpus tests/fuzz/corpus >$(BUILD)/fuzz.log 2>&1 || rc=$$?; \
	    tail -n 12 $(BUILD)/fuzz.log; exit $$rc
