# tpk — Tensor Programs toolkit. GNU make; C11.
#   make            library + command-line programs (installs missing Debian packages first)
#   make run        main job: gpkernel --arch=transformer on the bundled demo tokens
#   make check      whole test suite      make check-asan   the same under ASan+UBSan
#   make bench      benchmarks (not tests) make install PREFIX=... (DESTDIR, LIBDIR, ...)
#   make docs       API reference (Doxygen)  make man   manual pages (help2man)
#   make debug      portable -O1 -g build for gdb/valgrind (build-debug/)  make check-valgrind
# The version is include/tpk/version.h's (one place); the SONAME follows its major number.
VERSION    := $(shell sed -n 's/^\#define TPK_VERSION_STRING "\(.*\)"/\1/p' include/tpk/version.h)
VERSION_MAJOR := $(firstword $(subst ., ,$(VERSION)))
BUILD      ?= build
# Install locations (GNU conventions; DESTDIR is prepended to all of them for staged installs).
# The tools find their programs/ and data/ at BINDIR/../share/tpk, so DATADIR follows PREFIX.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    := $(PREFIX)/share
MANDIR     ?= $(DATADIR)/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
CC         := gcc
NVCC       ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) nvcc)

# HDF5's flavour: Debian installs the serial and the MPI builds side by side and points hdf5.pc
# at the MPI one once libhdf5-openmpi-dev is in (`make mpi`), so the serial flavour is asked for
# by name where it exists (mk/mpi.mk compiles the library's HDF5 callers again for the other).
# The probe is quiet: before install-deps has run, pkg-config itself may be missing.
HDF5_PC     = $(if $(shell pkg-config --exists hdf5-serial 2>/dev/null && echo y),hdf5-serial,hdf5)
PKGS_NOH5  := gsl fftw3 lapacke nettle
PKGS        = $(HDF5_PC) $(PKGS_NOH5)
# OpenBLAS: its OpenMP build where Debian has it (libopenblas-openmp-dev), else whatever the
# `openblas` pkg-config module names. The pthread build's workers spin on sched_yield for ~0.1 s
# at start-up and after each call, and on two cores take a core from the OpenMP loops beside
# them (gpkernel --arch=transformer, 2 × 1000 tokens: 0.16–0.35 s over 11 runs with it,
# 0.16–0.20 s with the OpenMP build). libopenblas.so.0 resolves to Debian's alternative (the
# pthread build) unless the run path names the OpenMP one.
OPENBLAS_OMP = $(patsubst %/pkgconfig/openblas.pc,%,$(firstword $(wildcard /usr/lib/*/openblas-openmp/pkgconfig/openblas.pc)))
BLAS_PC    = $(if $(OPENBLAS_OMP),PKG_CONFIG_PATH=$(OPENBLAS_OMP)/pkgconfig )pkg-config
BLAS_LIBS  = $(shell $(BLAS_PC) --libs openblas)$(if $(OPENBLAS_OMP), -Wl$(comma)-rpath$(comma)$(OPENBLAS_OMP))
comma     := ,
# Lazy (=) so that pkg-config runs after scripts/install-deps.sh has had its chance.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS)) $(shell $(BLAS_PC) --cflags openblas)
# GSL's pkg-config pulls in its reference CBLAS; we link OpenBLAS's instead (first: the BLAS
# symbols of every library after it resolve to it).
PKG_LIBS   = $(BLAS_LIBS) $(filter-out -lgslcblas,$(shell pkg-config --libs $(PKGS))) -lhdf5_serial_hl $(CBC_LIBS) -lm
# COIN-OR CBC (orch/blp.c, its C interface; the header is included as <coin/...>): pkg-config's
# flags where cbc.pc exists, less -lblas/-llapack, which would name a second BLAS beside OpenBLAS
# (CBC's own libraries load the LAPACK they need).
CBC_LIBS   = $(filter-out -lblas -llapack,$(shell pkg-config --libs cbc 2>/dev/null || \
                 echo -lCbcSolver -lCbc -lCgl -lOsiClp -lClp -lOsi -lCoinUtils))

WARN       := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
OPT        ?= -O2 -g
SAN        ?=
CFLAGS_BASE = -std=c11 $(OPT) $(SAN) $(WARN) -fopenmp -fPIC -fvisibility=hidden \
              -D_XOPEN_SOURCE=700 -DTPK_VERSION='"$(VERSION)"' -Iinclude
CFLAGS_ALL  = $(CFLAGS_BASE) $(PKG_CFLAGS) $(CFLAGS)
# Only kernel objects get -march (style.md §9, BLIS): the framework is built for the baseline.
# ARCH=x86-64-v3 (or any -march value) builds kernels/ for that CPU level instead of this host;
# the generated tables of each machine class are compiled with that class's own flags
# (data/machines/ID.conf "cflags") and chosen at run time by CPUID, so a portable build runs on
# every CPU of level ARCH and still uses AVX-512 where the CPU has it (tuner-notes §7).
ARCH       ?= native
KERNEL_FLAGS := -march=$(ARCH) -O3
LDLIBS_ALL  = $(SAN) -fopenmp $(PKG_LIBS) -lz -ldl $(LDFLAGS)

# The layers, bottom up (mk/layers.txt; scripts/check-layers.sh checks them in `make check`).
LIB_DIRS   := core runtime orch kernels netsor app limits gp
# gen/: the class index and, per machine class (data/machines/ID.conf), its GEMM and map tables,
# all generated from data (mk/tuner.mk, mk/map.mk).
CLASS_CONFS := $(sort $(wildcard data/machines/*.conf))
CLASS_IDS   := $(CLASS_CONFS:data/machines/%.conf=%)
GEN_CLASSES := gen/tpk_classes.c
GEN_CPU     := $(CLASS_IDS:%=gen/tpk_gemm_cpu_%.c)
GEN_MAP     := $(CLASS_IDS:%=gen/tpk_map_cpu_%.c)
LIB_SRC    := $(sort $(wildcard $(addsuffix /*.c,$(LIB_DIRS))) $(GEN_CLASSES) $(GEN_CPU) $(GEN_MAP))
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# Every tools/*.c is a program, but tools/cli.c: the helpers they share, linked into each, and
# tools/cli_kernel.c, tools/cli_gpregress.c: gpkernel's and gpregress's command lines, which
# gpkernel-mpi and gpregress-mpi (mk/mpi.mk) share.
TOOL_CLI   := $(BUILD)/obj/tools/cli.o
TOOL_CLI_KERNEL := $(BUILD)/obj/tools/cli_kernel.o
TOOL_CLI_GPREGRESS := $(BUILD)/obj/tools/cli_gpregress.o
TOOL_SRC   := $(filter-out tools/cli.c tools/cli_kernel.c tools/cli_gpregress.c,$(wildcard tools/*.c))
TOOLS      := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
TEST_SRC   := $(wildcard tests/test_*.c)
TESTS      := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Helpers every test program links (tests/support/testutil.h).
TEST_SUPPORT := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/*.c))
BENCH_SRC  := $(wildcard bench/*.c)
BENCHES    := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# libtpk.a as users link it: every object partially linked into one (ld -r) whose globals are
# the tpk_ names alone (objcopy), so that no internal name (nsr_*, orch_*) can clash with a user's
# in a static link; the programs link it too. The tests, benchmarks and fuzzers call internal
# functions: they link LIB_INTERNAL, a plain archive of the same objects.
STATIC     := $(BUILD)/lib/libtpk.a
LIB_INTERNAL := $(BUILD)/lib/libtpk-internal.a
# The shared library: libtpk.so.VERSION with SONAME libtpk.so.MAJOR, and the two links to it.
SONAME     := libtpk.so.$(VERSION_MAJOR)
SHARED_REAL := $(BUILD)/lib/libtpk.so.$(VERSION)
SHARED     := $(BUILD)/lib/libtpk.so
# The tuner is an offline library of its own (XGBoost, the compiler, measurement): only tptune, the
# gen/ generator, and the tests and benchmarks of the tuner link it; libtpk does not.
TUNE_SRC   := $(sort $(wildcard tuner/*.c))
TUNE_OBJ   := $(TUNE_SRC:%.c=$(BUILD)/obj/%.o)
TUNE_LIB   := $(BUILD)/lib/libtpktune.a
TUNE_LIBS  := -lxgboost -ljansson
DEPS_OK    := $(BUILD)/.deps-ok

.PHONY: bench-shared all lib tools tests run check check-asan check-portable bench install deps clean fuzz
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

# φ's batched evaluation calls libmvec from `omp simd` loops, which needs math errno off; the
# CNN's float maps take square roots in loops that vectorise only without it (no code reads errno).
$(BUILD)/obj/kernels/phi.o: KERNEL_FLAGS += -fno-math-errno
$(BUILD)/obj/kernels/cnn.o: KERNEL_FLAGS += -fno-math-errno

$(BUILD)/obj/bench/%.o: bench/%.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(KERNEL_FLAGS) -fno-math-errno -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# -d allocates common symbols (OpenMP's named critical sections), which objcopy can then make
# local like the rest; the global names left are checked by tests/test_install.c.
public_archive = rm -f $@ $@.o && ld -r -d -o $@.o $(1) && \
	objcopy --wildcard --keep-global-symbol='tpk_*' $@.o && ar rcs $@ $@.o && rm -f $@.o
$(STATIC): $(LIB_OBJ)
	@mkdir -p $(@D)
	$(call public_archive,$^)

$(LIB_INTERNAL): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(TUNE_LIB): $(TUNE_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(SHARED_REAL): $(LIB_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS_ALL)

$(SHARED): $(SHARED_REAL)
	ln -sf $(notdir $(SHARED_REAL)) $(@D)/$(SONAME)
	ln -sf $(SONAME) $@

$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(TOOL_CLI) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TOOL_CLI) $(STATIC) $(LDLIBS_ALL)

$(BUILD)/bin/gpkernel: $(BUILD)/obj/tools/gpkernel.o $(TOOL_CLI_KERNEL) $(TOOL_CLI) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TOOL_CLI_KERNEL) $(TOOL_CLI) $(STATIC) $(LDLIBS_ALL)

$(BUILD)/bin/gpregress: $(BUILD)/obj/tools/gpregress.o $(TOOL_CLI_GPREGRESS) $(TOOL_CLI) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TOOL_CLI_GPREGRESS) $(TOOL_CLI) $(STATIC) $(LDLIBS_ALL)

# netsor plan --emitted compiles the tuner's fused kernels (docs/orchestration.md §7.3).
$(BUILD)/bin/netsor: $(BUILD)/obj/tools/netsor.o $(TOOL_CLI) $(TUNE_LIB) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TOOL_CLI) $(TUNE_LIB) $(STATIC) $(LDLIBS_ALL) $(TUNE_LIBS) -ldl

$(BUILD)/bin/tptune: $(BUILD)/obj/tools/tptune.o $(TUNE_LIB) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TUNE_LIB) $(STATIC) $(LDLIBS_ALL) $(TUNE_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT) $(TUNE_LIB) $(LIB_INTERNAL)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TEST_SUPPORT) $(TUNE_LIB) $(LIB_INTERNAL) $(LDLIBS_ALL) $(TUNE_LIBS) -lcmocka

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(TUNE_LIB) $(LIB_INTERNAL)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(TUNE_LIB) $(LIB_INTERNAL) $(LDLIBS_ALL) $(TUNE_LIBS)

# Main job (the design card's headline): the infinite-width kernel of the Tensor Programs I
# transformer on the bundled demo token sequences, written to HDF5.
run: tools
	$(BUILD)/bin/gpkernel --arch=transformer --all-times --output=$(BUILD)/demo-transformer.h5

# TPK_VERIFY_IR: every program a test loads has its family IR verified after lowering.
# TPK_THREADS=fixed: the tools keep OpenMP's team size instead of following the machine's load
# (tpk/threads.h), so that runs compared bit for bit across processes round the same way
# (LAPACK's factorisations round differently on 1 and 2 threads); test_threads unsets it.
# lib too: test_install and test_examples run `make install` on this build tree, which needs the
# whole of `all` (the generator of gen/ included) built with this build's flags (check-asan's).
check: lib tools tests
	@TPK_BIN=$(abspath $(BUILD)/bin) TPK_ROOT=$(CURDIR) TPK_VERIFY_IR=1 TPK_THREADS=fixed \
	    sh scripts/run-tests.sh $(TESTS)

# Sanitizer suite: a separate build tree so the optimised build is untouched.
check-asan: $(DEPS_OK)
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" check

# The portable build (ARCH=x86-64-v3, build-v3/) under qemu-x86_64 -cpu Haswell against this one.
check-portable: $(DEPS_OK)
	@sh scripts/check-portable.sh

# The MLP kernel quiet and beside other work on the same cores (docs/architecture.md "Threads on
# a shared machine"); Python too where the package's venv exists.
bench-shared: tools
	@bash bench/shared/shared-machine.sh $(abspath $(BUILD)/bin) \
	    $$( [ -x $(PY_VENV)/bin/python ] && echo $(abspath $(PY_VENV))/bin/python )

bench: tools $(BENCHES) $(NT_VENV_OK)
	@sh scripts/run-bench.sh $(BUILD)
	@sh scripts/bench-rolled.sh $(BUILD)

# Public headers of libtpk: tune.h is the offline tuner's (libtpktune.a, not installed).
INSTALL_HEADERS := $(filter-out include/tpk/tune.h,$(wildcard include/tpk/*.h))
TOOL_NAMES := $(TOOLS:$(BUILD)/bin/%=%)
# What `make install` puts under DESTDIR, for `make uninstall` (directories are left alone).
INSTALLED := $(LIBDIR)/libtpk.a $(LIBDIR)/libtpk.so.$(VERSION) $(LIBDIR)/$(SONAME) \
             $(LIBDIR)/libtpk.so $(INSTALL_HEADERS:include/%=$(INCLUDEDIR)/%) \
             $(TOOL_NAMES:%=$(BINDIR)/%) $(TOOL_NAMES:%=$(MANDIR)/man1/%.1) \
             $(TOOL_NAMES:%=$(BASHCOMPDIR)/%) $(PKGCONFIGDIR)/tpk.pc \
             $(patsubst %,$(DATADIR)/tpk/%,$(wildcard programs/*.nsr) $(wildcard data/demo-*))

# The installed libraries are the build's objects with the install data directory compiled in
# (app/shipped.c, tpk_datadir(): where a user's program finds programs/ and data/), linked apart
# in $(BUILD)/inst so that the build tree's own libraries never depend on PREFIX. The stamp
# changes, and the two are linked again, only when DATADIR does.
INST        := $(BUILD)/inst
INST_DATADIR = $(DATADIR)/tpk
INST_OBJ     = $(filter-out $(BUILD)/obj/app/shipped.o,$(LIB_OBJ)) $(INST)/obj/app/shipped.o
INST_STATIC := $(INST)/libtpk.a
INST_SHARED := $(INST)/libtpk.so.$(VERSION)
.PHONY: FORCE
FORCE:
$(INST)/datadir.txt: FORCE
	@mkdir -p $(@D)
	@echo '$(INST_DATADIR)' | cmp -s - $@ || echo '$(INST_DATADIR)' > $@
$(INST)/obj/app/shipped.o: app/shipped.c $(INST)/datadir.txt | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -DTPK_DATADIR_INSTALLED='"$(INST_DATADIR)"' -MMD -MP -c $< -o $@
$(INST_STATIC): $(INST_OBJ)
	$(call public_archive,$^)
$(INST_SHARED): $(INST_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS_ALL)

# tpk.pc's Libs.private: what a link with libtpk.a needs after it, in link order, down to the
# libraries that Debian's shared libraries pull in themselves and a -static link must name:
# HDF5's szip (libaec), COIN-OR CBC's C++ runtime, OpenBLAS's Fortran runtime and LAPACK (after
# CBC, whose CoinUtils calls dgetrf_). Spelled out rather than `Requires.private`: cbc.pc
# names -llapack -lblas (a second BLAS beside OpenBLAS) and gsl.pc its reference CBLAS; tpk's
# headers include none of these libraries' headers, so no Cflags are lost.
PC_LIBS_PRIVATE = -lgsl $(shell pkg-config --libs-only-L $(HDF5_PC)) -lhdf5_serial_hl \
    $(shell pkg-config --libs-only-l $(HDF5_PC)) \
    $(if $(wildcard /usr/lib/*/libsz.* /usr/lib/libsz.* /usr/local/lib/libsz.*),-lsz -laec) \
    -lfftw3 -llapacke -lnettle $(CBC_LIBS) $(shell $(BLAS_PC) --static --libs openblas) \
    $(if $(OPENBLAS_OMP),-Wl$(comma)-rpath$(comma)$(OPENBLAS_OMP)) -lquadmath -lstdc++ -lgomp -lz \
    -ldl -lmvec -lm

install: all man $(INST_STATIC) $(INST_SHARED)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/tpk $(DESTDIR)$(BINDIR) \
	    $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(BASHCOMPDIR) \
	    $(DESTDIR)$(DATADIR)/tpk/programs $(DESTDIR)$(DATADIR)/tpk/data
	install -m 644 $(INST_STATIC) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(INST_SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf libtpk.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libtpk.so
	install -m 644 $(INSTALL_HEADERS) $(DESTDIR)$(INCLUDEDIR)/tpk/
	install -m 755 $(TOOLS) $(DESTDIR)$(BINDIR)/
	install -m 644 $(MANPAGES) $(DESTDIR)$(MANDIR)/man1/
	for t in $(TOOL_NAMES); do install -m 644 scripts/tpk-completion.bash \
	    $(DESTDIR)$(BASHCOMPDIR)/$$t || exit 1; done
	install -m 644 programs/*.nsr $(DESTDIR)$(DATADIR)/tpk/programs/
	install -m 644 data/demo-* $(DESTDIR)$(DATADIR)/tpk/data/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))|' \
	    -e 's|@DATADIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INST_DATADIR))|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_PRIVATE@|$(strip $(PC_LIBS_PRIVATE))|' \
	    tpk.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/tpk.pc

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/tpk $(DESTDIR)$(DATADIR)/tpk/programs \
	    $(DESTDIR)$(DATADIR)/tpk/data $(DESTDIR)$(DATADIR)/tpk 2>/dev/null

# Manual pages from each tool's --help and --version (help2man; installed from Debian when
# missing, see scripts/install-deps.sh). One-line descriptions for the NAME section:
MAN_DESC_gpkernel    := infinite-width (NNGP) kernel of a network architecture or NETSOR program
MAN_DESC_netsor      := check, elaborate and run NETSOR programs (Tensor Programs)
MAN_DESC_gplimits    := finite-width convergence of a network to its infinite-width limit
MAN_DESC_gpregress   := Gaussian-process regression and classification with NNGP kernels
MAN_DESC_gpattention := finite-width 1/sqrt(n) attention against its hierarchical limit
MAN_DESC_tptune      := the tensor-program tuner: GEMM, SYRK and map schedules
MANPAGES   := $(TOOL_NAMES:%=$(BUILD)/man/%.1)
HELP2MAN_OK := $(BUILD)/.help2man-ok

.PHONY: man docs uninstall
man: $(MANPAGES)
$(HELP2MAN_OK):
	@command -v help2man >/dev/null 2>&1 || sh scripts/install-deps.sh --only help2man
	@mkdir -p $(@D) && touch $@
$(BUILD)/man/%.1: $(BUILD)/bin/% | $(HELP2MAN_OK)
	@mkdir -p $(@D)
	help2man --no-info --no-discard-stderr --section=1 --source="tpk $(VERSION)" \
	    --name="$(MAN_DESC_$*)" --output=$@ $(abspath $<)

# The API reference from the public headers (Doxygen; its comments are plain C comments, which
# docs/doxygen-filter.sh turns into Doxygen's). Output: $(BUILD)/docs/html/index.html.
docs: $(wildcard include/tpk/*.h) docs/Doxyfile docs/doxygen-filter.sh docs/mainpage.md \
      examples/gp_mlp.c
	@command -v doxygen >/dev/null 2>&1 || sh scripts/install-deps.sh --only doxygen
	@mkdir -p $(BUILD)/docs
	( cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $(BUILD)/docs"; \
	  echo "PROJECT_NUMBER = $(VERSION)"; echo "WARN_LOGFILE = $(BUILD)/docs/warnings.log" ) \
	    | doxygen - > $(BUILD)/docs/doxygen.log
	@echo "API reference: $(BUILD)/docs/html/index.html"

clean:
	rm -rf build build-asan build-v3 build-debug

# Module fragments (targets of the tuner, GP regression, figures, ...) live in mk/*.mk.
-include $(sort $(wildcard mk/*.mk))

-include $(shell find $(BUILD)/obj $(INST)/obj -name '*.d' 2>/dev/null)
