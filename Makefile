# tpk — Tensor Programs toolkit. GNU make; C11.
#   make            library + command-line programs (installs missing Debian packages first)
#   make run        main job: gpkernel --arch=transformer on the bundled demo tokens
#   make check      whole test suite      make check-asan   the same under ASan+UBSan
#   make bench      benchmarks (not tests) make install PREFIX=...
VERSION    := 0.1.0
BUILD      ?= build
PREFIX     ?= /usr/local
CC         := gcc
NVCC       ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) nvcc)

PKGS       := hdf5 gsl fftw3 lapacke openblas nettle
# Lazy (=) so that pkg-config runs after scripts/install-deps.sh has had its chance.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
# GSL's pkg-config pulls in its reference CBLAS; we link OpenBLAS's instead.
PKG_LIBS   = $(filter-out -lgslcblas,$(shell pkg-config --libs $(PKGS))) -lhdf5_serial_hl -lm

WARN       := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
OPT        ?= -O2 -g
SAN        ?=
CFLAGS_ALL  = -std=c11 $(OPT) $(SAN) $(WARN) -fopenmp -fPIC -fvisibility=hidden \
              -D_XOPEN_SOURCE=700 -DTPK_VERSION='"$(VERSION)"' -Iinclude $(PKG_CFLAGS) $(CFLAGS)
# Only kernel objects get -march (style.md §9, BLIS): the framework is built for the baseline.
# ARCH=x86-64-v3 (or any -march value) builds kernels/ for that CPU level instead of this host;
# the generated tables of each machine class are compiled with that class's own flags
# (data/machines/ID.conf "cflags") and chosen at run time by CPUID, so a portable build runs on
# every CPU of level ARCH and still uses AVX-512 where the CPU has it (tuner-notes §7).
ARCH       ?= native
KERNEL_FLAGS := -march=$(ARCH) -O3
LDLIBS_ALL  = $(SAN) -fopenmp $(PKG_LIBS) -lz -ldl $(LDFLAGS)

# The layers, bottom up (mk/layers.txt; scripts/check-layers.sh checks them in `make check`).
LIB_DIRS   := core runtime kernels netsor app limits gp
# gen/: the class index and, per machine class (data/machines/ID.conf), its GEMM and map tables,
# all generated from data (mk/tuner.mk, mk/map.mk).
CLASS_CONFS := $(sort $(wildcard data/machines/*.conf))
CLASS_IDS   := $(CLASS_CONFS:data/machines/%.conf=%)
GEN_CLASSES := gen/tpk_classes.c
GEN_CPU     := $(CLASS_IDS:%=gen/tpk_gemm_cpu_%.c)
GEN_MAP     := $(CLASS_IDS:%=gen/tpk_map_cpu_%.c)
LIB_SRC    := $(sort $(wildcard $(addsuffix /*.c,$(LIB_DIRS))) $(GEN_CLASSES) $(GEN_CPU) $(GEN_MAP))
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# Every tools/*.c is a program, but tools/cli.c: the helpers they share, linked into each.
TOOL_CLI   := $(BUILD)/obj/tools/cli.o
TOOL_SRC   := $(filter-out tools/cli.c,$(wildcard tools/*.c))
TOOLS      := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
TEST_SRC   := $(wildcard tests/test_*.c)
TESTS      := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Helpers every test program links (tests/support/testutil.h).
TEST_SUPPORT := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/*.c))
BENCH_SRC  := $(wildcard bench/*.c)
BENCHES    := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
STATIC     := $(BUILD)/lib/libtpk.a
SHARED     := $(BUILD)/lib/libtpk.so
# The tuner is an offline library of its own (XGBoost, the compiler, measurement): only tptune, the
# gen/ generator, and the tests and benchmarks of the tuner link it; libtpk does not.
TUNE_SRC   := $(sort $(wildcard tuner/*.c))
TUNE_OBJ   := $(TUNE_SRC:%.c=$(BUILD)/obj/%.o)
TUNE_LIB   := $(BUILD)/lib/libtpktune.a
TUNE_LIBS  := -lxgboost -ljansson
DEPS_OK    := $(BUILD)/.deps-ok

.PHONY: all lib tools tests run check check-asan check-portable bench install deps clean fuzz
# Keep the objects of programs and tests (make would delete them as intermediates and rebuild).
.SECONDARY:
all: lib tools

deps: $(DEPS_OK)
$(DEPS_OK): scripts/install-deps.sh
	@sh scripts/install-deps.sh
	@mkdir -p $(@D) && touch $@

lib: $(STATIC) $(SHARED) $(TUNE_LIB)
tools: $(TOOLS)
tests: $(TESTS)

$(BUILD)/obj/kernels/%.o: kernels/%.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(KERNEL_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/bench/%.o: bench/%.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(KERNEL_FLAGS) -fno-math-errno -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(TUNE_LIB): $(TUNE_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(TOOL_CLI) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TOOL_CLI) $(STATIC) $(LDLIBS_ALL)

$(BUILD)/bin/tptune: $(BUILD)/obj/tools/tptune.o $(TUNE_LIB) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TUNE_LIB) $(STATIC) $(LDLIBS_ALL) $(TUNE_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT) $(TUNE_LIB) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TEST_SUPPORT) $(TUNE_LIB) $(STATIC) $(LDLIBS_ALL) $(TUNE_LIBS) -lcmocka

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(TUNE_LIB) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TUNE_LIB) $(STATIC) $(LDLIBS_ALL) $(TUNE_LIBS)

# Main job (the design card's headline): the infinite-width kernel of the Tensor Programs I
# transformer on the bundled demo token sequences, written to HDF5.
run: tools
	$(BUILD)/bin/gpkernel --arch=transformer --all-times --output=$(BUILD)/demo-transformer.h5

check: tools tests
	@TPK_BIN=$(abspath $(BUILD)/bin) TPK_ROOT=$(CURDIR) sh scripts/run-tests.sh $(TESTS)

# Sanitizer suite: a separate build tree so the optimised build is untouched.
check-asan: $(DEPS_OK)
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" check

# The portable build (ARCH=x86-64-v3, build-v3/) under qemu-x86_64 -cpu Haswell against this one.
check-portable: $(DEPS_OK)
	@sh scripts/check-portable.sh

bench: tools $(BENCHES) $(NT_VENV_OK)
	@sh scripts/run-bench.sh $(BUILD)
	@sh scripts/bench-rolled.sh $(BUILD)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/tpk $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(STATIC) $(SHARED) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/tpk/*.h $(DESTDIR)$(PREFIX)/include/tpk/
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/share/tpk/programs $(DESTDIR)$(PREFIX)/share/tpk/data
	install -m 644 programs/*.nsr $(DESTDIR)$(PREFIX)/share/tpk/programs/
	install -m 644 data/demo-* $(DESTDIR)$(PREFIX)/share/tpk/data/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' tpk.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpk.pc

clean:
	rm -rf build build-asan build-v3

# Module fragments (targets of the tuner, GP regression, figures, ...) live in mk/*.mk.
-include $(sort $(wildcard mk/*.mk))

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
