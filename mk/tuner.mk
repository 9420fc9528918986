# Tensor-program tuner (issue 6; tuner/README.md): link flags, gen/ from the shipped logs, and
# `make tune`.

# gen/ per-class tables are kernels: -O3 with the class's own -march (its data file's cflags, not
# this host's: BLIS make_defs per configuration), and FMA contraction, which -std=c11 turns off.
# The class index is data only: baseline flags.
class_cflags = $(shell sed -n 's/[[:space:]]*\#.*//; s/^cflags[[:space:]]*//p' data/machines/$(1).conf)
$(BUILD)/obj/gen/tpk_gemm_cpu_%.o: gen/tpk_gemm_cpu_%.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -O3 $(call class_cflags,$*) -ffp-contract=fast -MMD -MP -c $< -o $@
$(BUILD)/obj/gen/tpk_map_cpu_%.o: gen/tpk_map_cpu_%.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -O3 $(call class_cflags,$*) -ffp-contract=fast -MMD -MP -c $< -o $@

# The generator is tptune built without its library-only parts (TPTUNE_GENERATOR) and linked from
# the tuner objects alone: the library contains gen/, so generating gen/ must not need the library.
TUNE_LOGS   := $(sort $(wildcard data/tuning/*.jsonl))
TPGEN       := $(BUILD)/host/tptune-gen
TPGEN_OBJ    = $(BUILD)/host/tptune.o $(BUILD)/obj/core/error.o $(BUILD)/obj/core/clock.o \
               $(BUILD)/obj/core/io_path.o $(BUILD)/obj/core/signal.o \
               $(BUILD)/obj/runtime/ref_gemm.o $(BUILD)/obj/runtime/ref_map.o $(BUILD)/obj/runtime/shape.o \
               $(BUILD)/obj/runtime/machine.o $(TUNE_OBJ)

$(BUILD)/host/tptune.o: tools/tptune.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -DTPTUNE_GENERATOR -MMD -MP -c $< -o $@

$(TPGEN): $(TPGEN_OBJ)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDLIBS_ALL) $(TUNE_LIBS)

# gen/ from data alone: the class files and the logs, never this host (style.md §10).
gen/tpk_gemm_cpu_%.c: data/machines/%.conf $(TUNE_LOGS) $(TPGEN)
	$(TPGEN) gen --class=$< --out=$@ $(TUNE_LOGS)
$(GEN_CLASSES): $(CLASS_CONFS) $(TPGEN)
	$(TPGEN) gen --op=classes --out=$@ $(CLASS_CONFS)

# make tune: retune the shipped workloads on this machine into a fresh log, then regenerate.
# Quiet machine wanted: the measurer redoes disturbed runs but cannot create idle cores.
TUNE_TRIALS ?= 96
TUNE_SHAPES ?= 2048x2048x2048 2048x64x2048 1024x1024x1024 4096x64x4096
TUNE_THREADS ?= 1 2
TUNE_DTYPES ?= f64 f32
TUNE_OUT    ?= data/tuning/cpu-local.jsonl
.PHONY: tune
tune: tools
	@for d in $(TUNE_DTYPES); do for t in $(TUNE_THREADS); do for s in $(TUNE_SHAPES); do \
	    m=$${s%%x*}; r=$${s#*x}; n=$${r%%x*}; k=$${r#*x}; \
	    $(BUILD)/bin/tptune gemm --m=$$m --n=$$n --k=$$k --dtype=$$d --threads=$$t \
	        --trials=$(TUNE_TRIALS) --log=$(TUNE_OUT) \
	        $$([ -s $(TUNE_OUT) ] && echo --transfer=$(TUNE_OUT)) || exit 1; \
	done; done; done
	$(MAKE) $(GEN_CPU) $(GEN_CLASSES)

# CUDA: the library file and the device-check bundle (scripts/device-check.sh), both generated;
# nvcc builds them where a toolkit exists (tests/test_tune_cuda.c), never the CPU library.
GEN_CUDA    := gen/tpk_gemm_cuda.cu
GEN_CHECK   := gen/cuda-check/harness.cu
CHECK_RANDOM ?= 11
CHECK_SEED  ?= 6
lib: $(GEN_CUDA) $(GEN_CHECK)
$(GEN_CUDA): $(TUNE_LOGS) $(TPGEN)
	$(TPGEN) gen --target=cuda --out=$@ $(TUNE_LOGS)
$(GEN_CHECK): $(TPGEN)
	rm -f gen/cuda-check/k*.cu
	$(TPGEN) cuda-check --out=gen/cuda-check --trials=$(CHECK_RANDOM) --seed=$(CHECK_SEED) --repeat=10
