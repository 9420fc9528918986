# make mpi (issue 16, docs/scale-out.md): the MPI programs, $(BUILD)/bin/gpkernel-mpi and
# $(BUILD)/bin/gpregress-mpi, built against
# Open MPI, the openmpi flavour of HDF5 (parallel HDF5) and ScaLAPACK/BLACS, none of which the
# default build needs (the README's commands do not build them).
#   make mpi          install what is missing (scripts/install-deps.sh --mpi), build the programs
#   make check-mpi    their tests under mpirun -np 2 at toy size (tests/mpi/; CI: .ci/run)
#   make check-mpi-size  issue 16's acceptance at N = 6000 (tests/mpi/size_*.c; minutes)
#   make fashion-full    NNGP classification on all of Fashion-MNIST over 2 ranks (issue 16,
#                        item 5; scripts/fashion-full.sh: CG, float32 kernel; about an hour)
# A program links one HDF5, and the serial build links the serial one: the library objects that
# call HDF5 (MPI_H5_SRC) are compiled a second time against the openmpi flavour into $(BUILD)/mpi/,
# and the MPI programs link a library made of those and the serial build's other objects, which
# do not touch HDF5 (checked when the archive is made: no undefined H5 symbol among them). The
# MPI programs' own objects and tests live in $(BUILD)/mpi/ too.
MPI_BUILD    := $(BUILD)/mpi
MPI_PKGS     := ompi-c scalapack-openmpi
MPI_PKG_CFLAGS = $(shell pkg-config --cflags hdf5-openmpi $(PKGS_NOH5) $(MPI_PKGS)) \
                 $(shell $(BLAS_PC) --cflags openblas)
MPI_LDLIBS     = $(SAN) -fopenmp $(BLAS_LIBS) \
                 $(filter-out -lgslcblas,$(shell pkg-config --libs hdf5-openmpi $(PKGS_NOH5) $(MPI_PKGS))) \
                 -lhdf5_openmpi_hl $(CBC_LIBS) -lm -lz -ldl $(LDFLAGS)
MPI_CFLAGS_ALL = $(CFLAGS_BASE) $(MPI_PKG_CFLAGS) $(CFLAGS)
MPI_DEPS_OK  := $(BUILD)/.deps-mpi-ok
# The library's HDF5 callers, compiled again; the other library objects are the serial build's.
MPI_H5_SRC   := core/io_h5out.c core/io_read.c
MPI_H5_OBJ   := $(MPI_H5_SRC:%.c=$(MPI_BUILD)/obj/%.o)
MPI_REUSED   := $(filter-out $(MPI_H5_SRC:%.c=$(BUILD)/obj/%.o),$(LIB_OBJ))
MPI_LIB      := $(MPI_BUILD)/lib/libtpk.a
# mpi/: the programs (gpkernel-mpi.c, gpregress-mpi.c) and the modules they share (tiles, grid,
# ranks, checkpoint, kernel stores and sources, the solvers).
MPI_PROG_SRC := mpi/gpkernel-mpi.c mpi/gpregress-mpi.c
MPI_MOD_OBJ  := $(patsubst %.c,$(MPI_BUILD)/obj/%.o,$(filter-out $(MPI_PROG_SRC),$(wildcard mpi/*.c)))
MPI_PROGRAMS := $(MPI_PROG_SRC:mpi/%.c=$(BUILD)/bin/%)
MPI_TEST_SRC := $(wildcard tests/mpi/test_*.c)
MPI_TESTS    := $(MPI_TEST_SRC:tests/mpi/%.c=$(MPI_BUILD)/tests/%)
# what every test program links, and the MPI tests' own helpers (tests/mpi/mpitest.c)
MPI_TEST_SUPPORT := $(patsubst %.c,$(MPI_BUILD)/obj/%.o,$(wildcard tests/support/*.c) \
                      tests/mpi/mpitest.c)

MPI_SIZE_SRC := $(wildcard tests/mpi/size_*.c)
MPI_SIZE     := $(MPI_SIZE_SRC:tests/mpi/%.c=$(MPI_BUILD)/tests/%)

.PHONY: mpi check-mpi check-mpi-size fashion-full
mpi: $(MPI_PROGRAMS)

$(MPI_DEPS_OK): scripts/install-deps.sh
	@sh scripts/install-deps.sh --mpi
	@mkdir -p $(@D) && touch $@

check-mpi: $(MPI_PROGRAMS) $(MPI_TESTS) $(BUILD)/bin/gpkernel $(BUILD)/bin/gpregress
	@TPK_BIN=$(abspath $(BUILD)/bin) TPK_ROOT=$(CURDIR) sh scripts/run-tests.sh $(MPI_TESTS)

check-mpi-size: $(MPI_PROGRAMS) $(MPI_SIZE) $(BUILD)/bin/gpregress
	@TPK_BIN=$(abspath $(BUILD)/bin) TPK_ROOT=$(CURDIR) sh scripts/run-tests.sh $(MPI_SIZE)

$(MPI_BUILD)/obj/%.o: %.c | $(MPI_DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(MPI_CFLAGS_ALL) -MMD -MP -c $< -o $@

$(MPI_LIB): $(MPI_REUSED) $(MPI_H5_OBJ)
	@mkdir -p $(@D)
	@bad=$$(nm -A -u $(MPI_REUSED) | awk '$$NF ~ /^H5/ { sub(/:.*/, "", $$1); print $$1 }' | sort -u); \
	    if [ -n "$$bad" ]; then echo "mk/mpi.mk: these objects call HDF5, add their sources to" \
	    "MPI_H5_SRC: $$bad" >&2; exit 1; fi
	rm -f $@ && ar rcs $@ $^

# each program links the command line it shares with its serial twin (tools/cli_*.c)
$(BUILD)/bin/gpkernel-mpi: $(TOOL_CLI_KERNEL)
$(BUILD)/bin/gpregress-mpi: $(TOOL_CLI_GPREGRESS)
$(BUILD)/bin/%-mpi: $(MPI_BUILD)/obj/mpi/%-mpi.o $(MPI_MOD_OBJ) $(TOOL_CLI) $(MPI_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $(filter %.o,$^) $(MPI_LIB) $(MPI_LDLIBS)

$(MPI_BUILD)/tests/%: $(MPI_BUILD)/obj/tests/mpi/%.o $(MPI_TEST_SUPPORT) $(MPI_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(MPI_TEST_SUPPORT) $(MPI_LIB) $(MPI_LDLIBS) -lcmocka

-include $(shell find $(MPI_BUILD)/obj -name '*.d' 2>/dev/null)

FASHION_FULL_OUT ?= $(BUILD)/fashion-full
fashion-full: $(MPI_PROGRAMS)
	@sh scripts/fashion-full.sh $(BUILD)/bin $(FASHION_FULL_OUT)
