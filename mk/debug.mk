# Debuggable builds (issue 40, item 4). The default build compiles kernels/ for this host
# (-march=native: AVX-512 here), which valgrind 3.19 cannot execute (SIGILL in the first kernel).
#   make debug            the library, the programs and the examples, -O1 -g, kernels for
#                         x86-64-v2 (no AVX-512), in $(DEBUG_BUILD); gdb and valgrind run them
#   make check-valgrind   the examples and a few quick test programs of that build under
#                         valgrind --leak-check=full --error-exitcode=1 (scripts/check-valgrind.sh;
#                         valgrind installed from Debian when missing); CI calls it
# The generated per-class tables (gen/) keep their own flags and are chosen at run time from
# what the CPU reports, and valgrind's synthetic CPU reports no AVX-512: the AVX2 tables or the
# reference loops run under it.
DEBUG_BUILD ?= build-debug
DEBUG_OPT   := -O1 -g -fno-omit-frame-pointer
DEBUG_ARCH  ?= x86-64-v2
VALGRIND_TESTS ?= test_input_checks test_netsor_front test_arch_kernel
EXAMPLE_NAMES := $(patsubst examples/%.c,%,$(wildcard examples/*.c))
EXAMPLES := $(EXAMPLE_NAMES:%=$(BUILD)/examples/%)

.PHONY: examples debug check-valgrind
# The examples built in the tree against this build's libtpk.a (`make check` builds them against
# the installed library instead: scripts/check-examples.sh).
examples: $(EXAMPLES)
$(BUILD)/examples/%: examples/%.c $(STATIC) | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) -std=c11 $(OPT) $(SAN) $(WARN) -Iinclude -o $@ $< $(STATIC) $(LDLIBS_ALL)

debug: $(DEPS_OK)
	$(MAKE) BUILD=$(DEBUG_BUILD) OPT="$(DEBUG_OPT)" ARCH=$(DEBUG_ARCH) lib tools examples

check-valgrind: $(DEPS_OK)
	@command -v valgrind >/dev/null 2>&1 || sh scripts/install-deps.sh --only valgrind
	$(MAKE) BUILD=$(DEBUG_BUILD) OPT="$(DEBUG_OPT)" ARCH=$(DEBUG_ARCH) lib tools examples \
	    $(VALGRIND_TESTS:%=$(DEBUG_BUILD)/tests/%)
	@TPK_ROOT=$(CURDIR) sh scripts/check-valgrind.sh $(DEBUG_BUILD) $(VALGRIND_TESTS)
