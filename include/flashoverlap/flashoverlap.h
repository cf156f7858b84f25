// flashoverlap.h — FlashOverlap's C++ API: a GEMM whose output is reduced
// over the ranks of an NCCL communicator while the GEMM still runs (the
// FlashOverlap paper, arXiv 2504.19519; docs/design.md).
//
//   auto comm = flashoverlap::Communicator::adopt(my_nccl_comm);      // or from_env()
//   flashoverlap::GemmAllReduce op(comm, /*max_m=*/8192, /*n=*/8192, /*k=*/8192,
//                                  flashoverlap::DType::BF16);          // collective
//   op.run(x, w, y, m, stream);  // y = sum over ranks of x (m x k) * w^T (w: n x k), any m <= max_m
//
// Errors are flashoverlap::Error (InvalidArgument for what the caller can
// fix), naming the rank, the shape and the CUDA or NCCL error. Every
// object here is used by one thread at a time.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flashoverlap/error.h"

namespace flashoverlap {

// The library's version, "MAJOR.MINOR.PATCH".
const char* version();

// The GPUs of this process the ops run on (Hopper, sm_90, among those
// CUDA_VISIBLE_DEVICES leaves), or why there are none. Never throws.
struct LocalGpus {
  int hopper = 0;            // usable Hopper devices
  bool cuda_failed = false;  // a driver is there but CUDA did not start or answer: not a machine without GPUs
  // Why hopper is 0: "no NVIDIA driver (libcuda.so.1 not found)", "no CUDA
  // device", "no Hopper (sm_90) GPU among 1 device (NVIDIA A100 ...)" or
  // "CUDA failed to start: ..."; "" where there is one.
  std::string reason;
};
LocalGpus local_gpus();

enum class DType { BF16, FP16 };

// FP8 inputs (GemmAllReduceOptions::input): A and B in e4m3
// (torch.float8_e4m3fn), one byte each, with the scales torch._scaled_mm
// takes; the output and the collective stay in the op's dtype.
enum class InputType { Same, E4M3 };
// How FP8 inputs are scaled, in fp32, rounded to the dtype once:
//   None       C = A B^T
//   PerTensor  C = (A B^T * a[0]) * b[0]
//   RowWise    C[i][j] = ((A B^T)[i][j] * a[i]) * b[j]  (a: m, one per row of
//              A; b: n, one per row of B, i.e. per column of C)
enum class ScaleKind { None, PerTensor, RowWise };
// A call's scales, fp32 in device memory, as ScaleKind says (nullptr with None).
struct InputScales {
  const float* a = nullptr;
  const float* b = nullptr;
};

// The NCCL communicator the ops run on. Copies share it; the ops built on
// it keep it alive.
class Communicator {
 public:
  // A communicator the caller owns (PyTorch's, vLLM's, ...): never
  // destroyed here, so it must outlive this object and every op built on it.
  static Communicator adopt(ncclComm_t comm);
  // A new communicator over the processes of a job, from torchrun's
  // environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or
  // OpenMPI's (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK): collective; each
  // process uses GPU LOCAL_RANK (cudaSetDevice). Rank 0 listens on
  // MASTER_PORT (under torchrun, whose agent holds that port: MASTER_PORT +
  // 1) until every rank joined. A single process without those variables
  // gets a communicator of one rank.
  static Communicator from_env();
  // A new communicator from a unique id that one rank made (unique_id())
  // and the caller sent to every rank: collective over `world` ranks, each
  // on its current CUDA device.
  static Communicator from_unique_id(const ncclUniqueId& id, int rank, int world);
  static ncclUniqueId unique_id();

  ncclComm_t get() const;
  int rank() const;
  int world() const;

  struct Impl;

 private:
  explicit Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
  friend class GemmAllReduce;
  friend class GemmReduceScatter;
  friend class GemmAllToAll;
};

// NCCL's AllReduce measured over comm's ranks (collective; each rank on its
// current device), messages of 64 KiB to max_mib MiB, with NCCL on nccl_ctas
// CTAs (0: its default): the bandwidth curve GemmAllReduce plans with (the
// slowest rank's median time per size), as JSON. Rank 0 also writes it to
// `path` where given: allreduce_curve_path(dir, ...) puts it where
// GemmAllReduceOptions::curves = dir finds it. The op reads two per world
// and dtype: nccl_ctas 0 and its nccl_sms (`flashoverlap tune` measures them).
std::string measure_allreduce_curve(const Communicator& comm, DType dtype, int nccl_ctas = 0, double max_mib = 256,
                                    int iters = 10, const std::string& path = {});
// The file under a curves directory that GemmAllReduce reads for that CTA
// budget, world size and dtype.
std::string allreduce_curve_path(const std::string& dir, int nccl_ctas, int world, DType dtype);

struct GemmAllReduceOptions {
  // How the AllReduce runs beside the GEMM:
  //   Auto       the fastest the model predicts for each m (sequential
  //              where nothing would gain), or the tuning cache's pick;
  //   Sequential the faster GEMM for m, then one ncclAllReduce (every
  //              path's sequential calls: cuBLAS's GEMM, as F.linear runs
  //              it, unless ours measured at least 4% faster at
  //              construction near m; plan(m) names the one taken);
  //   RowBands   the GEMM signals as row bands of C finish; one
  //              ncclAllReduce per group of bands, in place, on `nccl_sms`
  //              SMs the GEMM leaves free (any interconnect);
  //   Slots      the paper's layout: tiles into contiguous slots, one
  //              ncclAllReduce per group of waves, then a reorder (fused
  //              with the residual + RMSNorm of run_rmsnorm);
  //   NVLink     (also named Owners) no collective call: each tile is summed by one rank, its
  //              owner, in the GEMM's epilogue, from the other ranks'
  //              partials stored over NVLink, and its final tile sent back
  //              (2-8 ranks that reach each other's memory; the fastest on
  //              2 NVLink GPUs in the CLI's sweeps; through this op not yet
  //              measured, so Auto does not pick it). Built for it, the op
  //              holds a window of (W-1) x 2 x max_m x n elements. Every
  //              call is checked across the ranks on the GPU, always (its
  //              number, m and plan): ranks that disagree fail on every
  //              rank, reported by the next call or check(), naming the
  //              m of each.
  enum class Path { Auto, Sequential, RowBands, Slots, NVLink, Owners = NVLink };
  Path path = Path::Auto;
  // SMs left to NCCL beside the GEMM on the NCCL paths (its communicator,
  // derived from the caller's at construction, is bounded to them).
  int nccl_sms = 8;
  // A wait for a group longer than this fails the call (reported by the
  // next call or by check()), instead of hanging; so does a call whose work
  // runs longer than twice this on the GPU (a peer gone inside an NCCL
  // collective): the op's own communicators are revoked.
  double wait_timeout_s = 30.0;
  // Every call first checks that all ranks passed the same m (one small
  // exchange, synchronising the host with the stream); a mismatch throws
  // InvalidArgument on every rank. Also on with FLASHOVERLAP_CHECK_M=1.
  // Without it, ranks that disagree on m hang in NCCL, as they would in
  // any NCCL program: the check is for debugging. (The Owners path checks
  // every call on the GPU anyway.)
  bool check_m = false;
  // A directory of bandwidth curves measured on this machine (`flashoverlap
  // tune --curves DIR`); rank 0's are used by every rank. Empty: the
  // built-in H200 model.
  std::string curves;
  // A file of picks measured on this machine (`flashoverlap-lab lab-bench
  // --tuning-cache FILE`), looked up by m's tile rows before the model
  // (Auto only); rank 0's file serves every rank. Empty: the environment's
  // FLASHOVERLAP_TUNING_CACHE, if set. A pick of a path this op does not run
  // (or for another nccl_sms) is passed over for the model's plan.
  std::string tuning_cache;
  // The inputs: the dtype's (Same), or E4M3 (FP8; k % 16 == 0; 128 x 192,
  // 128 x 160, 128 x 144, 128 x 128 and 128 x 112 tiles; not on the NVLink path yet; the tuning cache's picks are for
  // 16-bit inputs and passed over), scaled as `scales` says: each call then
  // passes its InputScales.
  InputType input = InputType::Same;
  ScaleKind scales = ScaleKind::None;
};

// The plan GemmAllReduce runs for m, as GemmAllReduce::plan(m) words it, from
// the model alone (no GPU, nothing measured; `flashoverlap plan` prints it):
// our GEMM's time per wave from the built-in model, the AllReduce curves
// from options.curves or the built-in H200 model, the tuning cache's picks
// (options.tuning_cache, else $FLASHOVERLAP_TUNING_CACHE) for the GPU named
// `gpu` with `sms` SMs. The op plans with the same code on what it measures
// when built (its GEMM's times, cuBLAS's for the sequential calls).
std::string plan_gemm_allreduce(int64_t m, int64_t n, int64_t k, int world, DType dtype,
                                const GemmAllReduceOptions& options = {}, int sms = 132,
                                const std::string& gpu = "NVIDIA H200");

// C = A * B^T summed over the ranks of a communicator (AllReduce), with A
// (m x k, row-major), B (n x k, row-major: nn.Linear's weight), C (m x n),
// bf16 or fp16, fp32 accumulation, overlapped as the plan for m says. On 2
// ranks the result is bitwise our GEMM followed by one ncclAllReduce.
//
// Calls and streams: calls may come on any streams; the op orders each call
// after the previous one. Every rank makes the same calls, with the same
// m, in the same order (as every NCCL program must). Calls of several ops
// on one GPU must be ordered (one stream, or events). The destructor waits
// for the last call's work.
//
// CUDA graphs: run and run_rmsnorm may be captured (and the graph replayed,
// mixed with eager calls) on the Sequential, RowBands and Slots paths, for
// an m the op has planned already (an eager call or prepare(m) first:
// planning allocates). Destroy the op only after its graphs' work is done.
class GemmAllReduce {
 public:
  // Collective over `comm`: every rank, with the same arguments. Measures
  // the GEMM once per tile shape (the model's GEMM times) and against
  // cuBLAS's at a few m up to max_m (the sequential calls' GEMM; well under
  // a second), and derives the bounded communicator. 1 <= max_m; n >= 1; k % 8 == 0 (16-byte rows).
  // With Path::Owners the destructor is collective too (the window's
  // deregistration): destroy the op on every rank.
  GemmAllReduce(const Communicator& comm, int64_t max_m, int64_t n, int64_t k, DType dtype,
                const GemmAllReduceOptions& options = {});
  ~GemmAllReduce();
  GemmAllReduce(GemmAllReduce&&) noexcept;
  GemmAllReduce& operator=(GemmAllReduce&&) noexcept;

  // out (m x n, ld_out elements per row, 0: n) = AllReduce(A * B^T), on
  // `stream`; any 1 <= m <= max_m, a different m on consecutive calls. An m
  // not seen before is planned first (from the model: no measurement; on
  // the host, well under a millisecond) and its plan kept. FP8 inputs
  // (options.input): `scales` as options.scales says (each call's, applied
  // to this rank's product before the sum).
  void run(const void* a, const void* b, void* out, int64_t m, cudaStream_t stream, int64_t ld_out = 0,
           const InputScales& scales = {});
  // out = RMSNorm(h) * norm_weight, h = AllReduce(A * B^T) + residual,
  // per row of n: h * rsqrt(mean(h^2) + eps) * norm_weight, h rounded to
  // the dtype first; residual_out (optional) = h. out, residual and
  // residual_out are m x n (ld n) and must not overlap.
  void run_rmsnorm(const void* a, const void* b, const void* residual, const void* norm_weight, float eps, void* out,
                   void* residual_out, int64_t m, cudaStream_t stream, const InputScales& scales = {});
  // The registered-output form. register_output is collective (every rank,
  // in the same order, each its own buffer): `out` (max_m x n, ld_out
  // elements per row, 0: n; 16-byte aligned, ld_out % 8 == 0; from
  // cudaMalloc where the ranks are processes of their own; it must outlive
  // the op) becomes output `slot` (the same on every rank). run_registered
  // is run into it; on the NVLink path the other ranks store their final
  // tiles straight into it (no copy of them after the GEMM: the fastest form
  // on 2 NVLink GPUs in the CLI's sweeps); on the others it is run.
  int register_output(void* out, int64_t ld_out = 0);
  void run_registered(const void* a, const void* b, int slot, int64_t m, cudaStream_t stream,
                      const InputScales& scales = {});
  // Plans m (if new) and allocates what its calls need, without running:
  // before capturing a call with this m into a CUDA graph. The op keeps
  // what it made for the last 64 m it ran (the least recently used goes,
  // after its last call is done), and for every m prepared or captured.
  void prepare(int64_t m);
  // The plan m runs with, e.g. "row bands, groups of bands 2,1,1 (128x256
  // tiles, 124 CTAs, NCCL on 8 SMs), predicted 0.41 ms".
  std::string plan(int64_t m);
  // Throws the Error of an earlier call whose wait timed out (synchronise
  // its stream first), or whose work ran past twice wait_timeout_s on the
  // GPU (a peer that died inside an NCCL collective: the op's own
  // communicators are then revoked and a message goes to stderr at once);
  // nothing otherwise. Every later call throws it too, before enqueuing anything:
  // the ranks are out of step, so build the communicator and the op anew.
  void check() const;

  int64_t max_m() const;
  int64_t n() const;
  int64_t k() const;
  DType dtype() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct GemmReduceScatterOptions {
  // How the ReduceScatter runs beside the GEMM:
  //   Auto       the fastest the model predicts for each m (sequential
  //              where nothing would gain);
  //   Sequential the faster GEMM for m (as GemmAllReduceOptions says; a
  //              tuning cache's pick keeps the GEMM it measured), then one
  //              ncclReduceScatter;
  //   Slots      the paper's: each tile row stored where its destination's
  //              part of its group's send buffer is, one ncclReduceScatter
  //              per group on `nccl_sms` SMs the GEMM leaves free, then the
  //              received rows put in order (fused with the residual +
  //              RMSNorm of run_rmsnorm);
  //   NVLink     no collective: the GEMM, on every SM, stores each row of C
  //              straight into its owner's window (mapped over NVLink) and
  //              counts it there; the owner sums its ranks' parts in rank
  //              order (fused with run_rmsnorm's step). Standard layout, n %
  //              8 == 0, world <= 8, every GPU within load/store reach of
  //              every other (one host), refused at construction otherwise;
  //              2 x max_m x n elements of window; a call under CUDA graph
  //              capture is refused. Every call is checked across the
  //              ranks on the GPU, always (its number, m and plan): ranks
  //              that disagree fail on every rank, bounded, and the op is
  //              then built anew. Not yet picked by Auto (not yet measured
  //              on several GPUs).
  enum class Path { Auto, Sequential, Slots, NVLink };
  Path path = Path::Auto;
  // Which rows each rank ends with:
  //   Standard  rank r: rows [r m/W, (r+1) m/W) of the sum, what
  //             ncclReduceScatter of row-major C gives (m % W == 0);
  //   SubTile   the paper's sub-tile layout: rank r holds rows
  //             t*128 + r*128/W + [0, 128/W) of every 128-row tile row t
  //             (rows() lists them): for a chain ReduceScatter ->
  //             row-wise step -> AllGather, whose row order the caller
  //             restores after the AllGather. Any m; W divides 128.
  enum class Layout { Standard, SubTile };
  Layout layout = Layout::Standard;
  int nccl_sms = 8;              // SMs left to NCCL beside the GEMM (its communicator bounded to them)
  double wait_timeout_s = 30.0;  // as GemmAllReduceOptions
  bool check_m = false;          // as GemmAllReduceOptions (also FLASHOVERLAP_CHECK_M=1)
  // As GemmAllReduceOptions (`flashoverlap bench --op reducescatter
  // --tuning-cache FILE` stores the measured picks; Auto only; empty: the
  // environment's FLASHOVERLAP_TUNING_CACHE). A pick of the NVLink form
  // builds its windows at construction where every rank reaches every
  // other; elsewhere, or for another nccl_sms, the model's plan is taken.
  // The m so picked refuse CUDA graph capture, as Path::NVLink does: to
  // capture, leave the cache out or choose Slots.
  std::string tuning_cache;
  // As GemmAllReduceOptions (FP8 inputs: every path; 128 x 192, 128 x 160,
  // 128 x 144, 128 x 128 and 128 x 112 tiles, the NVLink form 128 x 128; the calls' scales as
  // run's InputScales).
  InputType input = InputType::Same;
  ScaleKind scales = ScaleKind::None;
};

// The plan GemmReduceScatter runs for m on rank `rank`, as
// GemmReduceScatter::plan(m) words it, from the model alone (no GPU, nothing
// measured; `flashoverlap plan` prints it): as plan_gemm_allreduce, with the
// tuning cache's ReduceScatter picks. The op plans with the same code.
std::string plan_gemm_reducescatter(int64_t m, int64_t n, int64_t k, int world, DType dtype,
                                    const GemmReduceScatterOptions& options = {}, int sms = 132,
                                    const std::string& gpu = "NVIDIA H200", int rank = 0);

// This rank's rows of C = sum over the ranks of A * B^T (ReduceScatter),
// A (m x k) and B (n x k) row-major, bf16 or fp16, fp32 accumulation; the
// GEMM + ReduceScatter of sequence-parallel and FSDP layers. The output
// has rows_out(m) rows of n (m / W with the standard layout). On 2 ranks the result is
// bitwise our GEMM followed by one ncclReduceScatter. Calls, streams, CUDA
// graphs and errors: as GemmAllReduce.
class GemmReduceScatter {
 public:
  // Collective over `comm`. 1 <= max_m; n >= 1; k % 8 == 0.
  GemmReduceScatter(const Communicator& comm, int64_t max_m, int64_t n, int64_t k, DType dtype,
                    const GemmReduceScatterOptions& options = {});
  ~GemmReduceScatter();
  GemmReduceScatter(GemmReduceScatter&&) noexcept;
  GemmReduceScatter& operator=(GemmReduceScatter&&) noexcept;

  // out (rows_out(m) x n, ld_out elements per row, 0: n) = this rank's rows
  // of the sum; any m <= max_m that the layout takes (Standard: m % W == 0).
  void run(const void* a, const void* b, void* out, int64_t m, cudaStream_t stream, int64_t ld_out = 0,
           const InputScales& scales = {});
  // out = RMSNorm(h) * norm_weight, h = this rank's rows + residual (all
  // rows_out(m) x n, ld n, in the layout's row order); residual_out = h if set.
  void run_rmsnorm(const void* a, const void* b, const void* residual, const void* norm_weight, float eps, void* out,
                   void* residual_out, int64_t m, cudaStream_t stream, const InputScales& scales = {});
  // The rows this rank's output holds for m: rows_out(m) of them, and which
  // rows of C they are, in order.
  int64_t rows_out(int64_t m) const;
  std::vector<int64_t> rows(int64_t m) const;
  // The AllGather that closes the chain: every rank's rows_out(m) x n
  // (`local`, ld n) into `full` (m x n, rows in C's order) on every rank.
  // Standard: one ncclAllGather; SubTile: an ncclAllGather of the ranks'
  // rows (padded to equal counts), then each row put back in its place
  // (needs n % 8 == 0). Collective; ordered with the op's calls on `stream`;
  // may be captured into a CUDA graph for an m prepared (prepare(m)) or
  // gathered before.
  void all_gather_rows(const void* local, void* full, int64_t m, cudaStream_t stream);
  void prepare(int64_t m);
  std::string plan(int64_t m);
  void check() const;

  int64_t max_m() const;
  int64_t n() const;
  int64_t k() const;
  DType dtype() const;
  int world() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct GemmAllToAllOptions {
  // How the All-to-All runs beside the GEMM:
  //   Auto       the fastest the model predicts for each call's routing
  //              (sequential where nothing would gain);
  //   Sequential one GEMM, then one all-to-all (each destination's block
  //              of C as it is where every rank's rows are by destination,
  //              the dispatch's order, and there the faster GEMM for this
  //              rank's rows, as GemmAllReduceOptions says; else our GEMM
  //              through the send slots);
  //   Slots      the paper's: each row stored where its destination's part
  //              of its group's send slots is, and per group of waves one
  //              NCCL group of ncclSend / ncclRecv on `nccl_sms` SMs the
  //              GEMM leaves free (a call of fewer than 2 waves: sequential);
  //   NVLink     no collective: the GEMM, on every SM, stores each row
  //              straight into its destination's receive window (mapped
  //              over NVLink) as its tile finishes and counts it there; the
  //              receiver combines once every source's count is in. Needs
  //              every rank's GPU within load/store reach (one host), n % 8
  //              == 0, world <= 8, and per tile shape used 2 x max_tokens x
  //              topk x n elements of window; refused at construction
  //              otherwise. Every call is checked across the ranks on the
  //              GPU, always (its number; each rank's rows, signals and
  //              rows to each rank): ranks out of step fail on every rank,
  //              bounded, and the op is then built anew (the op exchanges
  //              the routing, so every rank plans from the same). Not yet picked by Auto (not yet
  //              measured on several GPUs).
  enum class Path { Auto, Sequential, Slots, NVLink };
  Path path = Path::Auto;
  // Experts per rank (E >= 1): b holds their weights stacked, [E, n, k] (each
  // an nn.Linear weight), and each call's rows come by (source rank,
  // expert) (AllToAllRouting::expert_counts); the GEMM is then the grouped
  // one, each expert's rows times its own weight. The same on every rank.
  int experts = 1;
  int nccl_sms = 8;              // SMs left to NCCL beside the GEMM (its communicator bounded to them)
  double wait_timeout_s = 30.0;  // as GemmAllReduceOptions
  // Every call's routing exchange waits this long for the other ranks, then
  // fails (a rank that failed alone, or never called): the op is then out
  // of step with the others, and is built anew.
  double exchange_timeout_s = 120.0;
  // As GemmAllReduceOptions (FP8 inputs: one expert per rank, every path,
  // 128 x 192, 128 x 160, 128 x 144, 128 x 128 and 128 x 112 tiles, the NVLink form 128 x 128; row-wise scale_a has one entry per row of A, the
  // call's routing.rows; the calls' scales as run's InputScales).
  InputType input = InputType::Same;
  ScaleKind scales = ScaleKind::None;
};

// One call's routing on this rank, in host memory: what the MoE dispatch
// produced. Row i of A (and of A * B^T) goes back to rank dest_rank[i],
// where it is row dest_token[i] of that rank's tokens, weighted by gate[i].
// send_counts[d] = the rows with dest_rank d; recv_counts[s] = the rows rank
// s sends here (all_to_all_single's input and output split sizes).
struct AllToAllRouting {
  int64_t rows = 0;                  // m: rows of A on this rank (0 allowed)
  const int32_t* dest_rank = nullptr;   // [rows]
  const int32_t* dest_token = nullptr;  // [rows], in [0, the destination's tokens)
  const float* gate = nullptr;          // [rows]; may be null when not combining
  int64_t tokens = 0;                // this rank's tokens: rows of the combined output
  const int64_t* send_counts = nullptr;  // [world]
  const int64_t* recv_counts = nullptr;  // [world]
  // dest_rank, dest_token and gate in device memory (the counts stay on the
  // host). At world 1 (paths Auto and Sequential, n % 8 == 0) the call then
  // never waits for the host: the routing is checked and the combine's
  // tables made on the GPU, in `stream`, which reads the arrays there (keep
  // them unchanged until it has); a bad row (a rank other than 0, a token
  // out of range, a gate not finite) is left out of the combine and
  // reported once, by check() or by the next call (InvalidArgument).
  // (With several experts per rank too: the experts' GEMM is then a
  // GroupedGemm's.) Elsewhere the call copies the arrays to the host first
  // (it waits for `stream`).
  bool on_device = false;
  // With E = GemmAllToAllOptions::experts > 1 (null with one): host,
  // [world * E], expert_counts[s * E + e] = the rows of A from rank s for
  // local expert e. A's rows come in that order, source after source and
  // within a source expert after expert: what all_to_all_single delivers
  // when every rank sends its rows sorted by global expert (rank * E + e),
  // so no permutation is needed. A source's counts sum to send_counts[s]
  // (its rows go back to it: dest_rank s), and a token may have several
  // rows here, one per expert of this rank it picked; each comes back as
  // its own row (none is summed before the All-to-All).
  const int64_t* expert_counts = nullptr;
};

// The MoE combine of expert parallelism: each rank's expert output A * B^T
// (A: m x k, the rows its experts received; B: n x k, or [E, n, k] with E
// experts per rank, each row times its expert's weight) goes back to the
// ranks of its tokens, overlapped with the GEMM. With
// combine, out (tokens x n) row t = the sum of gate * row over the rows of
// token t, in fp32 in (source rank, source row) order, rounded once;
// without, out (received rows x n) = the received rows in (source rank,
// source row) order, what all_to_all_single of the rows sorted (stably) by
// destination gives, and tokens_out each one's token. On 2 ranks the result
// is bitwise our GEMM + ncclSend/ncclRecv + our combine.
//
// Every call is collective: the ranks' routings are exchanged first (one
// all-gather of every rank's routing on a communicator of the op's own,
// which the host waits for: not for CUDA graphs), then every rank plans the
// call alike. Calls, streams and errors: as GemmAllReduce.
class GemmAllToAll {
 public:
  // Collective over `comm`, with the same arguments on every rank.
  // max_rows: the most rows of A on any rank in a call; max_tokens: the most
  // tokens of any rank; topk: the experts each token picks (each token gets
  // topk rows back: at most max_tokens * topk received). 1 <= topk <= world
  // * options.experts; n >= 1; k % 8 == 0.
  GemmAllToAll(const Communicator& comm, int64_t max_rows, int64_t max_tokens, int topk, int64_t n, int64_t k,
               DType dtype, const GemmAllToAllOptions& options = {});
  ~GemmAllToAll();
  GemmAllToAll(GemmAllToAll&&) noexcept;
  GemmAllToAll& operator=(GemmAllToAll&&) noexcept;

  // out (ld_out elements per row, 0: n): the combine (tokens x n) or, with
  // combine false, the received rows; tokens_out (optional, device, one
  // int32 per received row) their tokens. `combine` must be the same on
  // every rank (the receivers weight the rows by the senders' gates).
  // Throws InvalidArgument on every rank for a call that does not add up on
  // any rank (counts that disagree between ranks or with dest_rank, a token
  // out of range, sizes beyond the op's, null pointers where data goes);
  // at world 1 with routing.on_device, what only the arrays tell (a rank
  // other than 0, a token out of range, a gate not finite) is found on the
  // GPU instead: that row is left out, and check() or the next call throws.
  void run(const void* a, const void* b, const AllToAllRouting& routing, void* out, cudaStream_t stream,
           bool combine = true, int64_t ld_out = 0, int32_t* tokens_out = nullptr, const InputScales& scales = {});
  // The last call's plan, e.g. "slots: waves 2,2,1 of 5 (128x256, 124
  // CTAs), predicted 0.410 ms against 0.520 ms sequential; NCCL on 8 SMs".
  std::string last_plan() const;
  // Error if an earlier call's wait timed out or its work ran past twice
  // wait_timeout_s (as GemmAllReduce::check), or InvalidArgument (once)
  // for a bad row an on_device routing's call found (synchronise its
  // stream first).
  void check() const;

  int64_t max_rows() const;
  int64_t max_tokens() const;
  int topk() const;
  int experts() const;
  int64_t n() const;
  int64_t k() const;
  DType dtype() const;
  int world() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct GroupedGemmOptions {
  // Which GEMM a call runs:
  //   Auto    the faster of ours (one launch over every expert's rows) and
  //           cuBLAS's (one GEMM per expert), as timed at construction, in
  //           turns, at the call's mean rows per expert (uniform counts at
  //           each power of two up to 128 rows and each tile-row count above,
  //           up to max_rows / experts, on at most 8 of the experts); a
  //           near tie goes to cuBLAS's where every expert was timed, to
  //           ours where more run (cuBLAS's launches grow with them);
  //   Ours    always ours;  Cublas  always cuBLAS's.
  enum class Path { Auto, Ours, Cublas };
  Path path = Path::Auto;
};

// The grouped GEMM of a mixture of experts, with no communication: A's rows
// grouped by expert (counts[e] rows of expert e, expert after expert, as a
// dispatch sorts them), B the experts' weights stacked [experts, n, k] (each
// an nn.Linear weight), and row i of C = row i of A times its expert's
// weight transposed; bf16 or fp16, fp32 accumulation. Ours computes each
// expert's rows in tile rows of their own (a tile row never mixes two
// experts: an expert's last tile row is ragged), in one persistent launch.
// Calls are ordered as GemmAllReduce's; not for CUDA graph capture (a call
// uploads its counts' tables).
class GroupedGemm {
 public:
  // max_rows: the most rows of A in a call; experts >= 1; k % 8 == 0. Times
  // the two GEMMs on the current device (Path::Auto; well under a second).
  GroupedGemm(int64_t max_rows, int experts, int64_t n, int64_t k, DType dtype,
              const GroupedGemmOptions& options = {});
  ~GroupedGemm();
  GroupedGemm(GroupedGemm&&) noexcept;
  GroupedGemm& operator=(GroupedGemm&&) noexcept;

  // out (rows x n, ld_out elements per row; 0: n) for A (rows x k) and B
  // ([experts, n, k]), device pointers, 16-byte aligned; counts: host,
  // `experts` entries >= 0 summing to rows <= max_rows (0 rows: nothing runs).
  void run(const void* a, const void* b, const int64_t* counts, void* out, cudaStream_t stream, int64_t ld_out = 0);
  // The same with the experts' row offsets in device memory (int32,
  // `experts` entries: offsets[e] = the rows of experts 0..e, as
  // torch._grouped_mm's offs) and the call's rows (a's, <= max_rows) given:
  // the host waits for nothing, and our GEMM runs (cuBLAS's, one GEMM per
  // expert, would need the counts on the host). Offsets that decrease or
  // pass `rows` are found on the GPU: that expert's rows and every later
  // one's are left out, and check() throws InvalidArgument (once). Rows past
  // the last offset belong to no expert: their rows of out are not written.
  void run_offsets(const void* a, const void* b, const int32_t* offsets, int64_t rows, void* out, cudaStream_t stream,
                   int64_t ld_out = 0);
  // InvalidArgument naming the expert if an earlier run_offsets call's
  // offsets were bad (synchronise its stream first); then clear.
  void check() const;
  // The last call's GEMM and why, e.g. "ours: 9 tile rows of 128x256 on 132
  // CTAs (mean 40 rows per expert: ours 0.031 ms against cuBLAS's 0.052 ms)".
  std::string last_plan() const;

  int64_t max_rows() const;
  int experts() const;
  int64_t n() const;
  int64_t k() const;
  DType dtype() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The plan GemmAllToAll runs for a call on rank `rank`, as
// GemmAllToAll::last_plan() words it, from the model alone (no GPU, nothing
// measured; `flashoverlap plan --op alltoall` prints it): every rank's
// routing (routings[r] is rank r's, host arrays; gate may be null), checked
// as the op checks a call, our GEMM's time per wave from the built-in model.
// The op plans with the same code on what it measures when built (its
// GEMM's times, cuBLAS's for the sequential calls: where the model says our
// GEMM, the op may say cuBLAS's).
std::string plan_gemm_alltoall(const std::vector<AllToAllRouting>& routings, int64_t n, int64_t k, DType dtype,
                               const GemmAllToAllOptions& options = {}, int sms = 132, int rank = 0);

}  // namespace flashoverlap
