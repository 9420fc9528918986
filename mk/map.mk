# Tuned ReLU NNGP map (issue 6, tuner/cpu_map.c): gen/tpk_map_cpu_ID.c per machine class from the shipped logs, and
# libmvec for its vector acos / atan2 variants. (Read before mk/tuner.mk: names spelled out.)
LDFLAGS  += -lmvec
MAP_LOGS := $(sort $(wildcard data/tuning/*.jsonl))

gen/tpk_map_cpu_%.c: data/machines/%.conf $(MAP_LOGS) $(BUILD)/host/tptune-gen
	$(BUILD)/host/tptune-gen gen --op=map --class=$< --out=$@ $(MAP_LOGS)

# make tune-map: retune the shipped map workloads on this machine into a fresh log, then regenerate.
TUNE_MAP_TRIALS ?= 48
TUNE_MAP_N      ?= 1024 4096
TUNE_MAP_OUT    ?= data/tuning/cpu-local-map.jsonl
.PHONY: tune-map
tune-map: tools
	@for d in f64 f32; do for t in 1 2; do for n in $(TUNE_MAP_N); do \
	    $(BUILD)/bin/tptune map --n=$$n --dtype=$$d --threads=$$t --trials=$(TUNE_MAP_TRIALS) \
	        --log=$(TUNE_MAP_OUT) || exit 1; \
	done; done; done
	$(MAKE) $(GEN_MAP)
