/* flashoverlap_c.h — FlashOverlap's C ABI: the C++ API of flashoverlap.h
 * (a GEMM whose output is reduced over the ranks of an NCCL communicator
 * while the GEMM still runs) for C, Python's ctypes and other languages.
 *
 *   fo_comm_t comm;
 *   fo_gemm_allreduce_t op;
 *   fo_gemm_allreduce_options opt;
 *   if (fo_comm_from_env(&comm) != FO_OK) { puts(fo_last_error()); ... }
 *   fo_gemm_allreduce_options_default(&opt, sizeof opt);
 *   fo_gemm_allreduce_create(comm, 8192, 8192, 8192, FO_DTYPE_BF16, &opt, &op);
 *   fo_gemm_allreduce_run(op, a, b, c, m, stream, 0);    (c = sum over ranks of a * b^T)
 *   fo_gemm_allreduce_destroy(op);
 *   fo_comm_destroy(comm);
 *
 * fo_gemm_reducescatter_* is the same for ReduceScatter (each rank gets its
 * rows of the sum: fo_gemm_reducescatter_rows_out, _rows; and
 * fo_gemm_reducescatter_all_gather_rows gathers every rank's rows back into
 * the whole m x n, in C's row order).
 *
 * fo_gemm_alltoall_* is the MoE combine of expert parallelism: each rank's
 * rows of a * b^T go back to the ranks and tokens that a routing
 * (fo_alltoall_routing, one per call, in host memory) names, and are summed
 * per token, weighted by their gates (or returned as received). Each call
 * exchanges the ranks' routings and plans on the host, so it synchronises
 * the host and is not for CUDA graphs; it has no prepare and no plan(m),
 * but fo_gemm_alltoall_last_plan.
 *
 * Conventions, for every function below except fo_version, fo_c_abi_version,
 * fo_status_string and fo_last_error:
 *   - it returns an fo_status and writes its results through out-parameters;
 *     on failure, an out-handle is set to NULL (where the pointer to it is
 *     not NULL itself) and other out-parameters are left as they were;
 *   - no C++ exception crosses it (std::bad_alloc included): every failure
 *     is a status and a message, fo_last_error();
 *   - a NULL handle or a NULL required pointer is FO_INVALID_ARGUMENT, with a
 *     message naming the function and the argument, never a crash. (The
 *     destroy functions accept NULL and do nothing, as free() does.)
 *
 * Types across the ABI: the CUDA stream and the NCCL communicator are taken
 * as `void*` (a cudaStream_t, a ncclComm_t: both are pointers to opaque
 * structs, so the value passes unchanged), so that this header needs no
 * CUDA or NCCL header and a ctypes caller passes the integer it already has
 * (torch.cuda.current_stream().cuda_stream) as c_void_p. NULL is the legacy
 * default stream, as in CUDA. Device buffers are `void*` too. Enums are
 * 32-bit (each has a 0x7fffffff member to pin the size); the options structs
 * and fo_alltoall_routing use only fixed-size fields (int32_t, int64_t,
 * double, a pointer, size_t).
 *
 * Threads: as in C++, each object is used by one thread at a time; objects
 * may be used from different threads one after the other. The last error is
 * per thread.
 */
#ifndef FLASHOVERLAP_C_H_
#define FLASHOVERLAP_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define FO_C_API __attribute__((visibility("default")))
#else
#define FO_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this C ABI, as fo_c_abi_version() returns it: raised when a
 * function's or a struct's layout changes incompatibly (adding a function,
 * an enum value or a field at the end of a struct that starts with
 * struct_size does not: fo_gemm_alltoall_* and fo_alltoall_routing were
 * added so, within version 1). A loader that cannot see this header (ctypes)
 * compares the two. */
#define FO_C_ABI_VERSION 1

/* What a call can report, and what the caller can do about it. */
typedef enum fo_status {
  FO_OK = 0,
  /* The caller can fix it: a NULL handle or pointer, a bad shape, m out of
   * range, a bad enum value, a bad curves directory, ranks that passed
   * different m (check_m). Nothing was done (the handle is as before). */
  FO_INVALID_ARGUMENT = 1,
  /* This process has no usable GPU: no NVIDIA driver, no CUDA device (e.g.
   * CUDA_VISIBLE_DEVICES=""), or the current device is not a Hopper (sm_90)
   * GPU. The caller can fall back to another implementation. (A driver that
   * is installed but fails to start is FO_ERROR: that is a broken machine.) */
  FO_NO_GPU = 2,
  /* Anything else: CUDA, NCCL or cuBLAS failed, a wait timed out (see
   * fo_gemm_allreduce_check, fo_gemm_reducescatter_check,
   * fo_gemm_alltoall_check), out of host memory, a broken installation.
   * The message says what; an op that reported it may not be usable again. */
  FO_ERROR = 3,
  FO_STATUS_FORCE_INT32_ = 0x7fffffff
} fo_status;

typedef enum fo_dtype {
  FO_DTYPE_BF16 = 0,
  FO_DTYPE_FP16 = 1,
  FO_DTYPE_FORCE_INT32_ = 0x7fffffff
} fo_dtype;

/* InputType and ScaleKind (flashoverlap.h): FP8 inputs (e4m3, one byte
 * each) and how they are scaled (none; one fp32 each for A and B; one per
 * row of A and one per row of B). */
typedef enum fo_input_type {
  FO_INPUT_SAME = 0,
  FO_INPUT_E4M3 = 1,
  FO_INPUT_FORCE_INT32_ = 0x7fffffff
} fo_input_type;
typedef enum fo_scale_kind {
  FO_SCALES_NONE = 0,
  FO_SCALES_PER_TENSOR = 1,
  FO_SCALES_ROW_WISE = 2,
  FO_SCALES_FORCE_INT32_ = 0x7fffffff
} fo_scale_kind;

/* GemmAllReduceOptions::Path: how the AllReduce runs beside the GEMM (see
 * flashoverlap.h). GemmReduceScatterOptions::Path and
 * GemmAllToAllOptions::Path take the same values where they have them:
 * FO_PATH_AUTO, FO_PATH_SEQUENTIAL, FO_PATH_SLOTS and FO_PATH_NVLINK (each
 * op's form without a collective call, over NVLink). FO_PATH_OWNERS is the
 * AllReduce's FO_PATH_NVLINK under its former name (taken as it). */
typedef enum fo_path {
  FO_PATH_AUTO = 0,
  FO_PATH_SEQUENTIAL = 1,
  FO_PATH_ROW_BANDS = 2,
  FO_PATH_SLOTS = 3,
  FO_PATH_OWNERS = 4,
  FO_PATH_NVLINK = 5,
  FO_PATH_FORCE_INT32_ = 0x7fffffff
} fo_path;

/* GemmReduceScatterOptions::Layout: which rows of the sum each rank ends
 * with (see flashoverlap.h). */
typedef enum fo_rs_layout {
  /* rank r: rows [r m/W, (r+1) m/W), what ncclReduceScatter of row-major C
   * gives (m % W == 0) */
  FO_RS_LAYOUT_STANDARD = 0,
  /* the paper's sub-tile layout: rank r holds rows t*128 + r*128/W + [0,
   * 128/W) of every 128-row tile row t (fo_gemm_reducescatter_rows lists
   * them); any m, W divides 128 */
  FO_RS_LAYOUT_SUBTILE = 1,
  FO_RS_LAYOUT_FORCE_INT32_ = 0x7fffffff
} fo_rs_layout;

/* The NCCL communicator the ops run on (flashoverlap::Communicator). An op
 * keeps its communicator alive: a handle may be destroyed once its ops are
 * created. */
typedef struct fo_comm* fo_comm_t;
/* One GemmAllReduce op (flashoverlap::GemmAllReduce). */
typedef struct fo_gemm_allreduce* fo_gemm_allreduce_t;
/* One GemmReduceScatter op (flashoverlap::GemmReduceScatter). */
typedef struct fo_gemm_reducescatter* fo_gemm_reducescatter_t;
/* One GemmAllToAll op (flashoverlap::GemmAllToAll). */
typedef struct fo_gemm_alltoall* fo_gemm_alltoall_t;
typedef struct fo_gemm_grouped* fo_gemm_grouped_t;

/* The bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define FO_UNIQUE_ID_BYTES 128

/* GemmAllReduceOptions. Fill it with fo_gemm_allreduce_options_default
 * first, then change fields: struct_size says which fields the caller's
 * header knew, so that a library with more fields (a later version) gives
 * the missing ones their defaults, and one with fewer refuses a caller that
 * set fields it does not know. */
typedef struct fo_gemm_allreduce_options {
  size_t struct_size;    /* sizeof(fo_gemm_allreduce_options), as the caller knows it */
  int32_t path;          /* an fo_path; default FO_PATH_AUTO */
  int32_t nccl_sms;      /* SMs left to NCCL beside the GEMM; default 8 */
  double wait_timeout_s; /* a group's wait longer than this fails; default 30 */
  int32_t check_m;       /* nonzero: every call checks all ranks passed the same m; default 0 */
  int32_t reserved_;     /* 0 (padding, named so that the layout is explicit) */
  const char* curves;    /* a directory of measured curves, copied at create; NULL or "": the built-in model (default NULL) */
  /* Added after version 1 (a caller's struct_size says whether it has them): */
  const char* tuning_cache; /* a file of measured picks (bench --tuning-cache), copied at create; NULL or "":
                               FLASHOVERLAP_TUNING_CACHE (default NULL) */
  /* Added in the third version (a smaller struct_size: FO_INPUT_SAME, FO_SCALES_NONE): */
  int32_t input;  /* an fo_input_type; FO_INPUT_E4M3: FP8 a and b (k % 16 == 0), each call's scales by the
                     _scaled calls; default FO_INPUT_SAME */
  int32_t scales; /* an fo_scale_kind; default FO_SCALES_NONE */
} fo_gemm_allreduce_options;

/* GemmReduceScatterOptions, with fo_gemm_allreduce_options' rules: fill it
 * with fo_gemm_reducescatter_options_default first, then change fields;
 * struct_size says which fields the caller's header knew. The fields they
 * share sit at the same offsets as in fo_gemm_allreduce_options. */
typedef struct fo_gemm_reducescatter_options {
  size_t struct_size;    /* sizeof(fo_gemm_reducescatter_options), as the caller knows it */
  int32_t path;          /* an fo_path: FO_PATH_AUTO (default), FO_PATH_SEQUENTIAL, FO_PATH_SLOTS or
                            FO_PATH_NVLINK (the others are no ReduceScatter path: FO_INVALID_ARGUMENT) */
  int32_t nccl_sms;      /* SMs left to NCCL beside the GEMM; default 8 */
  double wait_timeout_s; /* a group's wait longer than this fails; default 30 */
  int32_t check_m;       /* nonzero: every call checks all ranks passed the same m; default 0 */
  int32_t layout;        /* an fo_rs_layout; default FO_RS_LAYOUT_STANDARD */
  /* Added in the second version (a smaller struct_size: NULL): */
  const char* tuning_cache; /* a file of measured picks (bench --op reducescatter --tuning-cache), copied at create;
                               NULL or "": $FLASHOVERLAP_TUNING_CACHE, if set */
  /* Added in the third version (a smaller struct_size: FO_INPUT_SAME, FO_SCALES_NONE), as
   * fo_gemm_allreduce_options' (each call's scales by the _scaled calls): */
  int32_t input;  /* an fo_input_type; default FO_INPUT_SAME */
  int32_t scales; /* an fo_scale_kind; default FO_SCALES_NONE */
} fo_gemm_reducescatter_options;

/* GemmAllToAllOptions, with fo_gemm_allreduce_options' rules: fill it with
 * fo_gemm_alltoall_options_default first, then change fields; struct_size
 * says which fields the caller's header knew. The fields it shares with
 * fo_gemm_allreduce_options sit at the same offsets. */
typedef struct fo_gemm_alltoall_options {
  size_t struct_size;    /* sizeof(fo_gemm_alltoall_options), as the caller knows it */
  int32_t path;          /* an fo_path: FO_PATH_AUTO (default), FO_PATH_SEQUENTIAL, FO_PATH_SLOTS or
                            FO_PATH_NVLINK (the others are no All-to-All path: FO_INVALID_ARGUMENT) */
  int32_t nccl_sms;      /* SMs left to NCCL beside the GEMM; default 8 */
  double wait_timeout_s; /* a group's wait longer than this fails; default 30 */
  double exchange_timeout_s; /* a call's routing exchange waits this long for the other ranks; default 120 */
  /* Added in the second version (a smaller struct_size: 1): experts per
   * rank, as GemmAllToAllOptions::experts (b is then [experts, n, k]; each
   * call's routing gives expert_counts). */
  int32_t experts;
  /* Added in the third version (a smaller struct_size: FO_INPUT_SAME, FO_SCALES_NONE), as
   * fo_gemm_allreduce_options' (one expert per rank; each call's scales by
   * fo_gemm_alltoall_run_scaled, row-wise scale_a one per row of a): */
  int32_t input;  /* an fo_input_type; default FO_INPUT_SAME */
  int32_t scales; /* an fo_scale_kind; default FO_SCALES_NONE */
} fo_gemm_alltoall_options;

/* GroupedGemmOptions, with fo_gemm_allreduce_options' rules: fill it with
 * fo_gemm_grouped_options_default first, then change fields. */
typedef struct fo_gemm_grouped_options {
  size_t struct_size;    /* sizeof(fo_gemm_grouped_options), as the caller knows it */
  int32_t path;          /* FO_GROUPED_AUTO (default), FO_GROUPED_OURS or FO_GROUPED_CUBLAS */
} fo_gemm_grouped_options;
enum { FO_GROUPED_AUTO = 0, FO_GROUPED_OURS = 1, FO_GROUPED_CUBLAS = 2 };

/* AllToAllRouting: one call's routing on this rank, in host memory (what
 * the MoE dispatch produced). Row i of a (and of a * b^T) goes back to rank
 * dest_rank[i], where it is row dest_token[i] of that rank's tokens,
 * weighted by gate[i]. send_counts[d] = the rows with dest_rank d;
 * recv_counts[s] = the rows rank s sends here (all_to_all_single's input
 * and output split sizes); both have world entries.
 *
 * It starts with struct_size, as the options do and for the same reason: a
 * later version may add fields at the end (a caller's struct_size says
 * whether it has them; a smaller one gets their defaults, and a larger one
 * is refused if it sets fields this library does not know). There is no
 * _default function: zero the struct, set struct_size = sizeof(struct
 * fo_alltoall_routing), then the fields. The arrays are read during the
 * call only. */
typedef struct fo_alltoall_routing {
  size_t struct_size;          /* sizeof(fo_alltoall_routing), as the caller knows it */
  int64_t rows;                /* m: rows of a on this rank (0 allowed) */
  const int32_t* dest_rank;    /* [rows] */
  const int32_t* dest_token;   /* [rows], each in [0, the destination's tokens) */
  const float* gate;           /* [rows]; may be NULL when not combining (these rows' gates are then 0 where
                                  they land: NULL only where no rank combines) */
  int64_t tokens;              /* this rank's tokens: rows of the combined output */
  const int64_t* send_counts;  /* [world] */
  const int64_t* recv_counts;  /* [world] */
  /* Added in the second version (a smaller struct_size: 0): nonzero when
   * dest_rank, dest_token and gate are in device memory, as
   * flashoverlap::AllToAllRouting::on_device says (at world 1 the call then
   * never waits for the host and reads them in the stream: keep them
   * unchanged until it has; a bad row is reported once, by
   * fo_gemm_alltoall_check or the next call). */
  int64_t on_device;
  /* Added in the third version (a smaller struct_size: NULL): with several
   * experts per rank, host, [world * experts]: expert_counts[s * experts +
   * e] = the rows of a from rank s for local expert e, a's rows source after
   * source and expert after expert, as AllToAllRouting::expert_counts says;
   * NULL with one expert per rank. */
  const int64_t* expert_counts;
} fo_alltoall_routing;

/* ---- queries without a status (they never fail and never change fo_last_error) ---- */

/* The library's version, "MAJOR.MINOR.PATCH" (flashoverlap::version()). */
FO_C_API const char* fo_version(void);
/* FO_C_ABI_VERSION as the library was built with it. */
FO_C_API uint32_t fo_c_abi_version(void);
/* "FO_OK", "FO_INVALID_ARGUMENT", ...; "unknown fo_status" for other values. */
FO_C_API const char* fo_status_string(fo_status status);
/* The message of this thread's last failed call ("<function>: <what>"), ""
 * after a call that succeeded. Valid until this thread's next call of a
 * function that returns an fo_status. */
FO_C_API const char* fo_last_error(void);

/* ---- this machine ---- */

/* The GPUs of this process the ops run on (flashoverlap::local_gpus()):
 * *hopper = the usable Hopper (sm_90) devices; *cuda_failed (optional) = 1
 * where a driver is there but CUDA did not start or answer; the reason there
 * are none, as text, into reason (size bytes) as fo_gemm_allreduce_plan
 * writes its text ("" where there is one). */
FO_C_API fo_status fo_local_gpus(int* hopper, int* cuda_failed, char* reason, size_t size, size_t* needed);

/* ---- planning without a GPU ---- */

/* The plan each op runs, from the model alone (flashoverlap::plan_gemm_allreduce,
 * plan_gemm_reducescatter, plan_gemm_alltoall: no GPU, nothing measured), as
 * text into buf as fo_gemm_allreduce_plan writes its text. options: NULL for
 * the defaults; gpu: NULL for "NVIDIA H200" (the tuning cache's key).
 * fo_plan_gemm_alltoall takes every rank's routing (routings[r]: rank r's,
 * host arrays, each with the same struct_size), world of them. */
FO_C_API fo_status fo_plan_gemm_allreduce(int64_t m, int64_t n, int64_t k, int world, fo_dtype dtype,
                                          const fo_gemm_allreduce_options* options, int sms, const char* gpu,
                                          char* buf, size_t size, size_t* needed);
FO_C_API fo_status fo_plan_gemm_reducescatter(int64_t m, int64_t n, int64_t k, int world, fo_dtype dtype,
                                              const fo_gemm_reducescatter_options* options, int sms, const char* gpu,
                                              int rank, char* buf, size_t size, size_t* needed);
FO_C_API fo_status fo_plan_gemm_alltoall(const fo_alltoall_routing* routings, int world, int64_t n, int64_t k,
                                         fo_dtype dtype, const fo_gemm_alltoall_options* options, int sms, int rank,
                                         char* buf, size_t size, size_t* needed);

/* ---- communicators ---- */

/* NCCL's AllReduce measured over comm's ranks (collective), written by rank 0
 * to path as JSON (flashoverlap::measure_allreduce_curve): messages of 64 KiB
 * to max_mib MiB, NCCL on nccl_ctas CTAs (0: its default), iters timed runs
 * per size. */
FO_C_API fo_status fo_measure_allreduce_curve(fo_comm_t comm, fo_dtype dtype, int nccl_ctas, double max_mib, int iters,
                                              const char* path);
/* Where GemmAllReduce's curves directory holds that curve
 * (flashoverlap::allreduce_curve_path), as text into buf as
 * fo_gemm_allreduce_plan writes its text. */
FO_C_API fo_status fo_allreduce_curve_path(const char* dir, int nccl_ctas, int world, fo_dtype dtype, char* buf,
                                           size_t size, size_t* needed);

/* A communicator the caller owns (a ncclComm_t: PyTorch's, vLLM's, ...):
 * never destroyed here, so it must outlive the handle and every op built on
 * it. */
FO_C_API fo_status fo_comm_adopt(void* nccl_comm, fo_comm_t* out);
/* A new communicator over the processes of a job, from torchrun's or
 * OpenMPI's environment (Communicator::from_env): collective; one rank
 * without those variables. */
FO_C_API fo_status fo_comm_from_env(fo_comm_t* out);
/* A new communicator from a unique id that one rank made (fo_unique_id) and
 * sent to every rank: collective over `world` ranks, each on its current
 * CUDA device. id: FO_UNIQUE_ID_BYTES bytes (id_size must be that). */
FO_C_API fo_status fo_comm_from_unique_id(const void* id, size_t id_size, int rank, int world, fo_comm_t* out);
/* Writes a new NCCL unique id's FO_UNIQUE_ID_BYTES bytes to id (id_size >=
 * FO_UNIQUE_ID_BYTES). */
FO_C_API fo_status fo_unique_id(void* id, size_t id_size);
FO_C_API fo_status fo_comm_rank(fo_comm_t comm, int* rank);
FO_C_API fo_status fo_comm_world(fo_comm_t comm, int* world);
/* The ncclComm_t underneath (Communicator::get), as void*. */
FO_C_API fo_status fo_comm_nccl(fo_comm_t comm, void** nccl_comm);
/* Releases the handle (the communicator itself lives on while ops use it;
 * an adopted one is never destroyed here). NULL: nothing. */
FO_C_API fo_status fo_comm_destroy(fo_comm_t comm);

/* ---- GemmAllReduce: out = sum over ranks of a (m x k) * b^T (b: n x k), row-major ---- */

/* The defaults (equal to GemmAllReduceOptions{}'s), writing struct_size
 * bytes of *options: pass sizeof *options. */
FO_C_API fo_status fo_gemm_allreduce_options_default(fo_gemm_allreduce_options* options, size_t struct_size);
/* Collective over comm: every rank, with the same arguments. options: NULL
 * for the defaults. 1 <= max_m; n >= 1; k % 8 == 0. */
FO_C_API fo_status fo_gemm_allreduce_create(fo_comm_t comm, int64_t max_m, int64_t n, int64_t k, fo_dtype dtype,
                                            const fo_gemm_allreduce_options* options, fo_gemm_allreduce_t* out);
/* out (m x n, ld_out elements per row, 0: n) = AllReduce(a * b^T), on
 * stream (a cudaStream_t; NULL: the legacy default stream); 1 <= m <= max_m.
 * a, b and out are device pointers, required. */
FO_C_API fo_status fo_gemm_allreduce_run(fo_gemm_allreduce_t op, const void* a, const void* b, void* out, int64_t m,
                                         void* stream, int64_t ld_out);
/* FP8 inputs (options->input FO_INPUT_E4M3): the same with this call's
 * scales, fp32 in device memory as options->scales says (NULL, NULL with
 * FO_SCALES_NONE); the _scaled forms of run_rmsnorm and run_registered
 * likewise. */
FO_C_API fo_status fo_gemm_allreduce_run_scaled(fo_gemm_allreduce_t op, const void* a, const void* b, void* out,
                                                int64_t m, void* stream, int64_t ld_out, const float* scale_a,
                                                const float* scale_b);
/* out = RMSNorm(h) * norm_weight, h = AllReduce(a * b^T) + residual;
 * residual_out (optional, NULL: not written) = h. out, residual and
 * residual_out are m x n (ld n) and must not overlap. */
FO_C_API fo_status fo_gemm_allreduce_run_rmsnorm(fo_gemm_allreduce_t op, const void* a, const void* b,
                                                 const void* residual, const void* norm_weight, float eps, void* out,
                                                 void* residual_out, int64_t m, void* stream);
FO_C_API fo_status fo_gemm_allreduce_run_rmsnorm_scaled(fo_gemm_allreduce_t op, const void* a, const void* b,
                                                        const void* residual, const void* norm_weight, float eps,
                                                        void* out, void* residual_out, int64_t m, void* stream,
                                                        const float* scale_a, const float* scale_b);
/* The registered-output form (GemmAllReduce::register_output and
 * run_registered, flashoverlap.h). register_output is collective (every
 * rank, in the same order, each its own buffer): out (max_m x n, ld_out
 * elements per row, 0: n; 16-byte aligned, ld_out % 8 == 0; it must
 * outlive the op) becomes the output *slot, the same on every rank.
 * run_registered computes AllReduce(a * b^T) (m rows) into it; on the
 * NVLink path the other ranks store their final tiles straight into it. */
FO_C_API fo_status fo_gemm_allreduce_register_output(fo_gemm_allreduce_t op, void* out, int64_t ld_out, int* slot);
FO_C_API fo_status fo_gemm_allreduce_run_registered(fo_gemm_allreduce_t op, const void* a, const void* b, int slot,
                                                    int64_t m, void* stream);
FO_C_API fo_status fo_gemm_allreduce_run_registered_scaled(fo_gemm_allreduce_t op, const void* a, const void* b,
                                                           int slot, int64_t m, void* stream, const float* scale_a,
                                                           const float* scale_b);
/* Plans m (if new) and allocates what its calls need, without running:
 * before capturing a call with this m into a CUDA graph. */
FO_C_API fo_status fo_gemm_allreduce_prepare(fo_gemm_allreduce_t op, int64_t m);
/* The plan m runs with, as text, into buf (size bytes), as snprintf does: at
 * most size - 1 characters and a NUL; *needed (optional) = the full text's
 * length + 1. buf may be NULL when size is 0 (ask for the size first). */
FO_C_API fo_status fo_gemm_allreduce_plan(fo_gemm_allreduce_t op, int64_t m, char* buf, size_t size, size_t* needed);
/* FO_ERROR with its message if an earlier call's wait timed out (synchronise
 * its stream first); FO_OK otherwise. */
FO_C_API fo_status fo_gemm_allreduce_check(fo_gemm_allreduce_t op);
/* The op's shape; each out-pointer may be NULL (not written). */
FO_C_API fo_status fo_gemm_allreduce_shape(fo_gemm_allreduce_t op, int64_t* max_m, int64_t* n, int64_t* k,
                                           fo_dtype* dtype);
/* Waits for the op's last call's work and releases it. NULL: nothing. */
FO_C_API fo_status fo_gemm_allreduce_destroy(fo_gemm_allreduce_t op);

/* ---- GemmReduceScatter: out = this rank's rows of the sum over ranks of a (m x k) * b^T ---- */

/* The defaults (equal to GemmReduceScatterOptions{}'s), writing struct_size
 * bytes of *options: pass sizeof *options. */
FO_C_API fo_status fo_gemm_reducescatter_options_default(fo_gemm_reducescatter_options* options,
                                                         size_t struct_size);
/* Collective over comm: every rank, with the same arguments. options: NULL
 * for the defaults. 1 <= max_m (standard layout: max_m >= world); n >= 1;
 * k % 8 == 0; the sub-tile layout needs world to divide 128. */
FO_C_API fo_status fo_gemm_reducescatter_create(fo_comm_t comm, int64_t max_m, int64_t n, int64_t k, fo_dtype dtype,
                                                const fo_gemm_reducescatter_options* options,
                                                fo_gemm_reducescatter_t* out);
/* out (rows_out(m) x n, ld_out elements per row, 0: n) = this rank's rows of
 * the sum over ranks of a * b^T, in the layout's order, on stream (a
 * cudaStream_t; NULL: the legacy default stream); 1 <= m <= max_m, and m a
 * multiple of the world size for the standard layout. a (m x k), b (n x k)
 * and out are device pointers, required: a rank whose rows_out(m) is 0 (the
 * sub-tile layout, m small) still makes the call (it is collective) and
 * passes some buffer, not written. */
FO_C_API fo_status fo_gemm_reducescatter_run(fo_gemm_reducescatter_t op, const void* a, const void* b, void* out,
                                             int64_t m, void* stream, int64_t ld_out);
/* FP8 inputs: the same with this call's scales (see fo_gemm_allreduce_run_scaled). */
FO_C_API fo_status fo_gemm_reducescatter_run_scaled(fo_gemm_reducescatter_t op, const void* a, const void* b,
                                                    void* out, int64_t m, void* stream, int64_t ld_out,
                                                    const float* scale_a, const float* scale_b);
/* out = RMSNorm(h) * norm_weight, h = this rank's rows + residual;
 * residual_out (optional, NULL: not written) = h. out, residual and
 * residual_out are rows_out(m) x n (ld n, in the layout's row order) and
 * must not overlap; out and residual are required even for 0 rows (see
 * fo_gemm_reducescatter_run). */
FO_C_API fo_status fo_gemm_reducescatter_run_rmsnorm(fo_gemm_reducescatter_t op, const void* a, const void* b,
                                                     const void* residual, const void* norm_weight, float eps,
                                                     void* out, void* residual_out, int64_t m, void* stream);
FO_C_API fo_status fo_gemm_reducescatter_run_rmsnorm_scaled(fo_gemm_reducescatter_t op, const void* a, const void* b,
                                                            const void* residual, const void* norm_weight, float eps,
                                                            void* out, void* residual_out, int64_t m, void* stream,
                                                            const float* scale_a, const float* scale_b);
/* *rows = the rows this rank's output holds for m (m / world for the
 * standard layout). Needs no GPU work. */
FO_C_API fo_status fo_gemm_reducescatter_rows_out(fo_gemm_reducescatter_t op, int64_t m, int64_t* rows);
/* Which rows of C this rank's output holds for m, in order, into rows
 * (count entries), as fo_gemm_reducescatter_plan does for text: at most
 * count of them; *needed (optional) = rows_out(m). rows may be NULL when
 * count is 0 (ask for the count first). */
FO_C_API fo_status fo_gemm_reducescatter_rows(fo_gemm_reducescatter_t op, int64_t m, int64_t* rows, size_t count,
                                              size_t* needed);
/* The AllGather that closes a ReduceScatter -> row-wise step -> AllGather
 * chain: full (m x n, ld n, rows in C's order) = every rank's rows_out(m) x
 * n `local` (ld n, in the layout's row order: what fo_gemm_reducescatter_run
 * or _run_rmsnorm wrote, or a row-wise step's output of it), on every rank,
 * on stream (a cudaStream_t; NULL: the legacy default stream). Collective:
 * every rank calls it with the same m, ordered with the op's calls on
 * stream. The standard layout: one ncclAllGather; the sub-tile layout: an
 * ncclAllGather of the ranks' rows (padded to equal counts), then each row
 * put back in its place (needs n % 8 == 0; the first call with an m
 * allocates, so make it before capturing that m into a CUDA graph). 1 <= m
 * <= max_m, a multiple of the world size for the standard layout. local and
 * full are device pointers, required: a rank whose rows_out(m) is 0 passes
 * some buffer as local, not read (see fo_gemm_reducescatter_run); full must
 * not overlap local. */
FO_C_API fo_status fo_gemm_reducescatter_all_gather_rows(fo_gemm_reducescatter_t op, const void* local, void* full,
                                                         int64_t m, void* stream);
/* Plans m (if new) and allocates what its calls need, without running:
 * before capturing a call with this m into a CUDA graph. */
FO_C_API fo_status fo_gemm_reducescatter_prepare(fo_gemm_reducescatter_t op, int64_t m);
/* The plan m runs with, as text, into buf (size bytes), as snprintf does
 * (see fo_gemm_allreduce_plan). */
FO_C_API fo_status fo_gemm_reducescatter_plan(fo_gemm_reducescatter_t op, int64_t m, char* buf, size_t size,
                                              size_t* needed);
/* FO_ERROR with its message if an earlier call's wait timed out (synchronise
 * its stream first); FO_OK otherwise. */
FO_C_API fo_status fo_gemm_reducescatter_check(fo_gemm_reducescatter_t op);
/* The op's shape and its communicator's world size; each out-pointer may be
 * NULL (not written). */
FO_C_API fo_status fo_gemm_reducescatter_shape(fo_gemm_reducescatter_t op, int64_t* max_m, int64_t* n, int64_t* k,
                                               fo_dtype* dtype, int* world);
/* Waits for the op's last call's work and releases it. NULL: nothing. */
FO_C_API fo_status fo_gemm_reducescatter_destroy(fo_gemm_reducescatter_t op);

/* ---- GemmAllToAll: each rank's rows of a (m x k) * b^T back to their ranks and tokens (the MoE combine) ---- */

/* The defaults (equal to GemmAllToAllOptions{}'s), writing struct_size
 * bytes of *options: pass sizeof *options. */
FO_C_API fo_status fo_gemm_alltoall_options_default(fo_gemm_alltoall_options* options, size_t struct_size);
/* Collective over comm: every rank, with the same arguments. options: NULL
 * for the defaults. max_rows: the most rows of a on any rank in a call
 * (>= 1); max_tokens: the most tokens of any rank (1 <= max_tokens <
 * 2^30); topk: the ranks each token picks (1 <= topk <= world: a rank
 * receives at most max_tokens * topk rows); n >= 1; k % 8 == 0. */
FO_C_API fo_status fo_gemm_alltoall_create(fo_comm_t comm, int64_t max_rows, int64_t max_tokens, int topk, int64_t n,
                                           int64_t k, fo_dtype dtype, const fo_gemm_alltoall_options* options,
                                           fo_gemm_alltoall_t* out);
/* One call, on stream (a cudaStream_t; NULL: the legacy default stream):
 * a (routing->rows x k) and b (n x k) row-major; with combine nonzero, out
 * (routing->tokens x n, ld_out elements per row, 0: n) row t = the sum of
 * gate * row over the rows of token t (every rank's), in fp32 in (source
 * rank, source row) order, rounded once (zeros for a token without rows);
 * with combine 0, out (received rows x n) = the rows sent here, in (source
 * rank, source row) order, unweighted. tokens_out (optional, device, one
 * int32 per received row, in that order; written in either mode) = each
 * received row's token. Collective: the ranks' routings are exchanged
 * first and checked together: a routing that does not add up (counts that
 * disagree between ranks or with dest_rank, a destination or token out of
 * range, sizes beyond the op's) is FO_INVALID_ARGUMENT on every rank.
 * routing is required; a and b may be NULL when routing->rows is 0; out may
 * be NULL when nothing is written (combine: routing->tokens 0; without:
 * no rows received). Not under CUDA-graph capture (FO_INVALID_ARGUMENT). */
FO_C_API fo_status fo_gemm_alltoall_run(fo_gemm_alltoall_t op, const void* a, const void* b,
                                        const fo_alltoall_routing* routing, void* out, int64_t ld_out, int combine,
                                        int32_t* tokens_out, void* stream);
/* fo_gemm_alltoall_run with FP8 inputs' scales (an op created with input
 * FO_INPUT_E4M3 and scales FO_SCALES_PER_TENSOR or FO_SCALES_ROW_WISE:
 * device fp32, one each or scale_a one per row of a and scale_b n; NULL
 * and NULL otherwise), checked with the routing on every rank. */
FO_C_API fo_status fo_gemm_alltoall_run_scaled(fo_gemm_alltoall_t op, const void* a, const void* b,
                                               const fo_alltoall_routing* routing, void* out, int64_t ld_out,
                                               int combine, int32_t* tokens_out, void* stream, const float* scale_a,
                                               const float* scale_b);
/* The last call's plan (e.g. "slots: waves 2,2,1 of 5 (...), predicted ...";
 * "no call yet" before one), as text into buf (size bytes), as snprintf
 * does (see fo_gemm_allreduce_plan). */
FO_C_API fo_status fo_gemm_alltoall_last_plan(fo_gemm_alltoall_t op, char* buf, size_t size, size_t* needed);
/* FO_ERROR with its message if an earlier call's wait timed out (synchronise
 * its stream first); FO_OK otherwise. */
FO_C_API fo_status fo_gemm_alltoall_check(fo_gemm_alltoall_t op);
/* The op's shape and its communicator's world size; each out-pointer may be
 * NULL (not written). */
FO_C_API fo_status fo_gemm_alltoall_shape(fo_gemm_alltoall_t op, int64_t* max_rows, int64_t* max_tokens, int* topk,
                                          int64_t* n, int64_t* k, fo_dtype* dtype, int* world);
/* Waits for the op's last call's work and releases it. NULL: nothing. */
FO_C_API fo_status fo_gemm_alltoall_destroy(fo_gemm_alltoall_t op);

/* ---- GroupedGemm: the experts' GEMM of a mixture of experts, no communication ---- */

/* The defaults (equal to GroupedGemmOptions{}'s), writing struct_size bytes
 * of *options: pass sizeof *options. */
FO_C_API fo_status fo_gemm_grouped_options_default(fo_gemm_grouped_options* options, size_t struct_size);
/* On the current device (no communicator). options: NULL for the defaults.
 * max_rows: the most rows of a in a call (>= 1); experts >= 1; n >= 1;
 * k % 8 == 0. With FO_GROUPED_AUTO it times ours against cuBLAS's here. */
FO_C_API fo_status fo_gemm_grouped_create(int64_t max_rows, int experts, int64_t n, int64_t k, fo_dtype dtype,
                                          const fo_gemm_grouped_options* options, fo_gemm_grouped_t* out);
/* One call on stream: out (rows x n, ld_out elements per row, 0: n) = each
 * expert's counts[e] rows of a (expert after expert, rows x k) times its
 * weight of b ([experts, n, k]) transposed. counts: host, experts entries
 * (>= 0, summing to at most max_rows). Not under CUDA-graph capture. */
FO_C_API fo_status fo_gemm_grouped_run(fo_gemm_grouped_t op, const void* a, const void* b, const int64_t* counts,
                                       void* out, int64_t ld_out, void* stream);
/* The same with the experts' row offsets in device memory (int32, experts
 * entries: offsets[e] = the rows of experts 0..e) and the call's rows given
 * (GroupedGemm::run_offsets): the host waits for nothing; bad offsets are
 * found on the GPU and reported by fo_gemm_grouped_check. */
FO_C_API fo_status fo_gemm_grouped_run_offsets(fo_gemm_grouped_t op, const void* a, const void* b,
                                               const int32_t* offsets, int64_t rows, void* out, int64_t ld_out,
                                               void* stream);
/* FO_INVALID_ARGUMENT with its message if an earlier run_offsets call's
 * offsets were bad (synchronise its stream first; reported once); FO_OK
 * otherwise. */
FO_C_API fo_status fo_gemm_grouped_check(fo_gemm_grouped_t op);
/* The last call's GEMM and why, as text into buf as fo_gemm_allreduce_plan
 * writes its text. */
FO_C_API fo_status fo_gemm_grouped_last_plan(fo_gemm_grouped_t op, char* buf, size_t size, size_t* needed);
/* The op's shape; each out-pointer may be NULL (not written). */
FO_C_API fo_status fo_gemm_grouped_shape(fo_gemm_grouped_t op, int64_t* max_rows, int* experts, int64_t* n,
                                         int64_t* k, fo_dtype* dtype);
/* Waits for the op's last call and releases it. NULL: nothing. */
FO_C_API fo_status fo_gemm_grouped_destroy(fo_gemm_grouped_t op);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FLASHOVERLAP_C_H_ */
