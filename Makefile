# kvpipe - GNU Make build.  `make help` lists the targets.
#
# Layout: lib/LAYER/*.c -> lib/libkvpipe.a (one folder a layer, README "Layout"); cmd/NAME.c -> bin/NAME;
# tests/unit/test_*.c -> $(O)/tests/test_*; tests/cli/*.sh run the programs.
# New files are picked up by wildcard: no edits here to add a module,
# a program or a test.

.DEFAULT_GOAL := all
SHELL := /bin/sh

CC      ?= cc
PREFIX  ?= /usr/local
DESTDIR ?=
O       ?= build
# An out-of-tree build (O=DIR) links its programs into DIR/bin: into the
# shared bin/ they replaced the default build's, which make did not see.
BINDIR  ?= $(if $(filter build,$(O)),bin,$(O)/bin)
V       ?= 0

# Strict warnings (STYLE.md); -Werror so nothing slips in.
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wvla -Wformat=2 -Werror
OPT      ?= -O2 -g
# Each layer folder of lib/ is on the include path: file names are unique
# across the tree, and scripts/check-layers says which includes are allowed.
# -iquote, not -I: only #include "..." looks there, so a system header's
# <sched.h> is the system's, not lib/engine/sched.h.
LIB_DIRS := $(sort $(patsubst %/,%,$(dir $(wildcard lib/*/*.c lib/*/*.h))))
LIB_INC  := $(addprefix -iquote,$(LIB_DIRS))
# `override`: a CPPFLAGS or CFLAGS given on the command line (make
# CFLAGS=-O3, as distributions' build tools do) is added to, not put in
# their place (it had dropped -std=c11, the warnings and the include path);
# the caller's CFLAGS come last, so its -O3 wins over OPT's -O2.
override CPPFLAGS += $(LIB_INC) -D_GNU_SOURCE
override CFLAGS   := -std=c11 $(OPT) $(WARN) -pthread -MMD -MP $(CFLAGS)
override LDLIBS   += -lzstd -lm -pthread

# ---- CUDA plumbing (CUDA=auto|0|1).  The CPU build never needs nvcc. ----
# kernels/*.cu go into the library with lib/.  The CUDA runtime is linked
# statically (cudart_static), so a program needs no CUDA library to start:
# only the driver (libcuda.so.1), which cudart opens at the first CUDA call;
# without it kvp_backend_cuda_create fails with KVP_EUNSUPPORTED and the CPU
# backend runs as before.  Each kernel file's `ptxas -v` report is kept
# beside its object (.ptxas), and `make check` runs scripts/check-spills over
# them: a kernel that spills or uses local memory fails the build's tests.
CUDA         ?= auto
CUDA_HOME    ?= /usr/local/cuda
NVCC_GENCODE ?= -gencode arch=compute_90,code=sm_90
NVCC         ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
CU_SRC       := $(wildcard kernels/*.cu)
ifeq ($(CUDA),auto)
  USE_CUDA := $(if $(and $(NVCC),$(CU_SRC)),1,0)
else
  USE_CUDA := $(CUDA)
endif
# kernels/backend_cuda.h, the C side's one header of the CUDA backend
override CPPFLAGS += -iquote kernels
ifeq ($(USE_CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found (set CUDA_HOME or PATH))
  endif
  override CPPFLAGS += -DKVP_HAVE_CUDA=1
  CU_OBJ   := $(CU_SRC:%.cu=$(O)/%.o)
  override LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
endif
# The architectures, as backend_cuda.cu names them when a device has no code here: "sm_90".
comma      := ,
CU_ARCHS   := $(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(NVCC_GENCODE))))
NVCC_FLAGS := $(NVCC_GENCODE) -O3 -std=c++20 -Xptxas -v -Werror all-warnings -Xcompiler -fPIC,-Wall,-Wextra \
              $(addprefix -Xcompiler -iquote,$(LIB_DIRS) kernels) -DKVP_CUDA_ARCHS='"$(CU_ARCHS)"'
# Unit tests in CUDA C++ (tests/unit/test_*.cu: the kernels' host-callable
# numerics against lib/num, no GPU needed), built when CUDA is.
CU_UNITS   := $(if $(filter 1,$(USE_CUDA)),$(patsubst tests/unit/%.cu,$(O)/tests/%,$(wildcard tests/unit/test_*.cu)))

# ---- MPI (MPI=auto|0|1): lib/comm's collectives; without it one process. ----
# Found through pkg-config (OpenMPI's ompi-c, MPICH's mpich), else mpicc.
MPI          ?= auto
ifneq ($(MPI),0)
  MPI_CFLAGS ?= $(shell pkg-config --cflags ompi-c 2>/dev/null || pkg-config --cflags mpich 2>/dev/null || \
                  mpicc --showme:compile 2>/dev/null || mpicc -compile_info 2>/dev/null | sed 's/^[^ ]* //;s/ -c .*//')
  MPI_LIBS   ?= $(shell pkg-config --libs ompi-c 2>/dev/null || pkg-config --libs mpich 2>/dev/null || \
                  mpicc --showme:link 2>/dev/null)
  HAVE_MPI   := $(shell printf '\043include <mpi.h>\nint main(void){return MPI_Init(0,0);}\n' | \
                  $(CC) -x c - $(MPI_CFLAGS) $(MPI_LIBS) -o /dev/null >/dev/null 2>&1 && echo 1)
endif
ifeq ($(MPI)$(HAVE_MPI),1)
  $(error MPI=1 but no MPI was found (Debian: apt-get install libopenmpi-dev openmpi-bin))
endif
ifeq ($(HAVE_MPI),1)
  override CPPFLAGS += -DKVP_HAVE_MPI=1 $(MPI_CFLAGS)
  override LDLIBS   += $(MPI_LIBS)
endif

# ---- NCCL (NCCL=auto|0|1): tpbench's GPU backend, in lib/comm/*nccl*.c. ----
# Headers and libraries from the CUDA toolkit, in the CUDA build only; only
# tpbench links them (dynamically, with an rpath), so no other program needs
# CUDA's libraries to start, and a CPU build's tpbench none either (NCCL=0
# makes a CUDA build's tpbench start without them too).
NCCL ?= auto
# auto, 0 or 1: another word (CUDA=yes) had built without it, silently
$(foreach v,CUDA MPI NCCL,$(if $(filter-out auto 0 1,$($(v))),$(error $(v)=$($(v)): give auto, 0 or 1)))
ifeq ($(NCCL)$(USE_CUDA),10)
  $(error NCCL=1 needs the CUDA build: nvcc, or CUDA=1)
endif
ifneq ($(NCCL)$(USE_CUDA),auto0)
ifneq ($(NCCL),0)
  HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h && test -f $(CUDA_HOME)/include/cuda_runtime.h && \
                 ls $(CUDA_HOME)/lib64/libnccl.so >/dev/null 2>&1 && echo 1)
endif
endif
ifeq ($(NCCL)$(HAVE_NCCL),1)
  $(error NCCL=1 but nccl.h or libnccl.so is not under CUDA_HOME=$(CUDA_HOME))
endif
ifeq ($(HAVE_NCCL),1)
  NCCL_CPPFLAGS := -DKVP_HAVE_NCCL=1 -isystem $(CUDA_HOME)/include
  NCCL_LIBS     := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart
endif

ifeq ($(V),0)
  Q  := @
  say = @printf '  %-6s %s\n' $(1) $(2)
else
  Q  :=
  say = @:
endif

LIB_SRC  := $(sort $(wildcard lib/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(O)/%.o) $(CU_OBJ)
LIB      := $(if $(filter build,$(O)),lib/libkvpipe.a,$(O)/libkvpipe.a)
CMD_SRC  := $(sort $(wildcard cmd/*.c))
PROGS    := $(CMD_SRC:cmd/%.c=$(BINDIR)/%)
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNITS    := $(UNIT_SRC:tests/unit/%.c=$(O)/tests/%) $(CU_UNITS)
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(O)/tests/test_fuzz_%)
include tests/gpu/gpu.mk
# The public API: lib/kvpipe.h and the headers it includes (scripts/check-layers
# checks that they include nothing else); every other header stays in lib/.
PUB_HEADERS := lib/kvpipe.h $(foreach h,$(shell sed -n 's/^\#include "\(.*\)"$$/\1/p' lib/kvpipe.h),$(wildcard lib/*/$(h)))
MAN1     := $(sort $(wildcard man/*.1))
MAN5     := $(sort $(wildcard man/*.5))

.PHONY: all help check check-unit check-cli asan tsan install uninstall clean deps demo check-ref fetch-model fuzz
.SUFFIXES:

## all          build lib/libkvpipe.a and every program into bin/ (default)
all: $(LIB) $(PROGS)

# Every test build has lib/base/debug.h's assertions on (KVP_DEBUG=1) and
# its own folder, so `make` (bin/, build/) never carries them (set before
# BUILD_FLAGS, which records it).
KVP_DEBUG ?= 0
ifeq ($(KVP_DEBUG),1)
  override CPPFLAGS += -DKVP_DEBUG=1
endif
# Every object and program depends on the flags it was built with,
# $(O)/build-flags, rewritten only when they change: MPI installed after a
# first build (scripts/deps), or another OPT or CUDA, rebuilds what they
# change, where make would otherwise link the old objects (a build with
# MPI whose ranks said "this build has no MPI").  The file is compared and
# rewritten as the Makefile is read, not by a rule that always runs, so
# `make -q` and `make -n` tell the truth about what is out of date.
BUILD_FLAGS := $(CC) | $(CPPFLAGS) | $(CFLAGS) | $(LDFLAGS) | $(LDLIBS) | $(USE_CUDA) $(NVCC) $(NVCC_FLAGS) | $(NCCL_LIBS)
write_build_flags = mkdir -p $(O) && printf '%s\n' '$(subst ','\'',$(BUILD_FLAGS))' >$(O)/build-flags
ifneq ($(strip $(shell cat $(O)/build-flags 2>/dev/null)),$(strip $(BUILD_FLAGS)))
  ifneq ($(findstring n,$(firstword -$(MAKEFLAGS)))$(findstring q,$(firstword -$(MAKEFLAGS))),)
    .PHONY: $(O)/build-flags # -n, -q: everything is out of date, and nothing is written
  else
    $(shell $(write_build_flags))
  endif
endif
$(O)/build-flags:
	@$(write_build_flags)

$(O)/%.o: %.c $(O)/build-flags
	$(call say,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# -iquote (through the host compiler) as for C: lib/engine/sched.h must not
# stand in for the system's <sched.h>.  ptxas's report goes to NAME.ptxas.
$(O)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh) lib/plan/gpuplan.h lib/backend/backend.h $(O)/build-flags
	$(call say,NVCC,$<)
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCC_FLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@ 2>$(@:.o=.ptxas) || { cat $(@:.o=.ptxas) >&2; exit 1; }

$(O)/tests/unit/%.o: tests/unit/%.cu $(wildcard kernels/*.cuh) lib/plan/gpuplan.h lib/backend/backend.h $(O)/build-flags
	$(call say,NVCC,$<)
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCC_FLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@ 2>$(@:.o=.ptxas) || { cat $(@:.o=.ptxas) >&2; exit 1; }

$(O)/lib/comm/%nccl.o $(O)/lib/comm/%nccl_impl.o: override CPPFLAGS += $(NCCL_CPPFLAGS)
$(BINDIR)/tpbench: override LDLIBS += $(NCCL_LIBS)

$(LIB): $(LIB_OBJ)
	$(call say,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(BINDIR)/%: $(O)/cmd/%.o $(LIB) $(O)/build-flags
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

$(O)/tests/test_%: $(O)/tests/unit/test_%.o $(LIB) $(O)/build-flags
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# test_io checks the fsync protocol of lib/base/io.c, and that it reads the
# umask without setting it, through wrappers.
$(O)/tests/test_io: override LDFLAGS += -Wl,--wrap=fsync -Wl,--wrap=umask

# Corpus replays: each fuzz harness linked with a plain main() that runs every
# file of tests/fuzz/corpus/NAME/ (seeds and past crashes) and of
# tests/golden/fuzz-seeds/NAME/ (its GGUF and safetensors seeds) in `make check`.
$(O)/tests/test_fuzz_%: $(O)/tests/fuzz/fuzz_%.o $(O)/tests/fuzz/replay.o $(LIB) $(O)/build-flags
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) $(filter-out $(O)/build-flags,$^) $(LDLIBS) -o $@

## deps         install missing build dependencies (Debian: libzstd-dev, ...)
deps:
	@scripts/deps

CHECK_VARS := O=build/check BINDIR=build/check/bin KVP_DEBUG=1

## check        install deps, fetch the test model if possible, run every test (build/check: assertions on)
check: deps
	@scripts/fetch-model >/dev/null || echo "check: the SmolLM2 test model could not be fetched; tests that need it are skipped"
	@$(MAKE) --no-print-directory check-nodeps $(CHECK_VARS)

## check-unit   the C unit tests alone
check-unit:
	@$(MAKE) --no-print-directory check-nodeps $(CHECK_VARS) TESTS=unit

## check-cli    the command-line tests alone
check-cli:
	@$(MAKE) --no-print-directory check-nodeps $(CHECK_VARS) TESTS=cli

## asan         the whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer
# The sanitizer builds leave CUDA out (CUDA=0): nvcc does not instrument the
# kernels' host code, so they would check nothing there, and on a machine
# with a GPU the CUDA driver's fixed mappings collide with ASan's shadow
# memory (protect_shadow_gap) and TSan's; the build also skips nvcc's minutes.
asan: deps
	@$(MAKE) --no-print-directory check-nodeps O=build/asan BINDIR=build/asan/bin KVP_DEBUG=1 CUDA=0 \
	    OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"

## tsan         unit tests under ThreadSanitizer, thread pool at 2 and 4 (TSAN_MODEL=1: real-model engine tests too)
TSAN_MODEL ?= 0
tsan: deps
	@$(MAKE) --no-print-directory tsan-nodeps O=build/tsan BINDIR=build/tsan/bin KVP_DEBUG=1 CUDA=0 \
	    OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=thread"

.PHONY: check-nodeps tsan-nodeps
check-nodeps:
	@$(MAKE) --no-print-directory all $(UNITS) $(FUZZ_REPLAY)
	$(if $(CU_OBJ),@scripts/check-spills $(CU_OBJ:.o=.ptxas) >$(O)/kernels/spills.txt || \
	    { cat $(O)/kernels/spills.txt; exit 1; }; tail -n 1 $(O)/kernels/spills.txt)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
	    KVP_BIN=$(abspath $(BINDIR)) KVP_UNIT_DIR=$(abspath $(O)/tests) KVP_CFLAGS="$(OPT)" tests/run $(TESTS)

# Every unit test with a pool of 2, the pool's users again with 4
# (KVP_TEST_THREADS: unit.h's unit_threads, tests/cli/lib.sh's $THREADS).
# test_engine's tiny models go through every parallel op of the forward
# pass; its SmolLM2 parts and cli/engine*.sh take over 15 minutes under TSan
# on 2 cores, so they run only with TSAN_MODEL=1.
tsan-nodeps:
	@$(MAKE) --no-print-directory all $(UNITS)
	@set -e; export TSAN_OPTIONS=halt_on_error=1:exitcode=66:suppressions=$(abspath tests/tsan.supp) KVP_BIN=$(abspath $(BINDIR)) \
	    KVP_UNIT_DIR=$(abspath $(O)/tests) $(if $(filter 1,$(TSAN_MODEL)),,KVP_MODEL=/nonexistent); \
	    echo "tsan: thread pool of 2"; KVP_TEST_THREADS=2 tests/run unit; \
	    echo "tsan: thread pool of 4"; for t in engine threadpool model_hf; do KVP_TEST_THREADS=4 tests/run unit $$t; done; \
	    if [ "$(TSAN_MODEL)" = 1 ]; then for n in 2 4; do KVP_TEST_THREADS=$$n tests/run cli engine; done; fi

## fuzz         run every libFuzzer harness in tests/fuzz/ for FUZZ_SECONDS (default 60) with clang
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -std=c11 -g -O1 $(LIB_INC) -D_GNU_SOURCE -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -pthread -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_LIBOBJ  := $(LIB_SRC:%.c=build/fuzz/%.o)
build/fuzz/%.o: %.c
	@mkdir -p $(@D)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
build/fuzz/bin/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIBOBJ) $(wildcard tests/fuzz/*.h)
	$(call say,FUZZ,$@)
	@mkdir -p $(@D)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $(filter-out %.h,$^) -lzstd -lm -o $@
fuzz:
	@scripts/deps fuzz
	@$(MAKE) --no-print-directory $(FUZZ_SRC:tests/fuzz/fuzz_%.c=build/fuzz/bin/fuzz_%)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)

## check-ref    regenerate golden files from the reference packages (needs Python; makes a venv)
check-ref: all
	@scripts/ref/run

## check-profile  specdec --profile's predicted speedups within 25% of the measured ones (a timing: not in check)
.PHONY: check-profile
check-profile: all
	@KVP_BIN=$(abspath $(BINDIR)) scripts/check-profile

## fetch-model  download and cache SmolLM2-135M-Instruct (GGUF) outside the repo
fetch-model:
	@scripts/fetch-model

## demo         build, fetch the small real model and run the main pipeline
demo: deps
	@$(MAKE) --no-print-directory all
	@KVP_BIN=$(abspath $(BINDIR)) scripts/demo

## install      install programs, man pages, library, public headers (lib/kvpipe.h), kvpipe.pc (PREFIX, DESTDIR)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	    $(DESTDIR)$(PREFIX)/include/kvpipe $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(PUB_HEADERS) $(DESTDIR)$(PREFIX)/include/kvpipe/
	$(if $(MAN1),install -m 644 $(MAN1) $(DESTDIR)$(PREFIX)/share/man/man1/)
	$(if $(MAN5),install -m 644 $(MAN5) $(DESTDIR)$(PREFIX)/share/man/man5/)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(shell sed -n 's/.*KVP_VERSION "\(.*\)"/\1/p' lib/base/version.h)|' \
	    -e 's|@LIBS@|$(LDLIBS)|' scripts/kvpipe.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpipe.pc

## uninstall    remove what install put in place
uninstall:
	rm -f $(PROGS:$(BINDIR)/%=$(DESTDIR)$(PREFIX)/bin/%) $(DESTDIR)$(PREFIX)/lib/libkvpipe.a \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvpipe.pc
	rm -rf $(DESTDIR)$(PREFIX)/include/kvpipe
	rm -f $(MAN1:man/%=$(DESTDIR)$(PREFIX)/share/man/man1/%) $(MAN5:man/%=$(DESTDIR)$(PREFIX)/share/man/man5/%)

## clean        remove build outputs
clean:
	rm -rf $(O) build $(BINDIR) lib/libkvpipe.a tests/tmp

## help         list the targets (V=1 shows commands; CUDA=, MPI=, NCCL=auto|0|1, CUDA_HOME, NVCC_GENCODE;
##              O=DIR builds out of tree into DIR/bin; OPT=-O2 -g; CFLAGS/CPPFLAGS add to the build's own)
help:
	@sed -n 's/^## /  /p' $(MAKEFILE_LIST)

.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(CMD_SRC:%.c=$(O)/%.d) $(UNIT_SRC:%.c=$(O)/%.d) $(FUZZ_SRC:%.c=$(O)/%.d)
# nvcc writes the .cu objects' header dependencies too (-MMD), so a change
# to a C header they include (minifloat.h) rebuilds them
-include $(CU_UNITS:$(O)/tests/%=$(O)/tests/unit/%.d)
