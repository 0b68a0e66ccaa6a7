# tests/gpu/gpu.mk - the GPU tests and benchmarks (included by the top Makefile).
#
# tests/gpu/test_gpu_*.c -> $(O)/tests/test_gpu_*: tests/run runs them with
# the unit tests in `make check`; without a CUDA backend (a CUDA=0 build, or
# no GPU) each prints "test_gpu_X: skipped: REASON" and passes.
# tests/gpu/gpu_*.c -> $(O)/tests/gpu_*: benchmarks and the memory check,
# built by `make check` (so they always compile) and run by scripts/device-check only.

GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_gpu_*.c))
GPU_TOOL_SRC := $(sort $(wildcard tests/gpu/gpu_*.c))
GPU_TESTS    := $(GPU_TEST_SRC:tests/gpu/%.c=$(O)/tests/%)
GPU_TOOLS    := $(GPU_TOOL_SRC:tests/gpu/%.c=$(O)/tests/%)
GPU_OBJ      := $(GPU_TEST_SRC:%.c=$(O)/%.o) $(GPU_TOOL_SRC:%.c=$(O)/%.o)

# unit.h lives in tests/unit; the CUDA runtime's header only for the
# benchmarks' own copy-bandwidth and cudaMemGetInfo readings (KVP_HAVE_CUDA).
$(GPU_OBJ): CPPFLAGS += -iquote tests/unit $(if $(filter 1,$(USE_CUDA)),-isystem $(CUDA_HOME)/include)

$(GPU_TESTS) $(GPU_TOOLS): $(O)/tests/%: $(O)/tests/gpu/%.o $(LIB)
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# check-nodeps builds $(UNITS): the GPU programs come along.
UNITS += $(GPU_TESTS) $(GPU_TOOLS)

.PHONY: gpu-tests
## gpu-tests    build the GPU tests and benchmarks (tests/gpu; scripts/device-check runs them)
gpu-tests: $(GPU_TESTS) $(GPU_TOOLS)

-include $(GPU_OBJ:.o=.d)
