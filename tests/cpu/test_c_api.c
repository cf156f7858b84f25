/* test_c_api.c — the C ABI (flashoverlap_c.h), from C, against the shared
 * library alone.
 *
 *   test_c_api        what runs without a GPU (and with one): the version,
 *                     the status strings, the three ops' option defaults
 *                     and their struct_size rules (GemmReduceScatter's and
 *                     GemmAllToAll's paths, ReduceScatter's layouts too),
 *                     fo_alltoall_routing's layout, NULL handles and
 *                     pointers, the per-thread message, the communicators'
 *                     no-GPU status (what stands before any op without a
 *                     GPU)
 *   test_c_api --gpu  one rank on one Hopper GPU: GemmAllReduce for several
 *                     m, both dtypes, the four paths, run_rmsnorm, against a
 *                     host reference (exact: small integer inputs), and
 *                     GemmReduceScatter the same way (at one rank its rows
 *                     are every row of a * b^T: rows_out(m) = m, rows(m) =
 *                     0..m-1, both layouts, paths sequential and slots; and
 *                     all_gather_rows of its output, and of run_rmsnorm's
 *                     residual_out, is the whole m x n, rows in C's order,
 *                     nothing past m written); and GemmAllToAll at one rank
 *                     (every row back to rank 0, to a token of a shuffled
 *                     permutation, some tokens without rows): the combine
 *                     bitwise gate * row, the received rows bitwise a * b^T
 *                     in source-row order with their tokens, both paths,
 *                     the routing's struct_size rules and its refusals, the
 *                     last plan; exits 77
 *                     (skipped) without a GPU, fails instead where
 *                     FO_REQUIRE_GPUS >= 1 promises one
 *
 * The GPU part reaches the device through the driver API, loaded with
 * dlopen (libcuda.so.1): the test links no CUDA runtime of its own, so it
 * starts on a machine without a driver and cannot interpose on the
 * library's. */
#include "flashoverlap/flashoverlap_c.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FO_PROJECT_VERSION
#error "FO_PROJECT_VERSION (CMake's PROJECT_VERSION) must be defined"
#endif

#define SKIP_CODE 77

static int g_failures = 0;

#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                              \
      fputc('\n', stderr);                                                       \
      ++g_failures;                                                              \
    }                                                                            \
  } while (0)

/* A call that must succeed, and leave "" as the last error. */
#define EXPECT_OK(call)                                                                                   \
  do {                                                                                                    \
    const fo_status s_ = (call);                                                                          \
    CHECK(s_ == FO_OK, "%s returned %s: %s", #call, fo_status_string(s_), fo_last_error());               \
    if (s_ == FO_OK) CHECK(fo_last_error()[0] == '\0', "%s: last error after success: \"%s\"", #call, fo_last_error()); \
  } while (0)

/* A call that must fail with `status`, its message "<fn>: ..." containing
 * `text`. */
static void expect_status_(fo_status got, fo_status want, const char* fn, const char* text, const char* call,
                           int line) {
  const char* m = fo_last_error();
  const size_t fl = strlen(fn);
  if (got != want || strncmp(m, fn, fl) != 0 || m[fl] != ':' || !strstr(m, text)) {
    fprintf(stderr,
            "%s:%d: %s\n  returned %s, message \"%s\"\n  wanted   %s, message \"%s: ...%s...\"\n", __FILE__, line,
            call, fo_status_string(got), m, fo_status_string(want), fn, text);
    ++g_failures;
  }
}
#define EXPECT_STATUS(call, want, fn, text) expect_status_((call), (want), (fn), (text), #call, __LINE__)
#define EXPECT_INVALID(call, fn, text) EXPECT_STATUS(call, FO_INVALID_ARGUMENT, fn, text)

static int required_gpus(void) {
  const char* v = getenv("FO_REQUIRE_GPUS");
  return v && *v ? atoi(v) : 0;
}

/* ------------------------------------------------------------------ CPU */

static void test_version(void) {
  CHECK(strcmp(fo_version(), FO_PROJECT_VERSION) == 0, "fo_version() = \"%s\", project version \"%s\"", fo_version(),
        FO_PROJECT_VERSION);
  CHECK(fo_c_abi_version() == FO_C_ABI_VERSION, "fo_c_abi_version() = %u, header %d", (unsigned)fo_c_abi_version(),
        FO_C_ABI_VERSION);
  CHECK(strcmp(fo_status_string(FO_OK), "FO_OK") == 0, "%s", fo_status_string(FO_OK));
  CHECK(strcmp(fo_status_string(FO_INVALID_ARGUMENT), "FO_INVALID_ARGUMENT") == 0, "%s",
        fo_status_string(FO_INVALID_ARGUMENT));
  CHECK(strcmp(fo_status_string(FO_NO_GPU), "FO_NO_GPU") == 0, "%s", fo_status_string(FO_NO_GPU));
  CHECK(strcmp(fo_status_string(FO_ERROR), "FO_ERROR") == 0, "%s", fo_status_string(FO_ERROR));
  CHECK(strcmp(fo_status_string((fo_status)42), "unknown fo_status") == 0, "%s", fo_status_string((fo_status)42));
  CHECK(FO_OK == 0 && sizeof(fo_status) == 4 && sizeof(fo_dtype) == 4 && sizeof(fo_path) == 4,
        "enums are 32-bit, FO_OK is 0");
  CHECK(sizeof(fo_gemm_allreduce_options) == 56 && offsetof(fo_gemm_allreduce_options, input) == 48 &&
            offsetof(fo_gemm_allreduce_options, scales) == 52 && FO_INPUT_E4M3 == 1 && FO_SCALES_ROW_WISE == 2,
        "sizeof(fo_gemm_allreduce_options) = %zu", sizeof(fo_gemm_allreduce_options));
  CHECK(sizeof(fo_rs_layout) == 4 && FO_RS_LAYOUT_STANDARD == 0 && FO_RS_LAYOUT_SUBTILE == 1,
        "fo_rs_layout is 32-bit, standard 0, sub-tile 1");
  CHECK(sizeof(fo_gemm_reducescatter_options) == 48 && offsetof(fo_gemm_reducescatter_options, input) == 40 &&
            offsetof(fo_gemm_reducescatter_options, scales) == 44,
        "sizeof(fo_gemm_reducescatter_options) = %zu", sizeof(fo_gemm_reducescatter_options));
  /* (the fields shared with fo_gemm_allreduce_options at the same offsets) */
  CHECK(offsetof(fo_gemm_reducescatter_options, path) == offsetof(fo_gemm_allreduce_options, path) &&
            offsetof(fo_gemm_reducescatter_options, nccl_sms) == offsetof(fo_gemm_allreduce_options, nccl_sms) &&
            offsetof(fo_gemm_reducescatter_options, wait_timeout_s) ==
                offsetof(fo_gemm_allreduce_options, wait_timeout_s) &&
            offsetof(fo_gemm_reducescatter_options, check_m) == offsetof(fo_gemm_allreduce_options, check_m) &&
            offsetof(fo_gemm_reducescatter_options, layout) == 28 &&
            offsetof(fo_gemm_reducescatter_options, tuning_cache) == 32,
        "fo_gemm_reducescatter_options' offsets");
  CHECK(sizeof(fo_gemm_alltoall_options) == 48 && offsetof(fo_gemm_alltoall_options, experts) == 32 &&
            offsetof(fo_gemm_alltoall_options, input) == 36 && offsetof(fo_gemm_alltoall_options, scales) == 40,
        "sizeof(fo_gemm_alltoall_options) = %zu", sizeof(fo_gemm_alltoall_options));
  CHECK(offsetof(fo_gemm_alltoall_options, path) == offsetof(fo_gemm_allreduce_options, path) &&
            offsetof(fo_gemm_alltoall_options, nccl_sms) == offsetof(fo_gemm_allreduce_options, nccl_sms) &&
            offsetof(fo_gemm_alltoall_options, wait_timeout_s) == offsetof(fo_gemm_allreduce_options, wait_timeout_s),
        "fo_gemm_alltoall_options' offsets");
  CHECK(sizeof(fo_alltoall_routing) == 80 && offsetof(fo_alltoall_routing, expert_counts) == 72 &&
            offsetof(fo_alltoall_routing, struct_size) == 0 &&
            offsetof(fo_alltoall_routing, rows) == 8 && offsetof(fo_alltoall_routing, dest_rank) == 16 &&
            offsetof(fo_alltoall_routing, dest_token) == 24 && offsetof(fo_alltoall_routing, gate) == 32 &&
            offsetof(fo_alltoall_routing, tokens) == 40 && offsetof(fo_alltoall_routing, send_counts) == 48 &&
            offsetof(fo_alltoall_routing, recv_counts) == 56 && offsetof(fo_alltoall_routing, on_device) == 64,
        "fo_alltoall_routing's layout (sizeof %zu)", sizeof(fo_alltoall_routing));
  CHECK(fo_last_error()[0] == '\0', "a fresh thread's last error: \"%s\"", fo_last_error());
}

/* fo_local_gpus: a count and its reason that agree (none: why; some: ""),
 * the text's size first as the plan functions give it, then cut to a short
 * buffer; NULL where a pointer is needed refused. Any machine. */
static void test_local_gpus(void) {
  int hopper = -1, failed = -1;
  size_t needed = 0;
  CHECK(fo_local_gpus(&hopper, &failed, NULL, 0, &needed) == FO_OK, "fo_local_gpus: %s", fo_last_error());
  CHECK(hopper >= 0 && (failed == 0 || failed == 1) && needed >= 1, "hopper %d, cuda_failed %d, needed %zu", hopper,
        failed, needed);
  char* reason = (char*)malloc(needed);
  CHECK(fo_local_gpus(&hopper, NULL, reason, needed, NULL) == FO_OK, "fo_local_gpus: %s", fo_last_error());
  CHECK(strlen(reason) + 1 == needed, "the reason \"%s\" is %zu bytes with its NUL, needed said %zu", reason,
        strlen(reason) + 1, needed);
  CHECK((hopper == 0) == (reason[0] != '\0'), "%d Hopper GPUs and the reason \"%s\"", hopper, reason);
  if (needed > 4) {
    char shorter[4];
    CHECK(fo_local_gpus(&hopper, NULL, shorter, sizeof shorter, NULL) == FO_OK && strlen(shorter) == 3 &&
              strncmp(shorter, reason, 3) == 0,
          "a 4-byte buffer holds the reason's first 3 characters: \"%s\"", shorter);
  }
  free(reason);
  CHECK(fo_local_gpus(NULL, NULL, NULL, 0, NULL) == FO_INVALID_ARGUMENT && strstr(fo_last_error(), "hopper"),
        "NULL hopper: %s", fo_last_error());
  CHECK(fo_local_gpus(&hopper, NULL, NULL, 8, NULL) == FO_INVALID_ARGUMENT && strstr(fo_last_error(), "reason"),
        "NULL reason with a size: %s", fo_last_error());
}

/* fo_allreduce_curve_path: the name GemmAllReduce's curves directory holds
 * for a CTA budget, world and dtype; fo_measure_allreduce_curve's checks that
 * come before any GPU work. */
static void test_curves(void) {
  char buf[128];
  size_t needed = 0;
  CHECK(fo_allreduce_curve_path("dir", 8, 4, FO_DTYPE_BF16, buf, sizeof buf, &needed) == FO_OK, "%s", fo_last_error());
  CHECK(strcmp(buf, "dir/allreduce-ctas8-w4-bf16.json") == 0 && needed == strlen(buf) + 1, "\"%s\", needed %zu", buf,
        needed);
  CHECK(fo_allreduce_curve_path("d", 0, 2, FO_DTYPE_FP16, buf, sizeof buf, NULL) == FO_OK, "%s", fo_last_error());
  CHECK(strcmp(buf, "d/allreduce-ctasdefault-w2-fp16.json") == 0, "\"%s\"", buf);
  CHECK(fo_allreduce_curve_path("d", -1, 2, FO_DTYPE_BF16, buf, sizeof buf, NULL) == FO_INVALID_ARGUMENT &&
            strstr(fo_last_error(), "nccl_ctas = -1"),
        "a negative CTA budget: %s", fo_last_error());
  CHECK(fo_allreduce_curve_path(NULL, 0, 2, FO_DTYPE_BF16, buf, sizeof buf, NULL) == FO_INVALID_ARGUMENT &&
            strstr(fo_last_error(), "dir"),
        "NULL dir: %s", fo_last_error());
  CHECK(fo_allreduce_curve_path("d", 0, 2, (fo_dtype)7, buf, sizeof buf, NULL) == FO_INVALID_ARGUMENT,
        "a bad dtype: %s", fo_last_error());
  CHECK(fo_measure_allreduce_curve(NULL, FO_DTYPE_BF16, 0, 256, 10, "x.json") == FO_INVALID_ARGUMENT &&
            strstr(fo_last_error(), "comm"),
        "NULL comm: %s", fo_last_error());
  CHECK(fo_measure_allreduce_curve(NULL, FO_DTYPE_BF16, 0, 256, 10, NULL) == FO_INVALID_ARGUMENT &&
            strstr(fo_last_error(), "path"),
        "NULL path: %s", fo_last_error());
}

/* The defaults equal GemmAllReduceOptions{}'s (flashoverlap.h: Auto, 8 SMs,
 * 30 s, no m check, no curves, no tuning cache); struct_size's rules. */
static void test_options(void) {
  fo_gemm_allreduce_options o;
  memset(&o, 0xab, sizeof o);
  EXPECT_OK(fo_gemm_allreduce_options_default(&o, sizeof o));
  CHECK(o.struct_size == sizeof o, "struct_size = %zu", o.struct_size);
  CHECK(o.path == FO_PATH_AUTO, "path = %d", (int)o.path);
  CHECK(o.nccl_sms == 8, "nccl_sms = %d", (int)o.nccl_sms);
  CHECK(o.wait_timeout_s == 30.0, "wait_timeout_s = %g", o.wait_timeout_s);
  CHECK(o.check_m == 0, "check_m = %d", (int)o.check_m);
  CHECK(o.reserved_ == 0, "reserved_ = %d", (int)o.reserved_);
  CHECK(o.curves == NULL, "curves = %p", (const void*)o.curves);
  CHECK(o.tuning_cache == NULL, "tuning_cache = %p", (const void*)o.tuning_cache);
  {
    /* A caller of version 1 (no tuning_cache: 40 bytes): the library writes
     * only those, and creating with them reads only those. */
    fo_gemm_allreduce_options v1;
    memset(&v1, 0xab, sizeof v1);
    EXPECT_OK(fo_gemm_allreduce_options_default(&v1, 40));
    CHECK(v1.struct_size == 40 && v1.nccl_sms == 8, "v1: struct_size %zu", v1.struct_size);
    unsigned char after[8];
    memcpy(after, (const unsigned char*)&v1 + 40, 8);
    int untouched = 1;
    for (int i = 0; i < 8; ++i) untouched &= after[i] == 0xab;
    CHECK(untouched, "the bytes past a version-1 caller's struct were written");
    fo_gemm_allreduce_t none = NULL;
    EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &v1, &none), "fo_gemm_allreduce_create",
                   "comm is NULL"); /* (its options accepted: the communicator's refusal) */
  }

  EXPECT_INVALID(fo_gemm_allreduce_options_default(NULL, sizeof o), "fo_gemm_allreduce_options_default",
                 "options is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_options_default(&o, 8), "fo_gemm_allreduce_options_default", "struct_size = 8");

  /* A caller whose header has a field more (a later version): the library
   * writes its fields and zeroes the rest, and accepts them while zero. */
  struct later {
    fo_gemm_allreduce_options o;
    int64_t added;
  } l;
  memset(&l, 0xab, sizeof l);
  EXPECT_OK(fo_gemm_allreduce_options_default(&l.o, sizeof l));
  CHECK(l.o.struct_size == sizeof l && l.added == 0 && l.o.nccl_sms == 8, "struct_size %zu, added %lld",
        l.o.struct_size, (long long)l.added);
  fo_gemm_allreduce_t op = (fo_gemm_allreduce_t)&l; /* (garbage: must come back NULL) */
  /* (create checks its dtype and options before its communicator: with
   * comm NULL each refusal below is the options', and acceptance shows as
   * the communicator's refusal) */
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &l.o, &op), "fo_gemm_allreduce_create",
                 "comm is NULL");
  CHECK(op == NULL, "out not cleared on failure");
  l.added = 1;
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &l.o, &op), "fo_gemm_allreduce_create",
                 "does not know");
  o.struct_size = 16;
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_allreduce_create",
                 "options->struct_size = 16");
  EXPECT_OK(fo_gemm_allreduce_options_default(&o, sizeof o));
  o.path = 7;
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_allreduce_create",
                 "options->path = 7");
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, (fo_dtype)5, NULL, &op), "fo_gemm_allreduce_create",
                 "dtype = 5");
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_FP16, NULL, &op), "fo_gemm_allreduce_create",
                 "comm is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_create(NULL, 64, 64, 64, FO_DTYPE_FP16, NULL, NULL), "fo_gemm_allreduce_create",
                 "out is NULL");
}

/* The defaults equal GemmReduceScatterOptions{}'s (flashoverlap.h: Auto,
 * the standard layout, 8 SMs, 30 s, no m check); struct_size's rules, as
 * for the AllReduce's options; the paths and layouts it takes. */
static void test_rs_options(void) {
  fo_gemm_reducescatter_options o;
  fo_gemm_reducescatter_t op = (fo_gemm_reducescatter_t)&o; /* (garbage: must come back NULL) */
  memset(&o, 0xab, sizeof o);
  EXPECT_OK(fo_gemm_reducescatter_options_default(&o, sizeof o));
  CHECK(o.struct_size == sizeof o, "struct_size = %zu", o.struct_size);
  CHECK(o.path == FO_PATH_AUTO, "path = %d", (int)o.path);
  CHECK(o.layout == FO_RS_LAYOUT_STANDARD, "layout = %d", (int)o.layout);
  CHECK(o.nccl_sms == 8, "nccl_sms = %d", (int)o.nccl_sms);
  CHECK(o.wait_timeout_s == 30.0, "wait_timeout_s = %g", o.wait_timeout_s);
  CHECK(o.check_m == 0, "check_m = %d", (int)o.check_m);

  EXPECT_INVALID(fo_gemm_reducescatter_options_default(NULL, sizeof o), "fo_gemm_reducescatter_options_default",
                 "options is NULL");
  EXPECT_INVALID(fo_gemm_reducescatter_options_default(&o, 8), "fo_gemm_reducescatter_options_default",
                 "struct_size = 8 is below 32");
  EXPECT_INVALID(fo_gemm_reducescatter_options_default(&o, 31), "fo_gemm_reducescatter_options_default",
                 "struct_size = 31");
  CHECK(o.struct_size == sizeof o && o.nccl_sms == 8, "a refused default wrote the options");

  /* create checks its dtype and options before its communicator: with comm
   * NULL each refusal below is the options', and acceptance shows as the
   * communicator's refusal */
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "comm is NULL");
  CHECK(op == NULL, "out not cleared on failure");
  {
    /* A caller whose header has a field more (a later version). */
    struct later {
      fo_gemm_reducescatter_options o;
      int64_t added;
    } l;
    memset(&l, 0xab, sizeof l);
    EXPECT_OK(fo_gemm_reducescatter_options_default(&l.o, sizeof l));
    CHECK(l.o.struct_size == sizeof l && l.added == 0 && l.o.nccl_sms == 8 && l.o.layout == FO_RS_LAYOUT_STANDARD,
          "struct_size %zu, added %lld", l.o.struct_size, (long long)l.added);
    EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &l.o, &op),
                   "fo_gemm_reducescatter_create", "comm is NULL");
    l.added = 1;
    EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &l.o, &op),
                   "fo_gemm_reducescatter_create", "does not know");
  }
  o.struct_size = 24;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->struct_size = 24 is below 32");
  CHECK(strstr(fo_last_error(), "fo_gemm_reducescatter_options_default") != NULL,
        "the message does not name the function that fills the options: %s", fo_last_error());

  /* the paths: AUTO, SEQUENTIAL, SLOTS, NVLINK; the AllReduce's others refused by name */
  {
    static const int ok_paths[] = {FO_PATH_AUTO, FO_PATH_SEQUENTIAL, FO_PATH_SLOTS, FO_PATH_NVLINK};
    size_t i;
    for (i = 0; i < 4; ++i) {
      EXPECT_OK(fo_gemm_reducescatter_options_default(&o, sizeof o));
      o.path = ok_paths[i];
      o.layout = FO_RS_LAYOUT_SUBTILE;
      EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_FP16, &o, &op),
                     "fo_gemm_reducescatter_create", "comm is NULL");
    }
  }
  EXPECT_OK(fo_gemm_reducescatter_options_default(&o, sizeof o));
  o.path = FO_PATH_ROW_BANDS;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->path = 2 (FO_PATH_ROW_BANDS) is not a GemmReduceScatter path");
  o.path = FO_PATH_OWNERS;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->path = 4 (FO_PATH_OWNERS)");
  o.path = 7;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->path = 7 is not an fo_path");
  CHECK(strstr(fo_last_error(), "FO_PATH_SLOTS 3") != NULL, "the message does not list the paths: %s", fo_last_error());
  o.path = FO_PATH_AUTO;
  o.layout = 2;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->layout = 2 is not an fo_rs_layout");
  o.layout = -1;
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_BF16, &o, &op),
                 "fo_gemm_reducescatter_create", "options->layout = -1");
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, (fo_dtype)5, NULL, &op),
                 "fo_gemm_reducescatter_create", "dtype = 5");
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_FP16, NULL, &op),
                 "fo_gemm_reducescatter_create", "comm is NULL");
  EXPECT_INVALID(fo_gemm_reducescatter_create(NULL, 64, 64, 64, FO_DTYPE_FP16, NULL, NULL),
                 "fo_gemm_reducescatter_create", "out is NULL");
  CHECK(op == NULL, "out not cleared on failure");
}

/* The defaults equal GemmAllToAllOptions{}'s (flashoverlap.h: Auto, 8 SMs,
 * 30 s); struct_size's rules, as for the other options; the paths it takes
 * (those of GemmReduceScatter). create checks its dtype and options before
 * its communicator: with comm NULL each refusal below is the options', and
 * acceptance shows as the communicator's refusal. */
static void test_a2a_options(void) {
  fo_gemm_alltoall_options o;
  fo_gemm_alltoall_t op = (fo_gemm_alltoall_t)&o; /* (garbage: must come back NULL) */
  memset(&o, 0xab, sizeof o);
  EXPECT_OK(fo_gemm_alltoall_options_default(&o, sizeof o));
  CHECK(o.struct_size == sizeof o, "struct_size = %zu", o.struct_size);
  CHECK(o.path == FO_PATH_AUTO, "path = %d", (int)o.path);
  CHECK(o.nccl_sms == 8, "nccl_sms = %d", (int)o.nccl_sms);
  CHECK(o.wait_timeout_s == 30.0, "wait_timeout_s = %g", o.wait_timeout_s);
  CHECK(o.exchange_timeout_s == 120.0, "exchange_timeout_s = %g", o.exchange_timeout_s);
  CHECK(o.experts == 1, "experts = %d", (int)o.experts);
  CHECK(o.input == FO_INPUT_SAME && o.scales == FO_SCALES_NONE, "input %d, scales %d", (int)o.input, (int)o.scales);
  {
    /* A caller of the second version (experts, no input and scales): its 40 bytes written, nothing past them;
     * accepted (16-bit inputs). */
    unsigned char v2[48];
    memset(v2, 0xab, sizeof v2);
    EXPECT_OK(fo_gemm_alltoall_options_default((fo_gemm_alltoall_options*)v2, 40));
    CHECK(v2[40] == 0xab && v2[47] == 0xab && ((fo_gemm_alltoall_options*)v2)->experts == 1,
          "the second version's default wrote past its 40 bytes");
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, (fo_gemm_alltoall_options*)v2, &op),
                   "fo_gemm_alltoall_create", "comm is NULL");
  }
  {  /* FP8 inputs: the kinds are read (and refused by value), then the communicator */
    fo_gemm_alltoall_options f;
    EXPECT_OK(fo_gemm_alltoall_options_default(&f, sizeof f));
    f.input = FO_INPUT_E4M3, f.scales = FO_SCALES_ROW_WISE;
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &f, &op), "fo_gemm_alltoall_create",
                   "comm is NULL");
    f.input = 7;
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &f, &op), "fo_gemm_alltoall_create",
                   "options->input = 7 is not an fo_input_type");
    f.input = FO_INPUT_E4M3, f.scales = 3;
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &f, &op), "fo_gemm_alltoall_create",
                   "options->scales = 3 is not an fo_scale_kind");
    EXPECT_INVALID(fo_gemm_alltoall_run_scaled(NULL, NULL, NULL, NULL, NULL, 0, 1, NULL, NULL, NULL, NULL),
                   "fo_gemm_alltoall_run_scaled", "op is NULL");
  }
  {
    /* A caller of the first version (no experts field): its 32 bytes written, nothing past them; accepted. */
    unsigned char v1[48];
    memset(v1, 0xab, sizeof v1);
    EXPECT_OK(fo_gemm_alltoall_options_default((fo_gemm_alltoall_options*)v1, 32));
    CHECK(v1[32] == 0xab && v1[47] == 0xab && ((fo_gemm_alltoall_options*)v1)->nccl_sms == 8,
          "the first version's default wrote past its 32 bytes");
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, (fo_gemm_alltoall_options*)v1, &op),
                   "fo_gemm_alltoall_create", "comm is NULL");
  }

  EXPECT_INVALID(fo_gemm_alltoall_options_default(NULL, sizeof o), "fo_gemm_alltoall_options_default",
                 "options is NULL");
  EXPECT_INVALID(fo_gemm_alltoall_options_default(&o, 8), "fo_gemm_alltoall_options_default",
                 "struct_size = 8 is below 32 (pass sizeof *options)");
  EXPECT_INVALID(fo_gemm_alltoall_options_default(&o, 31), "fo_gemm_alltoall_options_default", "struct_size = 31");
  CHECK(o.struct_size == sizeof o && o.nccl_sms == 8, "a refused default wrote the options");

  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_alltoall_create",
                 "comm is NULL");
  CHECK(op == NULL, "out not cleared on failure");
  {
    /* A caller whose header has a field more (a later version). */
    struct later {
      fo_gemm_alltoall_options o;
      int64_t added;
    } l;
    memset(&l, 0xab, sizeof l);
    EXPECT_OK(fo_gemm_alltoall_options_default(&l.o, sizeof l));
    CHECK(l.o.struct_size == sizeof l && l.added == 0 && l.o.nccl_sms == 8 && l.o.path == FO_PATH_AUTO,
          "struct_size %zu, added %lld", l.o.struct_size, (long long)l.added);
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &l.o, &op),
                   "fo_gemm_alltoall_create", "comm is NULL");
    l.added = 1;
    EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &l.o, &op),
                   "fo_gemm_alltoall_create",
                   "options->struct_size = 56: the options set fields that this library (flashoverlap");
    CHECK(strstr(fo_last_error(), "options of 48 bytes) does not know") != NULL, "message \"%s\"", fo_last_error());
  }
  o.struct_size = 16;
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_alltoall_create",
                 "options->struct_size = 16 is below 32 (fill the options with "
                 "fo_gemm_alltoall_options_default(&o, sizeof o) first)");

  /* the paths: AUTO, SEQUENTIAL, SLOTS, NVLINK; the AllReduce's others refused by name */
  {
    static const int ok_paths[] = {FO_PATH_AUTO, FO_PATH_SEQUENTIAL, FO_PATH_SLOTS, FO_PATH_NVLINK};
    size_t i;
    for (i = 0; i < 4; ++i) {
      EXPECT_OK(fo_gemm_alltoall_options_default(&o, sizeof o));
      o.path = ok_paths[i];
      EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_FP16, &o, &op),
                     "fo_gemm_alltoall_create", "comm is NULL");
    }
  }
  EXPECT_OK(fo_gemm_alltoall_options_default(&o, sizeof o));
  o.path = FO_PATH_ROW_BANDS;
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_alltoall_create",
                 "options->path = 2 (FO_PATH_ROW_BANDS) is not a GemmAllToAll path (FO_PATH_AUTO 0, "
                 "FO_PATH_SEQUENTIAL 1, FO_PATH_SLOTS 3, FO_PATH_NVLINK 5)");
  o.path = FO_PATH_OWNERS;
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_alltoall_create",
                 "options->path = 4 (FO_PATH_OWNERS) is not a GemmAllToAll path");
  o.path = -1;
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_BF16, &o, &op), "fo_gemm_alltoall_create",
                 "options->path = -1 is not an fo_path of GemmAllToAll");
  o.path = FO_PATH_AUTO;
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, (fo_dtype)5, &o, &op), "fo_gemm_alltoall_create",
                 "dtype = 5");
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_FP16, NULL, &op), "fo_gemm_alltoall_create",
                 "comm is NULL");
  EXPECT_INVALID(fo_gemm_alltoall_create(NULL, 64, 64, 1, 64, 64, FO_DTYPE_FP16, NULL, NULL),
                 "fo_gemm_alltoall_create", "out is NULL");
  CHECK(op == NULL, "out not cleared on failure");
}

/* Every function: a NULL handle or required pointer is FO_INVALID_ARGUMENT
 * naming the function and the argument; out-handles come back NULL. */
static void test_null_arguments(void) {
  int dummy = 0;
  fo_comm_t comm = (fo_comm_t)&dummy;
  EXPECT_INVALID(fo_comm_adopt(NULL, &comm), "fo_comm_adopt", "nccl_comm is NULL");
  CHECK(comm == NULL, "fo_comm_adopt: out not cleared on failure");
  EXPECT_INVALID(fo_comm_adopt(&dummy, NULL), "fo_comm_adopt", "out is NULL");
  EXPECT_INVALID(fo_comm_from_env(NULL), "fo_comm_from_env", "out is NULL");

  unsigned char id[FO_UNIQUE_ID_BYTES] = {0};
  comm = (fo_comm_t)&dummy;
  EXPECT_INVALID(fo_comm_from_unique_id(NULL, sizeof id, 0, 1, &comm), "fo_comm_from_unique_id", "id is NULL");
  CHECK(comm == NULL, "fo_comm_from_unique_id: out not cleared on failure");
  EXPECT_INVALID(fo_comm_from_unique_id(id, sizeof id, 0, 1, NULL), "fo_comm_from_unique_id", "out is NULL");
  EXPECT_INVALID(fo_comm_from_unique_id(id, 64, 0, 1, &comm), "fo_comm_from_unique_id", "id_size = 64");
  EXPECT_INVALID(fo_comm_from_unique_id(id, sizeof id, 2, 2, &comm), "fo_comm_from_unique_id", "rank = 2, world = 2");
  EXPECT_INVALID(fo_comm_from_unique_id(id, sizeof id, 0, 0, &comm), "fo_comm_from_unique_id", "world = 0");
  EXPECT_INVALID(fo_unique_id(NULL, sizeof id), "fo_unique_id", "id is NULL");
  EXPECT_INVALID(fo_unique_id(id, 127), "fo_unique_id", "id_size = 127");

  int v = 0;
  void* p = NULL;
  EXPECT_INVALID(fo_comm_rank(NULL, &v), "fo_comm_rank", "comm is NULL");
  EXPECT_INVALID(fo_comm_world(NULL, &v), "fo_comm_world", "comm is NULL");
  EXPECT_INVALID(fo_comm_nccl(NULL, &p), "fo_comm_nccl", "comm is NULL");
  EXPECT_OK(fo_comm_destroy(NULL));

  char buf[8];
  size_t needed = 0;
  int64_t i = 0;
  fo_dtype d;
  EXPECT_INVALID(fo_gemm_allreduce_run(NULL, buf, buf, buf, 1, NULL, 0), "fo_gemm_allreduce_run", "op is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_run_rmsnorm(NULL, buf, buf, buf, buf, 1e-5f, buf, NULL, 1, NULL),
                 "fo_gemm_allreduce_run_rmsnorm", "op is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_prepare(NULL, 1), "fo_gemm_allreduce_prepare", "op is NULL");
  {
    int slot = 0;
    EXPECT_INVALID(fo_gemm_allreduce_register_output(NULL, buf, 0, &slot), "fo_gemm_allreduce_register_output",
                   "op is NULL");
    EXPECT_INVALID(fo_gemm_allreduce_run_registered(NULL, buf, buf, 0, 1, NULL), "fo_gemm_allreduce_run_registered",
                   "op is NULL");
  }
  EXPECT_INVALID(fo_gemm_allreduce_plan(NULL, 1, buf, sizeof buf, &needed), "fo_gemm_allreduce_plan", "op is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_check(NULL), "fo_gemm_allreduce_check", "op is NULL");
  EXPECT_INVALID(fo_gemm_allreduce_shape(NULL, &i, &i, &i, &d), "fo_gemm_allreduce_shape", "op is NULL");
  EXPECT_OK(fo_gemm_allreduce_destroy(NULL));

  {
    int w = 0;
    int64_t rows[2];
    EXPECT_INVALID(fo_gemm_reducescatter_run(NULL, buf, buf, buf, 1, NULL, 0), "fo_gemm_reducescatter_run",
                   "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run_rmsnorm(NULL, buf, buf, buf, buf, 1e-5f, buf, NULL, 1, NULL),
                   "fo_gemm_reducescatter_run_rmsnorm", "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_rows_out(NULL, 1, &i), "fo_gemm_reducescatter_rows_out", "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_rows(NULL, 1, rows, 2, &needed), "fo_gemm_reducescatter_rows", "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_all_gather_rows(NULL, buf, buf, 2, NULL),
                   "fo_gemm_reducescatter_all_gather_rows", "op is NULL");
    /* (the handle is checked first: NULL buffers too are the handle's refusal) */
    EXPECT_INVALID(fo_gemm_reducescatter_all_gather_rows(NULL, NULL, NULL, 2, NULL),
                   "fo_gemm_reducescatter_all_gather_rows", "op is NULL");
    CHECK(strcmp(fo_last_error(), "fo_gemm_reducescatter_all_gather_rows: op is NULL") == 0, "message \"%s\"",
          fo_last_error());
    EXPECT_INVALID(fo_gemm_reducescatter_prepare(NULL, 1), "fo_gemm_reducescatter_prepare", "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_plan(NULL, 1, buf, sizeof buf, &needed), "fo_gemm_reducescatter_plan",
                   "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_check(NULL), "fo_gemm_reducescatter_check", "op is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_shape(NULL, &i, &i, &i, &d, &w), "fo_gemm_reducescatter_shape",
                   "op is NULL");
    EXPECT_OK(fo_gemm_reducescatter_destroy(NULL));
  }

  {
    int w = 0, topk = 0;
    int64_t counts[1] = {0};
    fo_alltoall_routing r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.send_counts = counts;
    r.recv_counts = counts;
    EXPECT_INVALID(fo_gemm_alltoall_run(NULL, buf, buf, &r, buf, 0, 1, NULL, NULL), "fo_gemm_alltoall_run",
                   "op is NULL");
    /* (the handle is checked first: a NULL routing and buffers too are the handle's refusal) */
    EXPECT_INVALID(fo_gemm_alltoall_run(NULL, NULL, NULL, NULL, NULL, 0, 0, NULL, NULL), "fo_gemm_alltoall_run",
                   "op is NULL");
    CHECK(strcmp(fo_last_error(), "fo_gemm_alltoall_run: op is NULL") == 0, "message \"%s\"", fo_last_error());
    EXPECT_INVALID(fo_gemm_alltoall_last_plan(NULL, buf, sizeof buf, &needed), "fo_gemm_alltoall_last_plan",
                   "op is NULL");
    EXPECT_INVALID(fo_gemm_alltoall_last_plan(NULL, NULL, 0, NULL), "fo_gemm_alltoall_last_plan", "op is NULL");
    EXPECT_INVALID(fo_gemm_alltoall_check(NULL), "fo_gemm_alltoall_check", "op is NULL");
    EXPECT_INVALID(fo_gemm_alltoall_shape(NULL, &i, &i, &topk, &i, &i, &d, &w), "fo_gemm_alltoall_shape",
                   "op is NULL");
    EXPECT_INVALID(fo_gemm_alltoall_shape(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "fo_gemm_alltoall_shape",
                   "op is NULL");
    EXPECT_OK(fo_gemm_alltoall_destroy(NULL));
  }
}

/* The message stays put until the next call that returns a status, and a
 * successful call resets it. */
static void test_last_error_lifetime(void) {
  int v;
  EXPECT_INVALID(fo_comm_rank(NULL, &v), "fo_comm_rank", "comm is NULL");
  const char* m = fo_last_error();
  (void)fo_version();
  (void)fo_status_string(FO_ERROR);
  (void)fo_c_abi_version();
  CHECK(m == fo_last_error() && strcmp(m, "fo_comm_rank: comm is NULL") == 0,
        "the message moved or changed under the queries: \"%s\"", fo_last_error());
  fo_gemm_allreduce_options o;
  EXPECT_OK(fo_gemm_allreduce_options_default(&o, sizeof o)); /* (checks "" too) */
  EXPECT_INVALID(fo_comm_world(NULL, &v), "fo_comm_world", "comm is NULL");
  EXPECT_OK(fo_comm_destroy(NULL));
}

/* ---- the message is per thread ---- */

struct thread_result {
  int started_empty;     /* "" on entry, whatever the main thread's last error */
  int own_message;       /* its failure's message is its own */
  int cleared;           /* its success cleared its own */
  int mixups;            /* the hammer: a message that was not this thread's */
  int id;
};

static void* message_thread(void* arg) {
  struct thread_result* r = (struct thread_result*)arg;
  int v;
  r->started_empty = fo_last_error()[0] == '\0';
  r->own_message = fo_comm_world(NULL, &v) == FO_INVALID_ARGUMENT &&
                   strcmp(fo_last_error(), "fo_comm_world: comm is NULL") == 0;
  r->cleared = fo_comm_destroy(NULL) == FO_OK && fo_last_error()[0] == '\0';
  return NULL;
}

/* Threads failing in different ways at the same time: each sees its own. */
static void* hammer_thread(void* arg) {
  struct thread_result* r = (struct thread_result*)arg;
  unsigned char id[4];
  int it;
  char want[64];
  snprintf(want, sizeof want, "fo_unique_id: id_size = %d,", r->id);
  for (it = 0; it < 5000; ++it) {
    const fo_status s = fo_unique_id(id, (size_t)r->id);
    if (s != FO_INVALID_ARGUMENT || strncmp(fo_last_error(), want, strlen(want)) != 0) ++r->mixups;
    if (it % 7 == 0 && (fo_comm_destroy(NULL) != FO_OK || fo_last_error()[0] != '\0')) ++r->mixups;
  }
  return NULL;
}

static void test_threads(void) {
  int v, t;
  struct thread_result r;
  struct thread_result h[4];
  pthread_t th[4];
  EXPECT_INVALID(fo_comm_rank(NULL, &v), "fo_comm_rank", "comm is NULL");
  const char* mine = fo_last_error();

  memset(&r, 0, sizeof r);
  CHECK(pthread_create(&th[0], NULL, message_thread, &r) == 0, "pthread_create");
  pthread_join(th[0], NULL);
  CHECK(r.started_empty, "a second thread saw the first thread's message");
  CHECK(r.own_message, "a second thread's failure did not give it its own message");
  CHECK(r.cleared, "a second thread's success did not clear its message");
  CHECK(mine == fo_last_error() && strcmp(fo_last_error(), "fo_comm_rank: comm is NULL") == 0,
        "the other thread changed this thread's message: \"%s\"", fo_last_error());

  for (t = 0; t < 4; ++t) {
    memset(&h[t], 0, sizeof h[t]);
    h[t].id = t; /* id_size t: a message of its own */
    CHECK(pthread_create(&th[t], NULL, hammer_thread, &h[t]) == 0, "pthread_create");
  }
  for (t = 0; t < 4; ++t) {
    pthread_join(th[t], NULL);
    CHECK(h[t].mixups == 0, "thread %d saw %d messages that were not its own", t, h[t].mixups);
  }
  CHECK(strcmp(fo_last_error(), "fo_comm_rank: comm is NULL") == 0, "after the hammer: \"%s\"", fo_last_error());
}

/* Without a GPU, a communicator from the environment is FO_NO_GPU saying
 * why; with one, it is a communicator of one rank. */
static void test_from_env(void) {
  int dummy = 0;
  fo_comm_t comm = (fo_comm_t)&dummy;
  const fo_status s = fo_comm_from_env(&comm);
  if (s == FO_OK) {
    int rank = -1, world = -1;
    printf("fo_comm_from_env: a GPU is here: the no-GPU checks do not apply\n");
    EXPECT_OK(fo_comm_rank(comm, &rank));
    EXPECT_OK(fo_comm_world(comm, &world));
    CHECK(rank == 0 && world >= 1, "rank %d, world %d", rank, world);
    EXPECT_OK(fo_comm_destroy(comm));
    return;
  }
  printf("fo_comm_from_env without a GPU: %s: %s\n", fo_status_string(s), fo_last_error());
  EXPECT_STATUS(s, FO_NO_GPU, "fo_comm_from_env", "no usable ");
  CHECK(strstr(fo_last_error(), "GPU") && (strstr(fo_last_error(), "driver") || strstr(fo_last_error(), "device")),
        "the message does not say what is missing: %s", fo_last_error());
  CHECK(comm == NULL, "out not cleared on failure");
  CHECK(required_gpus() == 0, "FO_REQUIRE_GPUS=%d promises a GPU, but: %s", required_gpus(), fo_last_error());
  {
    /* fo_unique_id needs no GPU in some NCCL versions: either outcome, but
     * a failure says why. */
    unsigned char id[FO_UNIQUE_ID_BYTES];
    const fo_status u = fo_unique_id(id, sizeof id);
    printf("fo_unique_id without a GPU: %s%s%s\n", fo_status_string(u), u == FO_OK ? "" : ": ", fo_last_error());
    CHECK(u == FO_OK ? fo_last_error()[0] == '\0' : (u != FO_INVALID_ARGUMENT && fo_last_error()[0] != '\0'),
          "fo_unique_id: %s \"%s\"", fo_status_string(u), fo_last_error());
    if (u == FO_OK) {
      /* the other way to a communicator, refused alike: no op of any
       * kind can be built here (each needs one) */
      comm = (fo_comm_t)&dummy;
      EXPECT_STATUS(fo_comm_from_unique_id(id, sizeof id, 0, 1, &comm), FO_NO_GPU, "fo_comm_from_unique_id",
                    "no usable Hopper (sm_90) GPU");
      CHECK(comm == NULL, "fo_comm_from_unique_id: out not cleared on failure");
    }
  }
}

/* ------------------------------------------------------------------ GPU */

/* The driver API, loaded at run time (no cuda.h: the few types are these). */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;
static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*GetErrorString)(CUresult, const char**);
} cu;

static int load_symbol(void* lib, const char* name, void* fn_ptr) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "libcuda.so.1 has no %s\n", name);
    return 0;
  }
  memcpy(fn_ptr, &p, sizeof p); /* (a function pointer from dlsym's void*) */
  return 1;
}

static int load_driver(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  return load_symbol(lib, "cuInit", &cu.Init) && load_symbol(lib, "cuDeviceGet", &cu.DeviceGet) &&
         load_symbol(lib, "cuDevicePrimaryCtxRetain", &cu.DevicePrimaryCtxRetain) &&
         load_symbol(lib, "cuDevicePrimaryCtxRelease_v2", &cu.DevicePrimaryCtxRelease) &&
         load_symbol(lib, "cuCtxSetCurrent", &cu.CtxSetCurrent) &&
         load_symbol(lib, "cuCtxSynchronize", &cu.CtxSynchronize) && load_symbol(lib, "cuMemAlloc_v2", &cu.MemAlloc) &&
         load_symbol(lib, "cuMemFree_v2", &cu.MemFree) && load_symbol(lib, "cuMemcpyHtoD_v2", &cu.MemcpyHtoD) &&
         load_symbol(lib, "cuMemcpyDtoH_v2", &cu.MemcpyDtoH) && load_symbol(lib, "cuMemsetD8_v2", &cu.MemsetD8) &&
         load_symbol(lib, "cuStreamCreate", &cu.StreamCreate) &&
         load_symbol(lib, "cuStreamSynchronize", &cu.StreamSynchronize) &&
         load_symbol(lib, "cuStreamDestroy_v2", &cu.StreamDestroy) &&
         load_symbol(lib, "cuGetErrorString", &cu.GetErrorString);
}

/* A driver call that must succeed; the test stops where one does not. */
#define CU(call)                                                                     \
  do {                                                                               \
    const CUresult r_ = (call);                                                      \
    if (r_ != 0) {                                                                   \
      const char* s_ = "?";                                                          \
      cu.GetErrorString(r_, &s_);                                                    \
      fprintf(stderr, "%s:%d: %s: CUDA driver error %d (%s)\n", __FILE__, __LINE__, #call, r_, s_); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* A call of the library that must succeed; the test stops where one does not. */
#define FO(call)                                                                                  \
  do {                                                                                            \
    const fo_status s_ = (call);                                                                  \
    if (s_ != FO_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, fo_status_string(s_), fo_last_error()); \
      exit(1);                                                                                    \
    }                                                                                             \
    CHECK(fo_last_error()[0] == '\0', "%s: last error after success: \"%s\"", #call, fo_last_error()); \
  } while (0)

/* 16-bit floats (exact for the small integers and quarters used here; round
 * to nearest even otherwise, normal range only). */
static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}
static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
static uint16_t to_16(fo_dtype d, float f) {
  const uint32_t x = f32_bits(f);
  if (d == FO_DTYPE_BF16) return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  {
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    int e = (int)((x >> 23) & 0xffu) - 127 + 15;
    uint32_t m = (x & 0x7fffffu) >> 13;
    const uint32_t rem = x & 0x1fffu;
    if (((x >> 23) & 0xffu) == 0 || e <= 0) return sign; /* zero (nothing here is subnormal) */
    if (rem > 0x1000u || (rem == 0x1000u && (m & 1u))) {
      if (++m == 0x400u) {
        m = 0;
        ++e;
      }
    }
    return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)m);
  }
}
static float from_16(fo_dtype d, uint16_t h) {
  if (d == FO_DTYPE_BF16) return bits_f32((uint32_t)h << 16);
  {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)m, -24);
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
  }
}

static uint64_t g_rng;
static int rand_int(int lo, int hi) { /* uniform in [lo, hi] */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (int)((g_rng >> 33) % (uint64_t)(hi - lo + 1));
}

enum { MAX_M = 300, N = 256, K = 128, LD_PAD = 16 };

struct gpu {
  CUstream stream;
  /* host: a (MAX_M x K), b (N x K) as small integers; their products' sums */
  int a[MAX_M * K], b[N * K], ab[MAX_M * N], residual[MAX_M * N];
  float weight[N];
  uint16_t host16[MAX_M * (N + LD_PAD)];
  CUdeviceptr da, db, dout, dres, dres_out, dweight;
  CUdeviceptr dfull; /* MAX_M x N: all_gather_rows' output */
  CUdeviceptr dtok;  /* MAX_M int32: GemmAllToAll's tokens_out */
};
static struct gpu g;

static void upload_ints(fo_dtype d, CUdeviceptr dst, const int* v, size_t count) {
  size_t i;
  for (i = 0; i < count; ++i) g.host16[i] = to_16(d, (float)v[i]);
  CU(cu.MemcpyHtoD(dst, g.host16, count * 2));
}

/* out (count x N, ld) against rows `rows` of a * b^T (NULL: rows 0, 1, ...),
 * bitwise (the sums are exact); the pad columns of a padded ld untouched
 * (0xffff). */
static void expect_gemm_rows(fo_dtype d, int64_t count, const int64_t* rows, int64_t ld, const char* what) {
  int64_t i, j, bad = 0, pad_bad = 0;
  CU(cu.StreamSynchronize(g.stream));
  CU(cu.MemcpyDtoH(g.host16, g.dout, (size_t)(count * ld) * 2));
  for (i = 0; i < count; ++i) {
    const int64_t row = rows ? rows[i] : i;
    for (j = 0; j < ld; ++j) {
      const uint16_t x = g.host16[i * ld + j];
      if (j >= N) {
        pad_bad += x != 0xffffu;
        continue;
      }
      if (x != to_16(d, (float)g.ab[row * N + j])) {
        if (!bad)
          fprintf(stderr, "%s: first difference at row %lld (of C: %lld), col %lld: %g (0x%04x), want %d\n", what,
                  (long long)i, (long long)row, (long long)j, (double)from_16(d, x), x, g.ab[row * N + j]);
        ++bad;
      }
    }
  }
  CHECK(bad == 0, "%s: %lld of %lld elements differ", what, (long long)bad, (long long)(count * N));
  CHECK(pad_bad == 0, "%s: %lld elements beyond n written", what, (long long)pad_bad);
}

static void expect_gemm(fo_dtype d, int64_t m, int64_t ld, const char* what) { expect_gemm_rows(d, m, NULL, ld, what); }

/* full (g.dfull, MAX_M x N, filled with 0xff bytes before the call) after an
 * all_gather_rows of m rows: row i is row i of a * b^T (+ the residual's row
 * i where add is set: the gathered residual_out of a run_rmsnorm), bitwise
 * (the sums are exact), for every i < m, in C's order; the rows past m
 * untouched. */
static void expect_gathered(fo_dtype d, int64_t m, const int* add, const char* what) {
  int64_t i, j, bad = 0, past_bad = 0;
  CU(cu.CtxSynchronize());
  CU(cu.MemcpyDtoH(g.host16, g.dfull, (size_t)MAX_M * N * 2));
  for (i = 0; i < MAX_M; ++i)
    for (j = 0; j < N; ++j) {
      const uint16_t x = g.host16[i * N + j];
      int want;
      if (i >= m) {
        past_bad += x != 0xffffu;
        continue;
      }
      want = g.ab[i * N + j] + (add ? add[i * N + j] : 0);
      if (x != to_16(d, (float)want)) {
        if (!bad)
          fprintf(stderr, "%s: all_gather_rows: first difference at row %lld, col %lld: %g (0x%04x), want %d\n", what,
                  (long long)i, (long long)j, (double)from_16(d, x), x, want);
        ++bad;
      }
    }
  CHECK(bad == 0, "%s: all_gather_rows: %lld of %lld elements differ from the full reference", what, (long long)bad,
        (long long)(m * N));
  CHECK(past_bad == 0, "%s: all_gather_rows: %lld elements past row m written", what, (long long)past_bad);
}

/* all_gather_rows(src: this rank's rows_out(m) x N) into g.dfull, cleared first. */
static void gather_into_full(fo_gemm_reducescatter_t op, CUdeviceptr src, int64_t m, CUstream stream) {
  CU(cu.MemsetD8(g.dfull, 0xff, (size_t)MAX_M * N * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_reducescatter_all_gather_rows(op, (const void*)src, (void*)g.dfull, m, stream));
}

/* After a run_rmsnorm of `count` output rows (rows `rows` of C; NULL: 0, 1,
 * ...): residual_out (g.dres_out) = ab + residual exactly, and out (g.dout)
 * against h's RMSNorm. The residual's row i goes with output row i. */
static void expect_rmsnorm(fo_dtype d, int64_t count, const int64_t* rows, float eps, const char* name) {
  int64_t i, j, bad_h = 0, bad_out = 0;
  CU(cu.StreamSynchronize(g.stream));
  CU(cu.MemcpyDtoH(g.host16, g.dres_out, (size_t)(count * N) * 2));
  for (i = 0; i < count; ++i)
    for (j = 0; j < N; ++j)
      bad_h += g.host16[i * N + j] != to_16(d, (float)(g.ab[(rows ? rows[i] : i) * N + j] + g.residual[i * N + j]));
  CU(cu.MemcpyDtoH(g.host16, g.dout, (size_t)(count * N) * 2));
  for (i = 0; i < count; ++i) {
    const int64_t row = rows ? rows[i] : i;
    double ss = 0;
    for (j = 0; j < N; ++j) {
      const double h = g.ab[row * N + j] + g.residual[i * N + j];
      ss += h * h;
    }
    for (j = 0; j < N; ++j) {
      const double h = g.ab[row * N + j] + g.residual[i * N + j];
      const double ref = h / sqrt(ss / N + eps) * g.weight[j];
      const double x = from_16(d, g.host16[i * N + j]);
      /* the output's rounding (2^-8 bf16, 2^-11 fp16 relative) twice over, and fp32's */
      if (!(fabs(x - ref) <= 1e-3 + fabs(ref) / 64)) {
        if (!bad_out)
          fprintf(stderr, "%s rmsnorm: first beyond the bound at row %lld, col %lld: %g, want %g\n", name,
                  (long long)i, (long long)j, x, ref);
        ++bad_out;
      }
    }
  }
  CHECK(bad_h == 0, "%s rmsnorm: %lld residual_out elements differ from the reduced a b^T + residual", name,
        (long long)bad_h);
  CHECK(bad_out == 0, "%s rmsnorm: %lld of %lld out elements beyond 1e-3 + |ref|/64", name, (long long)bad_out,
        (long long)(count * N));
}

static void upload_norm_inputs(fo_dtype d) {
  int64_t j;
  upload_ints(d, g.dres, g.residual, (size_t)MAX_M * N);
  for (j = 0; j < N; ++j) g.host16[j] = to_16(d, g.weight[j]);
  CU(cu.MemcpyHtoD(g.dweight, g.host16, N * 2));
}

/* run for several m, a padded ld_out, and run_rmsnorm, on op. */
static void exercise(fo_gemm_allreduce_t op, fo_dtype d, const char* name) {
  static const int64_t ms[] = {1, 77, 128, 255, MAX_M};
  char what[128];
  size_t t;
  upload_ints(d, g.da, g.a, (size_t)MAX_M * K);
  upload_ints(d, g.db, g.b, (size_t)N * K);
  for (t = 0; t < sizeof ms / sizeof ms[0]; ++t) {
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    /* (every other call on the legacy default stream, NULL) */
    FO(fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, ms[t], t % 2 ? NULL : g.stream, 0));
    CU(cu.CtxSynchronize());
    snprintf(what, sizeof what, "%s, m = %lld", name, (long long)ms[t]);
    expect_gemm(d, ms[t], N, what);
  }
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 77, g.stream, N + LD_PAD));
  snprintf(what, sizeof what, "%s, m = 77, ld_out = n + %d", name, LD_PAD);
  expect_gemm(d, 77, N + LD_PAD, what);

  /* the registered-output form: g.dout (it outlives the op) as a slot, then a call into it */
  {
    int slot = -1;
    FO(fo_gemm_allreduce_register_output(op, (void*)g.dout, N + LD_PAD, &slot));
    CHECK(slot >= 0, "%s: register_output gave slot %d", name, slot);
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_allreduce_run_registered(op, (const void*)g.da, (const void*)g.db, slot, 128, g.stream));
    snprintf(what, sizeof what, "%s, run_registered, m = 128, ld_out = n + %d", name, LD_PAD);
    expect_gemm(d, 128, N + LD_PAD, what);
    EXPECT_INVALID(fo_gemm_allreduce_register_output(op, NULL, 0, &slot), "fo_gemm_allreduce_register_output",
                   "out is NULL");
    EXPECT_INVALID(fo_gemm_allreduce_run_registered(op, (const void*)g.da, NULL, slot, 128, g.stream),
                   "fo_gemm_allreduce_run_registered", "b is NULL");
  }

  /* run_rmsnorm: h = ab + residual exactly; out against h's RMSNorm */
  {
    const int64_t m = 77;
    const float eps = 1e-5f;
    upload_norm_inputs(d);
    FO(fo_gemm_allreduce_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, (const void*)g.dres,
                                     (const void*)g.dweight, eps, (void*)g.dout, (void*)g.dres_out, m, g.stream));
    /* residual_out optional */
    FO(fo_gemm_allreduce_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, (const void*)g.dres,
                                     (const void*)g.dweight, eps, (void*)g.dout, NULL, m, g.stream));
    expect_rmsnorm(d, m, NULL, eps, name);
  }
}

/* ---- GemmReduceScatter at world 1: each rank's rows of the sum are, at
 * one rank, rows(m) of a * b^T (every row, in order, in either layout) ---- */

static int64_t g_rows[MAX_M + 1];

/* This rank's rows for m, checked against the layout's definition (world 1:
 * rows_out(m) = m, rows 0, 1, ..., m - 1 in both layouts); returns rows_out. */
static int64_t rs_rows(fo_gemm_reducescatter_t op, int64_t m, const char* name) {
  int64_t out = -1, i, bad = 0, past;
  size_t needed = 0;
  FO(fo_gemm_reducescatter_rows_out(op, m, &out));
  FO(fo_gemm_reducescatter_rows(op, m, NULL, 0, &needed));
  CHECK(out == m && (int64_t)needed == out, "%s, m = %lld: rows_out %lld, rows needs %zu", name, (long long)m,
        (long long)out, needed);
  past = out < 0 ? 0 : out > MAX_M ? MAX_M : out;
  g_rows[past] = -7; /* (a sentinel past the rows; g_rows[MAX_M] is never written) */
  FO(fo_gemm_reducescatter_rows(op, m, g_rows, MAX_M, NULL));
  for (i = 0; i < past; ++i) bad += g_rows[i] != i;
  CHECK(bad == 0, "%s, m = %lld: %lld rows are not 0, 1, ... at world 1", name, (long long)m, (long long)bad);
  CHECK(g_rows[past] == -7, "%s, m = %lld: rows wrote past rows_out", name, (long long)m);
  return out;
}

static void exercise_rs(fo_gemm_reducescatter_t op, fo_dtype d, const char* name) {
  static const int64_t ms[] = {1, 77, 128, 255, MAX_M};
  char what[160];
  size_t t;
  upload_ints(d, g.da, g.a, (size_t)MAX_M * K);
  upload_ints(d, g.db, g.b, (size_t)N * K);
  for (t = 0; t < sizeof ms / sizeof ms[0]; ++t) {
    const int64_t rows = rs_rows(op, ms[t], name);
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    /* (every other call on the legacy default stream, NULL) */
    FO(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, ms[t],
                                 t % 2 ? NULL : g.stream, 0));
    CU(cu.CtxSynchronize());
    snprintf(what, sizeof what, "%s, m = %lld", name, (long long)ms[t]);
    expect_gemm_rows(d, rows, g_rows, N, what);
    /* the rows gathered back: the whole m x n (world 1: this rank's rows are all of them) */
    gather_into_full(op, g.dout, ms[t], t % 2 ? NULL : g.stream);
    expect_gathered(d, ms[t], NULL, what);
  }
  {
    const int64_t rows = rs_rows(op, 77, name);
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 77, g.stream, N + LD_PAD));
    snprintf(what, sizeof what, "%s, m = 77, ld_out = n + %d", name, LD_PAD);
    expect_gemm_rows(d, rows, g_rows, N + LD_PAD, what);
  }
  {
    const int64_t m = 255;
    const float eps = 1e-5f;
    const int64_t rows = rs_rows(op, m, name);
    upload_norm_inputs(d);
    /* residual_out optional: without it first, then with it (what is checked) */
    FO(fo_gemm_reducescatter_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, (const void*)g.dres,
                                         (const void*)g.dweight, eps, (void*)g.dout, NULL, m, g.stream));
    FO(fo_gemm_reducescatter_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, (const void*)g.dres,
                                         (const void*)g.dweight, eps, (void*)g.dout, (void*)g.dres_out, m, g.stream));
    snprintf(what, sizeof what, "%s, m = %lld", name, (long long)m);
    expect_rmsnorm(d, rows, g_rows, eps, what);
    /* a row-wise step's output gathered: residual_out (ab + residual, row i with output row i) */
    gather_into_full(op, g.dres_out, m, g.stream);
    expect_gathered(d, m, g.residual, what);
  }
}

/* Both dtypes with the default options (the standard layout, path auto),
 * then each path and layout; the last op outlives its communicator's
 * handle, which is destroyed here. */
static void rs_part(fo_comm_t comm) {
  static const fo_dtype dts[] = {FO_DTYPE_BF16, FO_DTYPE_FP16};
  static const int paths[] = {FO_PATH_SEQUENTIAL, FO_PATH_SLOTS};
  fo_gemm_reducescatter_t op = NULL;
  fo_gemm_reducescatter_options opt;
  size_t t, pi;
  int l, comm_destroyed = 0;
  for (t = 0; t < 2; ++t) {
    const fo_dtype d = dts[t];
    int64_t mm = 0, nn = 0, kk = 0, rows = -1;
    int world = -1;
    fo_dtype dd = (fo_dtype)-1;
    char plan[512], small[8];
    size_t needed = 0, needed2 = 0;
    FO(fo_gemm_reducescatter_create(comm, MAX_M, N, K, d, NULL, &op));
    FO(fo_gemm_reducescatter_shape(op, &mm, &nn, &kk, &dd, &world));
    CHECK(mm == MAX_M && nn == N && kk == K && dd == d && world == 1, "reducescatter shape %lld %lld %lld %d, world %d",
          (long long)mm, (long long)nn, (long long)kk, (int)dd, world);
    FO(fo_gemm_reducescatter_shape(op, NULL, NULL, NULL, NULL, NULL));
    exercise_rs(op, d, d == FO_DTYPE_BF16 ? "reducescatter bf16, auto" : "reducescatter fp16, auto");

    FO(fo_gemm_reducescatter_plan(op, 77, NULL, 0, &needed));
    CHECK(needed > 1 && needed <= sizeof plan, "reducescatter plan needs %zu bytes", needed);
    FO(fo_gemm_reducescatter_plan(op, 77, plan, sizeof plan, &needed2));
    CHECK(needed2 == needed && strlen(plan) + 1 == needed, "reducescatter plan \"%s\": needed %zu, then %zu", plan,
          needed, needed2);
    CHECK(strstr(plan, "standard layout") != NULL, "reducescatter plan \"%s\" does not name its layout", plan);
    printf("reducescatter %s: plan(77) = \"%s\"\n", d == FO_DTYPE_BF16 ? "bf16" : "fp16", plan);
    FO(fo_gemm_reducescatter_plan(op, 77, small, sizeof small, NULL));
    CHECK(strlen(small) == sizeof small - 1 && strncmp(small, plan, sizeof small - 1) == 0,
          "truncated reducescatter plan \"%s\"", small);
    FO(fo_gemm_reducescatter_prepare(op, 150));
    FO(fo_gemm_reducescatter_check(op));
    /* rows: at most count of them, needed all */
    g_rows[3] = -7;
    FO(fo_gemm_reducescatter_rows(op, 100, g_rows, 3, &needed));
    CHECK(needed == 100 && g_rows[0] == 0 && g_rows[1] == 1 && g_rows[2] == 2 && g_rows[3] == -7,
          "rows(100) into 3 entries: needed %zu, %lld %lld %lld %lld", needed, (long long)g_rows[0],
          (long long)g_rows[1], (long long)g_rows[2], (long long)g_rows[3]);

    EXPECT_INVALID(fo_gemm_reducescatter_plan(op, 77, NULL, 4, NULL), "fo_gemm_reducescatter_plan", "buf is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_rows(op, 77, NULL, 4, NULL), "fo_gemm_reducescatter_rows", "rows is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_rows_out(op, 77, NULL), "fo_gemm_reducescatter_rows_out", "rows is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run(op, NULL, (const void*)g.db, (void*)g.dout, 1, g.stream, 0),
                   "fo_gemm_reducescatter_run", "a is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run(op, (const void*)g.da, NULL, (void*)g.dout, 1, g.stream, 0),
                   "fo_gemm_reducescatter_run", "b is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, NULL, 1, g.stream, 0),
                   "fo_gemm_reducescatter_run", "out is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, NULL,
                                                     (const void*)g.dweight, 1e-5f, (void*)g.dout, NULL, 1, g.stream),
                   "fo_gemm_reducescatter_run_rmsnorm", "residual is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, (const void*)g.dres,
                                                     NULL, 1e-5f, (void*)g.dout, NULL, 1, g.stream),
                   "fo_gemm_reducescatter_run_rmsnorm", "norm_weight is NULL");
    /* m out of range and a bad ld_out: the C++ API's InvalidArgument */
    EXPECT_INVALID(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 0, g.stream, 0),
                   "fo_gemm_reducescatter_run", "m must be in [1, max_m]");
    EXPECT_INVALID(
        fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, MAX_M + 1, g.stream, 0),
        "fo_gemm_reducescatter_run", "m must be in [1, max_m]");
    EXPECT_INVALID(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 8, g.stream, 5),
                   "fo_gemm_reducescatter_run", "ld_out");
    EXPECT_INVALID(fo_gemm_reducescatter_rows_out(op, 0, &rows), "fo_gemm_reducescatter_rows_out", "m must be");
    CHECK(rows == -1, "rows_out wrote its out-parameter on failure: %lld", (long long)rows);
    EXPECT_INVALID(fo_gemm_reducescatter_prepare(op, MAX_M + 1), "fo_gemm_reducescatter_prepare", "m must be");
    /* all_gather_rows: NULL buffers, m out of range */
    EXPECT_INVALID(fo_gemm_reducescatter_all_gather_rows(op, NULL, (void*)g.dfull, 8, g.stream),
                   "fo_gemm_reducescatter_all_gather_rows", "local is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_all_gather_rows(op, (const void*)g.dout, NULL, 8, g.stream),
                   "fo_gemm_reducescatter_all_gather_rows", "full is NULL");
    EXPECT_INVALID(fo_gemm_reducescatter_all_gather_rows(op, (const void*)g.dout, (void*)g.dfull, 0, g.stream),
                   "fo_gemm_reducescatter_all_gather_rows", "m must be in [1, max_m]");
    EXPECT_INVALID(
        fo_gemm_reducescatter_all_gather_rows(op, (const void*)g.dout, (void*)g.dfull, MAX_M + 1, g.stream),
        "fo_gemm_reducescatter_all_gather_rows", "m must be in [1, max_m]");
    /* still usable after refusals */
    FO(fo_gemm_reducescatter_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 128, g.stream, 0));
    expect_gemm(d, 128, N, "reducescatter after the refusals, m = 128");
    gather_into_full(op, g.dout, 128, g.stream);
    expect_gathered(d, 128, NULL, "reducescatter after the refusals, m = 128");
    FO(fo_gemm_reducescatter_destroy(op));
    op = NULL;
  }

  /* refusals the C++ API makes: k % 8 != 0, max_m < 1, nccl_sms out of range */
  op = (fo_gemm_reducescatter_t)&g;
  EXPECT_INVALID(fo_gemm_reducescatter_create(comm, MAX_M, N, 12, FO_DTYPE_BF16, NULL, &op),
                 "fo_gemm_reducescatter_create", "k a multiple of 8");
  CHECK(op == NULL, "out not cleared on failure");
  EXPECT_INVALID(fo_gemm_reducescatter_create(comm, 0, N, K, FO_DTYPE_BF16, NULL, &op), "fo_gemm_reducescatter_create",
                 "1 <= max_m");
  FO(fo_gemm_reducescatter_options_default(&opt, sizeof opt));
  opt.nccl_sms = 0;
  EXPECT_INVALID(fo_gemm_reducescatter_create(comm, MAX_M, N, K, FO_DTYPE_BF16, &opt, &op),
                 "fo_gemm_reducescatter_create", "nccl_sms must be in [1, ");

  /* each path and layout, explicitly */
  for (l = FO_RS_LAYOUT_STANDARD; l <= FO_RS_LAYOUT_SUBTILE; ++l)
    for (pi = 0; pi < 2; ++pi) {
      const int p = paths[pi], last = l == FO_RS_LAYOUT_SUBTILE && p == FO_PATH_SLOTS;
      comm_destroyed |= last;
      char name[96], plan[512];
      fo_status c;
      FO(fo_gemm_reducescatter_options_default(&opt, sizeof opt));
      opt.path = p;
      opt.layout = l;
      opt.check_m = 1;
      c = fo_gemm_reducescatter_create(comm, MAX_M, N, K, FO_DTYPE_BF16, &opt, &op);
      CHECK(c == FO_OK, "reducescatter path %d, layout %d: %s: %s", p, l, fo_status_string(c), fo_last_error());
      if (c != FO_OK) continue;
      if (last) FO(fo_comm_destroy(comm)); /* (the op keeps the communicator) */
      snprintf(name, sizeof name, "reducescatter bf16, %s, %s layout%s", p == FO_PATH_SLOTS ? "slots" : "sequential",
               l == FO_RS_LAYOUT_SUBTILE ? "sub-tile" : "standard", last ? " (its comm handle destroyed)" : "");
      exercise_rs(op, FO_DTYPE_BF16, name);
      FO(fo_gemm_reducescatter_plan(op, MAX_M, plan, sizeof plan, NULL));
      CHECK(strstr(plan, l == FO_RS_LAYOUT_SUBTILE ? "subtile layout" : "standard layout") != NULL, "%s: plan \"%s\"", name, plan);
      printf("%s: plan(%d) = \"%s\"\n", name, MAX_M, plan);
      FO(fo_gemm_reducescatter_check(op));
      FO(fo_gemm_reducescatter_destroy(op));
      op = NULL;
    }
  if (!comm_destroyed) FO(fo_comm_destroy(comm));
}

/* ---- GemmAllToAll at world 1: every row goes back to rank 0 ---- */

static int32_t g_dest_rank[MAX_M + 1], g_dest_token[MAX_M + 1], g_tok[MAX_M];
static float g_gate[MAX_M + 1];

/* A routing of m rows to rank 0: row i to token g_dest_token[i] (the first
 * m of a shuffled permutation of the tokens), gate g_gate[i] (a quarter in
 * [0.25, 2]: gate * row is exact in fp32). */
static void a2a_routing(fo_alltoall_routing* r, int64_t m, int64_t tokens, int64_t* send, int64_t* recv) {
  int64_t i;
  static int32_t perm[MAX_M + 1];
  for (i = 0; i < tokens; ++i) perm[i] = (int32_t)i;
  for (i = tokens - 1; i > 0; --i) {
    const int j = rand_int(0, (int)i);
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (i = 0; i < m; ++i) {
    g_dest_rank[i] = 0;
    g_dest_token[i] = perm[i];
    g_gate[i] = 0.25f * (float)rand_int(1, 8);
  }
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->rows = m;
  r->dest_rank = g_dest_rank;
  r->dest_token = g_dest_token;
  r->gate = g_gate;
  r->tokens = tokens;
  send[0] = recv[0] = m;
  r->send_counts = send;
  r->recv_counts = recv;
}

/* out (g.dout, tokens x N, ld): row t = gate * row i of a * b^T for the row i
 * of token t, zeros for a token without a row, bitwise (each product is
 * exact, then rounded once); the pad columns untouched (0xffff). */
static void expect_combined(fo_dtype d, const fo_alltoall_routing* r, int64_t ld, const char* what) {
  static int64_t row_of[MAX_M + 1];
  int64_t i, j, bad = 0, pad_bad = 0;
  for (i = 0; i < r->tokens; ++i) row_of[i] = -1;
  for (i = 0; i < r->rows; ++i) row_of[r->dest_token[i]] = i;
  CU(cu.CtxSynchronize());
  CU(cu.MemcpyDtoH(g.host16, g.dout, (size_t)(r->tokens * ld) * 2));
  for (i = 0; i < r->tokens; ++i)
    for (j = 0; j < ld; ++j) {
      const uint16_t x = g.host16[i * ld + j];
      uint16_t want;
      if (j >= N) {
        pad_bad += x != 0xffffu;
        continue;
      }
      want = row_of[i] < 0 ? to_16(d, 0.0f) : to_16(d, r->gate[row_of[i]] * (float)g.ab[row_of[i] * N + j]);
      if (x != want) {
        if (!bad)
          fprintf(stderr, "%s: combine: first difference at token %lld (row %lld), col %lld: %g (0x%04x), want %g\n",
                  what, (long long)i, (long long)row_of[i], (long long)j, (double)from_16(d, x), x,
                  (double)from_16(d, want));
        ++bad;
      }
    }
  CHECK(bad == 0, "%s: combine: %lld of %lld elements differ from gate * (a b^T)", what, (long long)bad,
        (long long)(r->tokens * N));
  CHECK(pad_bad == 0, "%s: combine: %lld elements beyond n written", what, (long long)pad_bad);
}

/* tokens_out (g.dtok) = dest_token of the received rows, in source-row order. */
static void expect_tokens(const fo_alltoall_routing* r, const char* what) {
  int64_t i, bad = 0;
  CU(cu.CtxSynchronize());
  CU(cu.MemcpyDtoH(g_tok, g.dtok, (size_t)r->rows * 4));
  for (i = 0; i < r->rows; ++i) bad += g_tok[i] != r->dest_token[i];
  CHECK(bad == 0, "%s: tokens_out: %lld of %lld differ from dest_token", what, (long long)bad, (long long)r->rows);
}

/* One op: the combine and the received rows for a few routings, a padded ld_out. */
static void exercise_a2a(fo_gemm_alltoall_t op, fo_dtype d, const char* name) {
  static const int64_t cases[][2] = {{200, 250}, {MAX_M, MAX_M}, {1, 1}, {77, 300}};
  fo_alltoall_routing r;
  int64_t send[1], recv[1];
  char what[128];
  size_t t;
  upload_ints(d, g.da, g.a, (size_t)MAX_M * K);
  upload_ints(d, g.db, g.b, (size_t)N * K);
  for (t = 0; t < sizeof cases / sizeof cases[0]; ++t) {
    a2a_routing(&r, cases[t][0], cases[t][1], send, recv);
    snprintf(what, sizeof what, "%s, %lld rows, %lld tokens", name, (long long)cases[t][0], (long long)cases[t][1]);
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.MemsetD8(g.dtok, 0xff, (size_t)MAX_M * 4));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, (int32_t*)g.dtok,
                            t % 2 ? NULL : g.stream));
    expect_combined(d, &r, N, what);
    expect_tokens(&r, what);
    /* without the combine: the rows of a * b^T as they are, in source-row order */
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.MemsetD8(g.dtok, 0xff, (size_t)MAX_M * 4));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 0, (int32_t*)g.dtok,
                            g.stream));
    expect_gemm(d, r.rows, N, what);
    expect_tokens(&r, what);
  }
  /* a padded ld_out, both forms */
  a2a_routing(&r, 150, 160, send, recv);
  snprintf(what, sizeof what, "%s, ld_out = n + %d", name, LD_PAD);
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, N + LD_PAD, 1, NULL, g.stream));
  expect_combined(d, &r, N + LD_PAD, what);
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, N + LD_PAD, 0, NULL, g.stream));
  expect_gemm(d, r.rows, N + LD_PAD, what);
  /* no rows: a and b may be NULL; the combine is zeros; nothing received, nothing written (out may be NULL) */
  a2a_routing(&r, 0, 10, send, recv);
  snprintf(what, sizeof what, "%s, no rows", name);
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_run(op, NULL, NULL, &r, (void*)g.dout, 0, 1, NULL, g.stream));
  expect_combined(d, &r, N, what);
  FO(fo_gemm_alltoall_run(op, NULL, NULL, &r, NULL, 0, 0, NULL, g.stream));
  r.tokens = 0;
  FO(fo_gemm_alltoall_run(op, NULL, NULL, &r, NULL, 0, 1, NULL, g.stream));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_check(op));
}

static void a2a_part(fo_comm_t comm) {
  static const int paths[] = {FO_PATH_SEQUENTIAL, FO_PATH_SLOTS};
  fo_gemm_alltoall_t op = NULL;
  fo_gemm_alltoall_options opt;
  fo_alltoall_routing r;
  int64_t send[1], recv[1], mr = 0, mt = 0, nn = 0, kk = 0;
  int topk = 0, world = 0;
  fo_dtype dd = (fo_dtype)-1;
  char plan[512], small[8];
  size_t needed = 0, needed2 = 0, pi;
  const fo_dtype d = FO_DTYPE_BF16;

  FO(fo_gemm_alltoall_create(comm, MAX_M, MAX_M, 1, N, K, d, NULL, &op));
  FO(fo_gemm_alltoall_shape(op, &mr, &mt, &topk, &nn, &kk, &dd, &world));
  CHECK(mr == MAX_M && mt == MAX_M && topk == 1 && nn == N && kk == K && dd == d && world == 1,
        "alltoall shape %lld %lld top-%d %lld %lld %d, world %d", (long long)mr, (long long)mt, topk, (long long)nn,
        (long long)kk, (int)dd, world);
  FO(fo_gemm_alltoall_shape(op, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
  FO(fo_gemm_alltoall_last_plan(op, plan, sizeof plan, &needed));
  CHECK(strcmp(plan, "no call yet") == 0 && needed == strlen(plan) + 1, "last_plan before a call: \"%s\"", plan);
  exercise_a2a(op, d, "alltoall bf16, auto");

  FO(fo_gemm_alltoall_last_plan(op, NULL, 0, &needed));
  CHECK(needed > 1 && needed <= sizeof plan, "alltoall last_plan needs %zu bytes", needed);
  FO(fo_gemm_alltoall_last_plan(op, plan, sizeof plan, &needed2));
  CHECK(needed2 == needed && strlen(plan) + 1 == needed && strstr(plan, "predicted") != NULL,
        "alltoall last_plan \"%s\": needed %zu, then %zu", plan, needed, needed2);
  printf("alltoall bf16, auto: last_plan = \"%s\"\n", plan);
  FO(fo_gemm_alltoall_last_plan(op, small, sizeof small, NULL));
  CHECK(strlen(small) == sizeof small - 1 && strncmp(small, plan, sizeof small - 1) == 0,
        "truncated alltoall last_plan \"%s\"", small);
  EXPECT_INVALID(fo_gemm_alltoall_last_plan(op, NULL, 4, NULL), "fo_gemm_alltoall_last_plan", "buf is NULL");

  /* the routing's struct_size */
  a2a_routing(&r, 100, 120, send, recv);
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, NULL, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "routing is NULL");
  r.struct_size = 8;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run",
                 "routing->struct_size = 8 is below 64 (set routing->struct_size = sizeof(fo_alltoall_routing))");
  {
    /* a caller whose header has a field more: accepted while it is zero */
    struct later {
      fo_alltoall_routing r;
      int64_t added;
    } l;
    a2a_routing(&l.r, 100, 120, send, recv);
    l.r.struct_size = sizeof l;
    l.added = 0;
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &l.r, (void*)g.dout, 0, 1, NULL, g.stream));
    expect_combined(d, &l.r, N, "alltoall, a routing of a later header");
    l.added = 1;
    EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &l.r, (void*)g.dout, 0, 1, NULL,
                                        g.stream),
                   "fo_gemm_alltoall_run", "routing->struct_size = 88: the routing set fields that this library");
    CHECK(strstr(fo_last_error(), "routing of 80 bytes) does not know") != NULL, "message \"%s\"", fo_last_error());
  }
  {
    /* a caller of the first version (no on_device: host arrays) */
    struct first {
      fo_alltoall_routing r;
    } f;
    a2a_routing(&f.r, 100, 120, send, recv);
    f.r.struct_size = offsetof(fo_alltoall_routing, on_device);
    f.r.on_device = 1; /* (beyond its struct_size: not read) */
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &f.r, (void*)g.dout, 0, 1, NULL, g.stream));
    expect_combined(d, &f.r, N, "alltoall, a routing of the first version");
  }
  {
    /* the arrays in device memory (world 1: checked and tabled on the GPU): the same bits */
    fo_alltoall_routing dr;
    CUdeviceptr rank_d, token_d, gate_d;
    a2a_routing(&r, 100, 120, send, recv);
    CU(cu.MemAlloc(&rank_d, (size_t)r.rows * 4));
    CU(cu.MemAlloc(&token_d, (size_t)r.rows * 4));
    CU(cu.MemAlloc(&gate_d, (size_t)r.rows * 4));
    CU(cu.MemcpyHtoD(rank_d, r.dest_rank, (size_t)r.rows * 4));
    CU(cu.MemcpyHtoD(token_d, r.dest_token, (size_t)r.rows * 4));
    CU(cu.MemcpyHtoD(gate_d, r.gate, (size_t)r.rows * 4));
    dr = r;
    dr.dest_rank = (const int32_t*)(uintptr_t)rank_d;
    dr.dest_token = (const int32_t*)(uintptr_t)token_d;
    dr.gate = (const float*)(uintptr_t)gate_d;
    dr.on_device = 1;
    CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
    CU(cu.CtxSynchronize());
    FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &dr, (void*)g.dout, 0, 1, NULL, g.stream));
    expect_combined(d, &r, N, "alltoall, the routing in device memory");
    FO(fo_gemm_alltoall_check(op));
    CU(cu.MemFree(rank_d));
    CU(cu.MemFree(token_d));
    CU(cu.MemFree(gate_d));
  }
  /* NULL buffers, a bad ld_out, and routings that do not add up: the C++ API's refusals */
  a2a_routing(&r, 100, 120, send, recv);
  EXPECT_INVALID(fo_gemm_alltoall_run(op, NULL, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL, g.stream),
                 "fo_gemm_alltoall_run", "a and b must not be null with rows");
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, NULL, &r, (void*)g.dout, 0, 1, NULL, g.stream),
                 "fo_gemm_alltoall_run", "a and b must not be null with rows");
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, NULL, 0, 1, NULL, g.stream),
                 "fo_gemm_alltoall_run", "null output");
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, NULL, 0, 0, NULL, g.stream),
                 "fo_gemm_alltoall_run", "null output");
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 5, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "ld_out = 5 is below n");
  send[0] = 101;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "send_counts[0] = 101 but 100 rows go to rank 0");
  send[0] = 100;
  recv[0] = 99;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "rank 0's recv_counts[0] = 99 but rank 0 sends it 100 rows");
  recv[0] = 100;
  g_dest_token[5] = 120;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "token 120 outside [0, 120)");
  g_dest_token[5] = 0;
  g_dest_rank[3] = 1;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "row 3 goes to rank 1, outside [0, 1)");
  a2a_routing(&r, 100, 120, send, recv);
  r.gate = NULL;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "(to combine) gate must not be null");
  r.tokens = MAX_M + 1;
  EXPECT_INVALID(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 0, NULL,
                                      g.stream),
                 "fo_gemm_alltoall_run", "tokens = 301 is outside [0, max_tokens = 300]");
  /* without the combine the gate may be NULL */
  a2a_routing(&r, 100, 120, send, recv);
  r.gate = NULL;
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 0, (int32_t*)g.dtok,
                          g.stream));
  expect_gemm(d, r.rows, N, "alltoall without gates, not combining");
  expect_tokens(&r, "alltoall without gates, not combining");
  /* still usable after the refusals */
  a2a_routing(&r, MAX_M, MAX_M, send, recv);
  CU(cu.MemsetD8(g.dout, 0xff, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.CtxSynchronize());
  FO(fo_gemm_alltoall_run(op, (const void*)g.da, (const void*)g.db, &r, (void*)g.dout, 0, 1, NULL, g.stream));
  expect_combined(d, &r, N, "alltoall after the refusals");
  FO(fo_gemm_alltoall_destroy(op));
  op = NULL;

  /* refusals the C++ API makes at create */
  op = (fo_gemm_alltoall_t)&g;
  EXPECT_INVALID(fo_gemm_alltoall_create(comm, MAX_M, MAX_M, 0, N, K, d, NULL, &op), "fo_gemm_alltoall_create",
                 "topk must be in [1, world x experts = 1]");
  CHECK(op == NULL, "out not cleared on failure");
  EXPECT_INVALID(fo_gemm_alltoall_create(comm, MAX_M, MAX_M, 2, N, K, d, NULL, &op), "fo_gemm_alltoall_create",
                 "topk must be in [1, world x experts = 1]");
  EXPECT_INVALID(fo_gemm_alltoall_create(comm, MAX_M, 0, 1, N, K, d, NULL, &op), "fo_gemm_alltoall_create",
                 "max_rows and max_tokens must be >= 1");
  EXPECT_INVALID(fo_gemm_alltoall_create(comm, MAX_M, MAX_M, 1, N, 12, d, NULL, &op), "fo_gemm_alltoall_create",
                 "k a multiple of 8");

  /* each path, explicitly, and fp16 */
  for (pi = 0; pi < 2; ++pi) {
    char name[64];
    fo_status c;
    FO(fo_gemm_alltoall_options_default(&opt, sizeof opt));
    opt.path = paths[pi];
    c = fo_gemm_alltoall_create(comm, MAX_M, MAX_M, 1, N, K, pi ? FO_DTYPE_FP16 : FO_DTYPE_BF16, &opt, &op);
    CHECK(c == FO_OK, "alltoall path %d: %s: %s", paths[pi], fo_status_string(c), fo_last_error());
    if (c != FO_OK) continue;
    snprintf(name, sizeof name, "alltoall %s, %s", pi ? "fp16" : "bf16", pi ? "slots" : "sequential");
    exercise_a2a(op, pi ? FO_DTYPE_FP16 : FO_DTYPE_BF16, name);
    FO(fo_gemm_alltoall_last_plan(op, plan, sizeof plan, NULL));
    printf("%s: last_plan = \"%s\"\n", name, plan);
    FO(fo_gemm_alltoall_destroy(op));
    op = NULL;
  }
}

static int gpu_part(void) {
  fo_comm_t comm = NULL;
  fo_gemm_allreduce_t op = NULL;
  fo_gemm_allreduce_options opt;
  CUdevice dev;
  CUcontext ctx;
  int rank = -1, world = -1, p;
  void* nccl = NULL;
  int64_t i, j, l;
  const fo_status s = fo_comm_from_env(&comm);
  if (s == FO_NO_GPU) {
    if (required_gpus() >= 1) {
      fprintf(stderr, "FO_REQUIRE_GPUS=%d promises a GPU, but: %s\n", required_gpus(), fo_last_error());
      return 1;
    }
    printf("SKIPPED: needs a Hopper GPU: %s\n", fo_last_error());
    return SKIP_CODE;
  }
  CHECK(s == FO_OK, "fo_comm_from_env: %s: %s", fo_status_string(s), fo_last_error());
  if (s != FO_OK) return 1;
  FO(fo_comm_rank(comm, &rank));
  FO(fo_comm_world(comm, &world));
  FO(fo_comm_nccl(comm, &nccl));
  CHECK(rank == 0 && world == 1 && nccl != NULL, "rank %d, world %d, nccl %p", rank, world, nccl);
  {  /* where a communicator came up, the machine has a Hopper GPU and says so */
    int hopper = 0;
    char reason[256];
    FO(fo_local_gpus(&hopper, NULL, reason, sizeof reason, NULL));
    CHECK(hopper >= 1 && reason[0] == '\0', "fo_local_gpus on a GPU machine: %d, \"%s\"", hopper, reason);
  }

  if (!load_driver()) {
    fprintf(stderr, "a GPU communicator, but libcuda.so.1 does not load: %s\n", dlerror());
    return 1;
  }
  /* The library's context is device 0's primary one (one rank: LOCAL_RANK 0). */
  CU(cu.Init(0));
  CU(cu.DeviceGet(&dev, 0));
  CU(cu.DevicePrimaryCtxRetain(&ctx, dev));
  CU(cu.CtxSetCurrent(ctx));
  CU(cu.StreamCreate(&g.stream, 0));
  CU(cu.MemAlloc(&g.da, (size_t)MAX_M * K * 2));
  CU(cu.MemAlloc(&g.db, (size_t)N * K * 2));
  CU(cu.MemAlloc(&g.dout, (size_t)MAX_M * (N + LD_PAD) * 2));
  CU(cu.MemAlloc(&g.dres, (size_t)MAX_M * N * 2));
  CU(cu.MemAlloc(&g.dres_out, (size_t)MAX_M * N * 2));
  CU(cu.MemAlloc(&g.dweight, (size_t)N * 2));
  CU(cu.MemAlloc(&g.dfull, (size_t)MAX_M * N * 2));
  CU(cu.MemAlloc(&g.dtok, (size_t)MAX_M * 4));

  {
    const char* seed = getenv("FO_TEST_SEED");
    g_rng = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761ull;
    printf("seed %llu (FO_TEST_SEED=%llu replays it)\n", (unsigned long long)g_rng, (unsigned long long)g_rng);
  }
  /* entries in {-1, 0, 1}: |sums| <= K = 128, exact in fp32 and both dtypes */
  for (i = 0; i < MAX_M * K; ++i) g.a[i] = rand_int(-1, 1);
  for (i = 0; i < N * K; ++i) g.b[i] = rand_int(-1, 1);
  for (i = 0; i < MAX_M; ++i)
    for (j = 0; j < N; ++j) {
      int sum = 0;
      for (l = 0; l < K; ++l) sum += g.a[i * K + l] * g.b[j * K + l];
      g.ab[i * N + j] = sum;
      g.residual[i * N + j] = rand_int(-2, 2);
    }
  for (j = 0; j < N; ++j) g.weight[j] = 0.25f * (float)rand_int(2, 6);

  /* both dtypes, the default options */
  {
    static const fo_dtype dts[] = {FO_DTYPE_BF16, FO_DTYPE_FP16};
    size_t t;
    for (t = 0; t < 2; ++t) {
      const fo_dtype d = dts[t];
      int64_t mm = 0, nn = 0, kk = 0;
      fo_dtype dd = (fo_dtype)-1;
      char plan[512], small[8];
      size_t needed = 0, needed2 = 0;
      FO(fo_gemm_allreduce_create(comm, MAX_M, N, K, d, NULL, &op));
      FO(fo_gemm_allreduce_shape(op, &mm, &nn, &kk, &dd));
      CHECK(mm == MAX_M && nn == N && kk == K && dd == d, "shape %lld %lld %lld %d", (long long)mm, (long long)nn,
            (long long)kk, (int)dd);
      FO(fo_gemm_allreduce_shape(op, NULL, NULL, NULL, NULL));
      exercise(op, d, d == FO_DTYPE_BF16 ? "bf16, auto" : "fp16, auto");

      FO(fo_gemm_allreduce_plan(op, 77, NULL, 0, &needed));
      CHECK(needed > 1 && needed <= sizeof plan, "plan needs %zu bytes", needed);
      FO(fo_gemm_allreduce_plan(op, 77, plan, sizeof plan, &needed2));
      CHECK(needed2 == needed && strlen(plan) + 1 == needed, "plan \"%s\": needed %zu, then %zu", plan, needed,
            needed2);
      printf("%s: plan(77) = \"%s\"\n", d == FO_DTYPE_BF16 ? "bf16" : "fp16", plan);
      FO(fo_gemm_allreduce_plan(op, 77, small, sizeof small, NULL));
      CHECK(strlen(small) == sizeof small - 1 && strncmp(small, plan, sizeof small - 1) == 0,
            "truncated plan \"%s\"", small);
      FO(fo_gemm_allreduce_prepare(op, 150));
      FO(fo_gemm_allreduce_check(op));

      EXPECT_INVALID(fo_gemm_allreduce_plan(op, 77, NULL, 4, NULL), "fo_gemm_allreduce_plan", "buf is NULL");
      EXPECT_INVALID(fo_gemm_allreduce_run(op, NULL, (const void*)g.db, (void*)g.dout, 1, g.stream, 0),
                     "fo_gemm_allreduce_run", "a is NULL");
      EXPECT_INVALID(fo_gemm_allreduce_run(op, (const void*)g.da, NULL, (void*)g.dout, 1, g.stream, 0),
                     "fo_gemm_allreduce_run", "b is NULL");
      EXPECT_INVALID(fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, NULL, 1, g.stream, 0),
                     "fo_gemm_allreduce_run", "out is NULL");
      EXPECT_INVALID(fo_gemm_allreduce_run_rmsnorm(op, (const void*)g.da, (const void*)g.db, NULL,
                                                   (const void*)g.dweight, 1e-5f, (void*)g.dout, NULL, 1, g.stream),
                     "fo_gemm_allreduce_run_rmsnorm", "residual is NULL");
      /* m out of range: the C++ API's InvalidArgument */
      EXPECT_INVALID(fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 0, g.stream, 0),
                     "fo_gemm_allreduce_run", "");
      EXPECT_INVALID(
          fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, MAX_M + 1, g.stream, 0),
          "fo_gemm_allreduce_run", "");
      /* still usable after refusals */
      FO(fo_gemm_allreduce_run(op, (const void*)g.da, (const void*)g.db, (void*)g.dout, 128, g.stream, 0));
      expect_gemm(d, 128, N, "after the refusals, m = 128");
      FO(fo_gemm_allreduce_destroy(op));
      op = NULL;
    }
  }

  /* refusals the C++ API makes: k % 8 != 0, max_m < 1 */
  op = (fo_gemm_allreduce_t)&g;
  EXPECT_INVALID(fo_gemm_allreduce_create(comm, MAX_M, N, 12, FO_DTYPE_BF16, NULL, &op), "fo_gemm_allreduce_create",
                 "");
  CHECK(op == NULL, "out not cleared on failure");
  EXPECT_INVALID(fo_gemm_allreduce_create(comm, 0, N, K, FO_DTYPE_BF16, NULL, &op), "fo_gemm_allreduce_create", "");

  /* GemmReduceScatter (its own communicator: the paths below destroy this one's handle) */
  {
    fo_comm_t rs_comm = NULL;
    FO(fo_comm_from_env(&rs_comm));
    rs_part(rs_comm); /* (destroys rs_comm) */
  }

  /* GemmAllToAll (a communicator of its own too) */
  {
    fo_comm_t a2a_comm = NULL;
    FO(fo_comm_from_env(&a2a_comm));
    a2a_part(a2a_comm);
    FO(fo_comm_destroy(a2a_comm));
  }

  /* each path, explicitly (one that is not available at world 1 may refuse,
   * saying so); the last one outlives its communicator's handle */
  for (p = FO_PATH_SEQUENTIAL; p <= FO_PATH_SLOTS; ++p) {
    static const char* names[] = {"auto", "sequential", "row bands", "slots"};
    char name[64];
    fo_status c;
    FO(fo_gemm_allreduce_options_default(&opt, sizeof opt));
    opt.path = p;
    opt.check_m = 1;
    c = fo_gemm_allreduce_create(comm, MAX_M, N, K, FO_DTYPE_BF16, &opt, &op);
    if (c == FO_INVALID_ARGUMENT) {
      printf("path %s refused at world 1: %s\n", names[p], fo_last_error());
      continue;
    }
    CHECK(c == FO_OK, "path %s: %s: %s", names[p], fo_status_string(c), fo_last_error());
    if (c != FO_OK) continue;
    if (p == FO_PATH_SLOTS) {
      FO(fo_comm_destroy(comm));
      comm = NULL;
    }
    snprintf(name, sizeof name, "bf16, %s%s", names[p], p == FO_PATH_SLOTS ? " (its comm handle destroyed)" : "");
    exercise(op, FO_DTYPE_BF16, name);
    FO(fo_gemm_allreduce_destroy(op));
    op = NULL;
  }
  FO(fo_comm_destroy(comm));

  CU(cu.MemFree(g.da));
  CU(cu.MemFree(g.db));
  CU(cu.MemFree(g.dout));
  CU(cu.MemFree(g.dres));
  CU(cu.MemFree(g.dres_out));
  CU(cu.MemFree(g.dweight));
  CU(cu.MemFree(g.dfull));
  CU(cu.MemFree(g.dtok));
  CU(cu.StreamDestroy(g.stream));
  CU(cu.DevicePrimaryCtxRelease(dev));
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "--gpu") == 0) {
    const int rc = gpu_part();
    if (rc == SKIP_CODE) return rc;
    printf("%s: %d failed checks%s\n", g_failures || rc ? "FAILED" : "PASSED", g_failures,
           rc && !g_failures ? " (stopped early)" : "");
    return g_failures || rc ? 1 : 0;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s [--gpu]\n", argv[0]);
    return 2;
  }
  test_version();
  test_local_gpus();
  test_curves();
  test_options();
  test_rs_options();
  test_a2a_options();
  test_null_arguments();
  test_last_error_lifetime();
  test_threads();
  test_from_env();
  printf("%s: %d failed checks\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
