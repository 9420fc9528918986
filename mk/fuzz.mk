# Fuzzing the NETSOR front end with libFuzzer (clang), under ASan + UBSan.
#   make fuzz             build build/fuzz_netsor and run it for FUZZ_SECONDS (default 30)
FUZZ_SECONDS ?= 30
FUZZ_SRC := tests/fuzz/fuzz_netsor.c netsor/load.c netsor/lex.c netsor/parse.c netsor/check.c netsor/elab.c \
            netsor/roll.c netsor/family.c netsor/flimit.c netsor/program.c kernels/phi.c kernels/gauss.c \
            kernels/gauss_quad.c core/error.c core/alloc.c
# the rolled evaluator's plan runs at load; its numerical callees (GEMM, maps, the tap
# convolution) come uninstrumented from libtpk.a, which the plan never enters; libtpk's
# OpenMP (gcc's GOMP entry points) links against LLVM's libomp (libomp-dev, install-deps.sh)
.PHONY: fuzz
$(BUILD)/fuzz_netsor: $(FUZZ_SRC) $(LIB_INTERNAL) $(wildcard netsor/*.h kernels/*.h include/tpk/*.h) | $(DEPS_OK)
	@mkdir -p $(@D)
	clang-14 -g -O1 -std=c11 -D_XOPEN_SOURCE=700 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all -Iinclude $(FUZZ_SRC) $(LIB_INTERNAL) $(PKG_LIBS) -fopenmp -lz -ldl -lm -o $@
fuzz: $(BUILD)/fuzz_netsor
	@mkdir -p $(BUILD)/fuzz-corpus
	@rc=0; $(BUILD)/fuzz_netsor -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	    -print_final_stats=1 $(BUILD)/fuzz-corpus tests/fuzz/corpus >$(BUILD)/fuzz.log 2>&1 || rc=$$?; \
	    tail -n 12 $(BUILD)/fuzz.log; exit $$rc

# Every data reader (issue 18): one libFuzzer harness per format (tests/fuzz/fuzz_reader.c built
# with its extension), seed corpora under tests/fuzz/corpus-FORMAT. HDF5 is not in the default
# list: libhdf5 1.10.8 (Debian 12) itself crashes on corrupt files within seconds of fuzzing (a
# NULL memcpy in H5F__accum_read), which tpk cannot fix; `make fuzz-all FUZZ_FORMATS=h5` runs it,
# and tpk's own HDF5 paths are covered by tests/test_catalogue.c. The HDF5 harness runs without
# leak detection and with huge allocations returning NULL: libhdf5 1.10 (uninstrumented) leaks
# inside H5Fopen of a corrupt file and asks malloc for absurd sizes while parsing one (in a
# normal build malloc fails and HDF5 reports an error) — the library's own doing, not tpk's.
#   make fuzz-all [FUZZ_SECONDS=30]   each harness for FUZZ_SECONDS; a summary line per format
#                                     (executions, coverage, new corpus) and the logs in $(BUILD)
FUZZ_FORMATS ?= npy npz csv idx tunelog
FUZZ_IO_SRC  := tests/fuzz/fuzz_reader.c core/io_read.c core/idx.c core/array.c core/error.c core/alloc.c
# Lazy (=): pkg-config runs when a fuzz target is built, after scripts/install-deps.sh, never
# while make reads this file (a fresh machine printed "Package hdf5 was not found" first).
FUZZ_FLAGS   = -g -O1 -std=c11 -D_XOPEN_SOURCE=700 -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=all -Iinclude $(PKG_CFLAGS)
FUZZ_EXT_npy := .npy
FUZZ_EXT_npz := .npz
FUZZ_EXT_csv := .csv
FUZZ_EXT_h5  := .h5
FUZZ_EXT_idx := .idx
FUZZ_EXT_tunelog := .jsonl
FUZZ_DEF_idx := -DFUZZ_IDX
FUZZ_DEF_tunelog := -DFUZZ_TUNELOG

.PHONY: fuzz-all
$(BUILD)/fuzz_reader_%: $(FUZZ_IO_SRC) tuner/log.c $(LIB_INTERNAL) $(TUNE_LIB) $(wildcard core/*.h include/tpk/*.h) | $(DEPS_OK)
	@mkdir -p $(@D)
	clang-14 $(FUZZ_FLAGS) -DFUZZ_EXT='"$(FUZZ_EXT_$*)"' $(FUZZ_DEF_$*) $(FUZZ_IO_SRC) \
	    $(if $(filter tunelog,$*),tuner/log.c $(TUNE_LIB)) $(LIB_INTERNAL) $(PKG_LIBS) -ljansson \
	    -fopenmp -lz -ldl -lm -o $@
fuzz-all: $(FUZZ_FORMATS:%=$(BUILD)/fuzz_reader_%) $(BUILD)/fuzz_netsor
	@rc=0; for f in $(FUZZ_FORMATS) netsor; do \
	    bin=$(BUILD)/fuzz_reader_$$f; seeds=tests/fuzz/corpus-$$f; \
	    [ $$f = netsor ] && bin=$(BUILD)/fuzz_netsor && seeds=tests/fuzz/corpus; \
	    mkdir -p $(BUILD)/fuzz-corpus-$$f $(BUILD)/fuzz-artifacts; \
	    leaks=1; mlim=2048; asan=; \
	    [ $$f = h5 ] && leaks=0 && mlim=1000000 && asan=allocator_may_return_null=1; \
	    ASAN_OPTIONS=$$asan $$bin -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	        -rss_limit_mb=2048 -malloc_limit_mb=$$mlim -detect_leaks=$$leaks \
	        -artifact_prefix=$(BUILD)/fuzz-artifacts/$$f- \
	        -print_final_stats=1 $(BUILD)/fuzz-corpus-$$f $$seeds >$(BUILD)/fuzz-$$f.log 2>&1 || rc=1; \
	    printf '%-8s %s\n' $$f "$$(grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|==[0-9]+==ERROR)' \
	        $(BUILD)/fuzz-$$f.log | tr '\n' ' ' | cut -c1-160)"; \
	done; exit $$rc
