// cmd_bench_ops.cpp — `flashoverlap bench`: the public ops of
// <flashoverlap/flashoverlap.h>, built as a user builds them, against cuBLAS +
// NCCL, on all local GPUs (one process each: main.cpp starts them under the
// launcher; rank and world from the environment, Communicator::from_env()).
// Every figure it prints is the product's: this file includes the public
// header and CUDA's, cuBLAS's and NCCL's, nothing of src/ (the internal
// variants and the tuner's own plans are `lab-bench`, cmd_lab_bench.cpp).
//
// For each shape: correctness first (the op's output and the baseline's from
// the same random inputs, compared on the host), then both timed in turns
// (ABBA: per turn --warmup calls, then --iters calls between two CUDA events,
// each side; the median over turns per rank, the maximum over ranks).
//   --op allreduce      GemmAllReduce        vs cublasGemmEx + ncclAllReduce (in place)
//   --op reducescatter  GemmReduceScatter    vs cublasGemmEx + ncclReduceScatter
//   --op alltoall       GemmAllToAll (MoE)   vs cublasGemmEx + ncclSend/ncclRecv + a combine kernel
//                                              (bench_ops_combine.cu)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_ops_combine.h"
#include "cli_parse.h"
#include "commands.h"
#include "flashoverlap/flashoverlap.h"

namespace flashoverlap::cli {
namespace {

constexpr size_t kCublasWorkspace = size_t(32) << 20;  // 32 MiB, set after every cublasSetStream

struct Options {
  std::string op = "allreduce";
  int64_t m = 4096, n = 8192, k = 8192;
  std::string shapes;  // MxNxK,... (given: overrides --m --n --k; given empty: an error)
  bool shapes_given = false;
  std::string dtype = "bf16";
  std::string path = "auto";
  int nccl_sms = 8;
  int64_t tokens = 0;  // alltoall: tokens per rank (0: the shape's M)
  int topk = 0;        // alltoall: ranks each token picks (0: min(2, world))
  int warmup = 5, iters = 20, turns = 6;
  std::string csv;
  bool json = false;
  bool registered = false;  // allreduce: register_output + run_registered; the baseline's output registered with NCCL
  int nproc = 0;
  std::string tuning_cache;
};

// ----------------------------------------------------------------- the job's environment

// torchrun's or OpenMPI's variable, else OpenMPI's, else nullopt (as
// Communicator::from_env reads them; a malformed value: nullopt here, and
// from_env says what is wrong with it).
std::optional<int> env_int(const char* torchrun, const char* openmpi) {
  for (const char* name : {torchrun, openmpi}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x >= 0 && x < (1L << 20)) return int(x);
    return std::nullopt;
  }
  return std::nullopt;
}
// The job's world size before any GPU is looked at (the options' checks): 1
// for a process started on its own.
int env_world() { return std::max(1, env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE").value_or(1)); }
// The GPU this process runs on: LOCAL_RANK (else RANK), as from_env picks it.
int env_local_rank() {
  if (auto l = env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")) return *l;
  return env_int("RANK", "OMPI_COMM_WORLD_RANK").value_or(0);
}

// ----------------------------------------------------------------- options

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::vector<std::array<int64_t, 3>> shapes_of(const Options& o) {
  if (o.shapes_given && o.shapes.empty())
    throw InvalidArgument("bench --shapes: no shapes given (MxNxK,..., e.g. 4096x8192x8192)");
  auto out = o.shapes_given ? parse_shapes(o.shapes) : std::vector<std::array<int64_t, 3>>{{o.m, o.n, o.k}};
  for (const auto& s : out) check_gemm_shape(s[0], s[1], s[2]);  // (plan's and lab-bench's rule)
  return out;
}

// The --path values of each op, as its options' enum names them.
std::vector<std::string> paths_of(const std::string& op) {
  if (op == "allreduce") return {"auto", "sequential", "row-bands", "slots", "nvlink"};
  return {"auto", "sequential", "slots", "nvlink"};
}

// Everything the command line alone can be wrong in, before any GPU is
// looked for (so that a machine without one says what is wrong, exit 2):
// throws InvalidArgument.
std::vector<std::array<int64_t, 3>> check_options(const Options& o) {
  const bool ar = o.op == "allreduce", rs = o.op == "reducescatter", a2a = o.op == "alltoall";
  if (!ar && !rs && !a2a) throw InvalidArgument("bench --op " + o.op + ": must be allreduce, reducescatter or alltoall");
  if (o.dtype != "bf16" && o.dtype != "fp16") throw InvalidArgument("bench --dtype " + o.dtype + ": must be bf16 or fp16");
  const std::vector<std::string> paths = paths_of(o.op);
  if (std::find(paths.begin(), paths.end(), o.path) == paths.end())
    throw InvalidArgument("bench --op " + o.op + " --path " + o.path + ": must be " + joined(paths) + " (" +
                          (ar ? "GemmAllReduceOptions" : rs ? "GemmReduceScatterOptions" : "GemmAllToAllOptions") +
                          "::Path)");
  if (!a2a && (o.topk != 0 || o.tokens != 0)) throw InvalidArgument("bench: --topk and --tokens are for --op alltoall");
  if (a2a && !o.tuning_cache.empty())
    throw InvalidArgument("bench --op alltoall: --tuning-cache is for allreduce and reducescatter "
                          "(GemmAllToAllOptions has no tuning cache)");
  if (!ar && o.registered) throw InvalidArgument("bench: --registered-output is for --op allreduce");
  const auto shapes = shapes_of(o);
  const int world = env_world();
  if (rs)
    for (const auto& s : shapes)
      if (s[0] % world != 0)
        throw InvalidArgument("bench --op reducescatter: M = " + std::to_string(s[0]) +
                              " is not a multiple of the world size " + std::to_string(world) +
                              " (GemmReduceScatter gives every rank M / world rows)");
  if (a2a) {
    if (o.topk > world)
      throw InvalidArgument("bench --op alltoall: --topk " + std::to_string(o.topk) + " is outside [1, world = " +
                            std::to_string(world) + "] (each token picks distinct ranks, one expert each)");
    // The routing's rows: the most any rank can get is every token of every rank.
    for (const auto& s : shapes) {
      const int64_t tokens = o.tokens ? o.tokens : s[0];
      if (tokens >= (int64_t(1) << 30) || tokens * world >= (int64_t(1) << 31))
        throw InvalidArgument("bench --op alltoall: " + std::to_string(tokens) + " tokens per rank on " +
                              std::to_string(world) + " ranks: too many (below 2^30 a rank and 2^31 in all)");
    }
  }
  return shapes;
}

// ----------------------------------------------------------------- CUDA, cuBLAS, NCCL

struct Fail {
  int rank = -1;
  std::string where() const { return rank < 0 ? "bench: " : "bench: rank " + std::to_string(rank) + ": "; }
};
Fail g_fail;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(g_fail.where() + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void ck(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(g_fail.where() + what + ": " + cublasGetStatusString(s));
}
void ck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(g_fail.where() + what + ": " + ncclGetErrorString(r));
}

// A device allocation (never null: at least 16 bytes, so that an empty
// operand still has an address).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) { ck(cudaMalloc(&p_, bytes_), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// ----------------------------------------------------------------- host bf16 / fp16

uint16_t bf16_bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
uint16_t fp16_bits(float f) {  // round to nearest even, subnormals included
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // 65520 and above round to infinity
  if (x >= 0x38800000u) {                                 // a normal half (2^-14 and above)
    uint32_t r = x - 0x38000000u;                         // the exponent rebiased (127 -> 15)
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  float a;
  std::memcpy(&a, &x, 4);
  return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));  // subnormal: units of 2^-24
}
float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float fp16_value(uint16_t h) {
  const uint32_t sign = (uint32_t(h) & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(float(m), -24);
    return sign ? -v : v;
  }
  const uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// `count` values uniform in [-1, 1), rounded to the element type, from `seed`.
std::vector<uint16_t> random_elements(size_t count, bool bf16, uint64_t seed) {
  std::vector<uint16_t> out(count);
  uint64_t s = seed;
  for (auto& x : out) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float v = float(double(z >> 11) * 0x1p-53 * 2.0 - 1.0);
    x = bf16 ? bf16_bits(v) : fp16_bits(v);
  }
  return out;
}

// ----------------------------------------------------------------- one run's context

struct Context {
  const Options& o;
  Communicator comm;
  int rank = 0, world = 1;
  bool bf16 = true;
  DType dtype = DType::BF16;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cublasHandle_t cublas = nullptr;
  std::unique_ptr<DeviceBuffer> workspace, reduce;  // cuBLAS's; doubles for the maxima over ranks

  Context(const Options& opts, Communicator c) : o(opts), comm(std::move(c)) {
    rank = comm.rank(), world = comm.world();
    bf16 = o.dtype == "bf16";
    dtype = bf16 ? DType::BF16 : DType::FP16;
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaEventCreate(&start), "cudaEventCreate");
    ck(cudaEventCreate(&stop), "cudaEventCreate");
    ck(cublasCreate(&cublas), "cublasCreate");
    workspace = std::make_unique<DeviceBuffer>(kCublasWorkspace);
    reduce = std::make_unique<DeviceBuffer>(64 * sizeof(double));
  }
  ~Context() {
    if (stream) cudaStreamSynchronize(stream);
    if (cublas) cublasDestroy(cublas);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaDataType_t cuda_type() const { return bf16 ? CUDA_R_16BF : CUDA_R_16F; }
  ncclDataType_t nccl_type() const { return bf16 ? ncclBfloat16 : ncclFloat16; }
  float value(uint16_t bits) const { return bf16 ? bf16_value(bits) : fp16_value(bits); }

  // Row-major C (m x n) = A (m x k) * B^T (B: n x k), cuBLAS's default
  // algorithm, fp32 accumulation: the column-major C^T = B A^T.
  void gemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k) {
    if (m == 0) return;
    const float one = 1.f, zero = 0.f;
    ck(cublasSetStream(cublas, stream), "cublasSetStream");
    ck(cublasSetWorkspace(cublas, workspace->get(), workspace->bytes()), "cublasSetWorkspace");
    ck(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, cuda_type(), int(k), a,
                    cuda_type(), int(k), &zero, c, cuda_type(), int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx");
  }

  // Random elements copied to a new device buffer.
  std::unique_ptr<DeviceBuffer> random_buffer(size_t count, uint64_t seed) {
    auto buf = std::make_unique<DeviceBuffer>(count * 2);
    const std::vector<uint16_t> host = random_elements(count, bf16, seed);
    ck(cudaMemcpy(buf->get(), host.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy (inputs)");
    return buf;
  }
  // Every element NaN (0xFFFF in bf16 and fp16): what a call leaves unwritten shows.
  void poison(const DeviceBuffer& buf) { ck(cudaMemsetAsync(buf.get(), 0xFF, buf.bytes(), stream), "cudaMemsetAsync"); }
  std::vector<uint16_t> to_host(const DeviceBuffer& buf, size_t count) {
    std::vector<uint16_t> out(count);
    ck(cudaMemcpy(out.data(), buf.get(), count * 2, cudaMemcpyDeviceToHost), "cudaMemcpy (outputs)");
    return out;
  }

  // The element-wise maximum over the ranks (an ncclAllReduce with ncclMax on
  // the communicator the ops were built on: collective).
  std::vector<double> max_over_ranks(std::vector<double> v) {
    if (v.size() > 64) throw Error("bench: max_over_ranks of more than 64 values");
    ck(cudaMemcpyAsync(reduce->get(), v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice, stream),
       "cudaMemcpyAsync");
    ck(ncclAllReduce(reduce->get(), reduce->get(), v.size(), ncclFloat64, ncclMax, comm.get(), stream),
       "ncclAllReduce (maxima over ranks)");
    ck(cudaMemcpyAsync(v.data(), reduce->get(), v.size() * sizeof(double), cudaMemcpyDeviceToHost, stream),
       "cudaMemcpyAsync");
    ck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return v;
  }

  // ms per call of `call`: --warmup calls, then --iters between two events.
  double time_run(const std::function<void()>& call) {
    for (int i = 0; i < o.warmup; ++i) call();
    ck(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < o.iters; ++i) call();
    ck(cudaEventRecord(stop, stream), "cudaEventRecord");
    ck(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return double(ms) / o.iters;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// ----------------------------------------------------------------- one shape's result

struct Row {
  std::string op;
  int64_t m = 0, n = 0, k = 0;
  int64_t tokens = 0;  // alltoall: tokens per rank (m: the shape's, the tokens)
  int topk = 0;
  double baseline_ms = std::numeric_limits<double>::quiet_NaN();  // (NaN: not timed, the check failed)
  double op_ms = std::numeric_limits<double>::quiet_NaN();
  double max_abs_diff = 0;
  bool pass = false, bitwise = false;
  std::string check, plan;
  double speedup() const { return baseline_ms / op_ms; }
};
Row row_of(const std::string& op, int64_t m, int64_t n, int64_t k) {
  Row r;
  r.op = op, r.m = m, r.n = n, r.k = k;
  return r;
}

// The bound within which the op's output and the baseline's must agree: the
// rule of the project's checks (kernels::gemm_tolerance, restated here):
// inputs uniform in [-1, 1), so a partial of k products has sigma =
// sqrt(k / 9); each side accumulates in fp32 in its own order (at most k
// 2^-20 sigma apart) and rounds once to the element type (its spacing u |v|,
// u = 2^-7 bf16, 2^-10 fp16, with 1/16 to spare); `summands` partials
// rounded on their own before they are summed (the ranks' of a reduction,
// the gate-weighted rows of the combine) add u * 7 sigma each.
struct Bound {
  double atol = 0, rtol = 0;
};
Bound bound_of(bool bf16, int64_t k, int summands) {
  const double u = bf16 ? 0x1p-7 : 0x1p-10, sigma = std::sqrt(double(k) / 9.0);
  return {double(k) * 0x1p-20 * sigma + (summands > 1 ? summands * u * 7.0 * sigma : 0.0), u * (1 + 0x1p-4)};
}

// The op's output against the baseline's, `count` elements on every rank:
// sets row.check, pass, bitwise and max_abs_diff (all over the ranks; collective).
void compare(Context& cx, const DeviceBuffer& ours, const DeviceBuffer& ref, size_t count, Bound bound, Row& row) {
  const std::vector<uint16_t> x = cx.to_host(ours, count), y = cx.to_host(ref, count);
  double diff = 0, beyond = 0, nonfinite = 0, differ = 0;
  for (size_t i = 0; i < count; ++i) {
    if (x[i] == y[i] && (x[i] & 0x7fffu) != 0x7fffu) {  // (the poison is NaN: never "equal")
      if (std::isfinite(cx.value(x[i]))) continue;
    }
    ++differ;
    const double a = cx.value(x[i]), b = cx.value(y[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      ++nonfinite, ++beyond;
      continue;
    }
    const double d = std::fabs(a - b);
    diff = std::max(diff, d);
    if (d > bound.atol + bound.rtol * std::fabs(b)) ++beyond;
  }
  const std::vector<double> all = cx.max_over_ranks({diff, beyond, nonfinite, differ});
  row.max_abs_diff = all[0];
  row.bitwise = all[3] == 0;
  row.pass = all[1] == 0;
  std::ostringstream s;
  s << std::setprecision(3);
  if (row.bitwise) s << "bitwise equal";
  else if (row.pass) s << "PASS (max |diff| " << all[0] << ")";
  else
    s << "FAIL (" << int64_t(all[1]) << " elements beyond " << bound.atol << " + " << bound.rtol
      << "|ref| on a rank; " << int64_t(all[2]) << " not finite; max |diff| " << all[0] << ")";
  row.check = s.str();
}

// The baseline and the op timed in turns, each first in every other turn
// (none if the check failed).
void time_in_turns(Context& cx, const std::function<void()>& baseline, const std::function<void()>& op, Row& row) {
  if (!row.pass) return;
  std::vector<double> base_ms, op_ms;
  for (int t = 0; t < cx.o.turns; ++t) {
    if (t % 2) op_ms.push_back(cx.time_run(op));
    base_ms.push_back(cx.time_run(baseline));
    if (t % 2 == 0) op_ms.push_back(cx.time_run(op));
  }
  const std::vector<double> most = cx.max_over_ranks({median(base_ms), median(op_ms)});
  row.baseline_ms = most[0], row.op_ms = most[1];
}

// Correctness first (the baseline and the op once each on poisoned outputs,
// compared on the host), then both timed in turns; `op`'s check() reports a
// timed-out wait of its calls, `plan` says its plan after the first call.
template <class Op>
void check_then_time(Context& cx, const Op& op, const std::function<void()>& baseline, const std::function<void()>& ours,
                     const DeviceBuffer& out_op, const DeviceBuffer& out_base, size_t count, Bound bound,
                     const std::function<std::string()>& plan, Row& row) {
  cx.poison(out_base), cx.poison(out_op);
  baseline();
  ours();
  ck(cudaStreamSynchronize(cx.stream), "cudaStreamSynchronize");
  op.check();
  compare(cx, out_op, out_base, count, bound, row);
  row.plan = plan();
  time_in_turns(cx, baseline, ours, row);
  ck(cudaStreamSynchronize(cx.stream), "cudaStreamSynchronize");
  op.check();
}

uint64_t shape_seed(int rank, int64_t m, int64_t n, int64_t k, uint64_t what) {
  uint64_t h = 0x2545f4914f6cdd1dull;
  for (uint64_t v : {uint64_t(rank), uint64_t(m), uint64_t(n), uint64_t(k), what}) h = (h ^ v) * 0x100000001b3ull;
  return h;
}

// ----------------------------------------------------------------- the ops

Row bench_allreduce(Context& cx, int64_t m, int64_t n, int64_t k) {
  Row row = row_of("allreduce", m, n, k);
  GemmAllReduceOptions opts;
  const std::string& p = cx.o.path;
  opts.path = p == "sequential"  ? GemmAllReduceOptions::Path::Sequential
              : p == "row-bands" ? GemmAllReduceOptions::Path::RowBands
              : p == "slots"     ? GemmAllReduceOptions::Path::Slots
              : p == "nvlink"    ? GemmAllReduceOptions::Path::NVLink
                                 : GemmAllReduceOptions::Path::Auto;
  opts.nccl_sms = cx.o.nccl_sms;
  opts.tuning_cache = cx.o.tuning_cache;
  const auto a = cx.random_buffer(size_t(m * k), shape_seed(cx.rank, m, n, k, 1));
  const auto b = cx.random_buffer(size_t(n * k), shape_seed(cx.rank, m, n, k, 2));
  const size_t count = size_t(m * n);
  DeviceBuffer out_base(count * 2), out_op(count * 2);  // (before the op: a registered output outlives it)
  void* nccl_handle = nullptr;
  if (cx.o.registered) ck(ncclCommRegister(cx.comm.get(), out_base.get(), out_base.bytes(), &nccl_handle), "ncclCommRegister");
  struct Deregister {
    Context& cx;
    void* handle;
    ~Deregister() {
      if (handle) ncclCommDeregister(cx.comm.get(), handle);
    }
  } deregister{cx, nccl_handle};
  GemmAllReduce op(cx.comm, m, n, k, cx.dtype, opts);  // (collective)
  const int slot = cx.o.registered ? op.register_output(out_op.get()) : -1;
  auto baseline = [&] {
    cx.gemm(a->get(), b->get(), out_base.get(), m, n, k);
    ck(ncclAllReduce(out_base.get(), out_base.get(), count, cx.nccl_type(), ncclSum, cx.comm.get(), cx.stream),
       "ncclAllReduce");
  };
  auto ours = [&] {
    if (cx.o.registered) op.run_registered(a->get(), b->get(), slot, m, cx.stream);
    else op.run(a->get(), b->get(), out_op.get(), m, cx.stream);
  };
  check_then_time(cx, op, baseline, ours, out_op, out_base, count, bound_of(cx.bf16, k, cx.world),
                  [&] { return op.plan(m) + (cx.o.registered ? "; registered output" : ""); }, row);
  return row;
}

Row bench_reducescatter(Context& cx, int64_t m, int64_t n, int64_t k) {
  Row row = row_of("reducescatter", m, n, k);
  if (m % cx.world != 0)  // (checked before the GPU from the environment; the communicator's may differ)
    throw InvalidArgument("bench --op reducescatter: M = " + std::to_string(m) + " is not a multiple of the world size " +
                          std::to_string(cx.world) + " (GemmReduceScatter gives every rank M / world rows)");
  GemmReduceScatterOptions opts;
  const std::string& p = cx.o.path;
  opts.path = p == "sequential" ? GemmReduceScatterOptions::Path::Sequential
              : p == "slots"    ? GemmReduceScatterOptions::Path::Slots
              : p == "nvlink"   ? GemmReduceScatterOptions::Path::NVLink
                                : GemmReduceScatterOptions::Path::Auto;
  opts.nccl_sms = cx.o.nccl_sms;
  opts.tuning_cache = cx.o.tuning_cache;
  const auto a = cx.random_buffer(size_t(m * k), shape_seed(cx.rank, m, n, k, 1));
  const auto b = cx.random_buffer(size_t(n * k), shape_seed(cx.rank, m, n, k, 2));
  GemmReduceScatter op(cx.comm, m, n, k, cx.dtype, opts);  // (collective)
  const int64_t rows = op.rows_out(m);
  const size_t count = size_t(rows * n);
  DeviceBuffer full(size_t(m * n) * 2), out_base(count * 2), out_op(count * 2);
  auto baseline = [&] {
    cx.gemm(a->get(), b->get(), full.get(), m, n, k);
    ck(ncclReduceScatter(full.get(), out_base.get(), count, cx.nccl_type(), ncclSum, cx.comm.get(), cx.stream),
       "ncclReduceScatter");
  };
  auto ours = [&] { op.run(a->get(), b->get(), out_op.get(), m, cx.stream); };
  check_then_time(cx, op, baseline, ours, out_op, out_base, count, bound_of(cx.bf16, k, cx.world),
                  [&] { return op.plan(m); }, row);
  return row;
}

// The MoE combine with one expert per rank. Every rank has T tokens; each
// token picks topk distinct ranks uniformly, with positive gates summing to
// 1, from a seed of the shape: every rank draws the same routing. Rank e's
// expert holds the rows routed to it in (source rank, token, slot) order, as
// all_to_all_single of the dispatch delivers them, and its rows go back to
// their tokens' ranks, where each token's rows are weighted and summed.
Row bench_alltoall(Context& cx, int64_t shape_m, int64_t n, int64_t k) {
  const int W = cx.world, r = cx.rank;
  const int64_t T = cx.o.tokens ? cx.o.tokens : shape_m;
  const int K = cx.o.topk ? cx.o.topk : std::min(2, W);
  if (K < 1 || K > W)
    throw InvalidArgument("bench --op alltoall: --topk " + std::to_string(K) + " is outside [1, world = " +
                          std::to_string(W) + "]");
  Row row = row_of("alltoall", T, n, k);
  row.tokens = T, row.topk = K;
  // The routing: pick[(s * T + t) * K + j] = (rank, gate) of source rank s's token t, slot j.
  std::vector<int32_t> pick_rank(size_t(W * T * K));
  std::vector<float> pick_gate(pick_rank.size());
  {
    std::mt19937_64 rng(shape_seed(0, T, n, k, 0xa11u) ^ uint64_t(W) << 32 ^ uint64_t(K));
    std::uniform_real_distribution<float> uni(0.05f, 1.0f);
    std::vector<int32_t> ranks(size_t(W), 0);
    for (size_t i = 0; i < size_t(W * T); ++i) {
      std::iota(ranks.begin(), ranks.end(), 0);
      float sum = 0;
      for (int j = 0; j < K; ++j) {  // a partial Fisher-Yates shuffle: K distinct ranks
        const int x = j + int(rng() % uint64_t(W - j));
        std::swap(ranks[size_t(j)], ranks[size_t(x)]);
        pick_rank[i * K + j] = ranks[size_t(j)];
        sum += (pick_gate[i * K + j] = uni(rng));
      }
      for (int j = 0; j < K; ++j) pick_gate[i * K + j] /= sum;
    }
  }
  // This rank's expert: its rows, in (source rank, token, slot) order.
  std::vector<int32_t> dest_rank, dest_token;
  std::vector<float> gate;
  std::vector<int64_t> send_counts(size_t(W), 0), recv_counts(size_t(W), 0), rows_of(size_t(W), 0);
  for (int s = 0; s < W; ++s)
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < K; ++j) {
        const size_t i = (size_t(s) * size_t(T) + size_t(t)) * size_t(K) + size_t(j);
        ++rows_of[size_t(pick_rank[i])];
        if (pick_rank[i] == r) {
          dest_rank.push_back(s), dest_token.push_back(int32_t(t)), gate.push_back(pick_gate[i]);
          ++send_counts[size_t(s)];
        }
        if (s == r) ++recv_counts[size_t(pick_rank[i])];
      }
  const int64_t rows = int64_t(dest_rank.size());
  const int64_t max_rows = std::max<int64_t>(1, *std::max_element(rows_of.begin(), rows_of.end()));
  AllToAllRouting routing;
  routing.rows = rows;
  routing.dest_rank = dest_rank.data(), routing.dest_token = dest_token.data(), routing.gate = gate.data();
  routing.tokens = T;
  routing.send_counts = send_counts.data(), routing.recv_counts = recv_counts.data();
  // The baseline's combine on this rank: the received rows (from rank s: s's
  // expert's rows of this rank's tokens, in (token, slot) order), listed per
  // token in (source rank, source row) order with their gates.
  std::vector<std::vector<std::pair<int64_t, float>>> by_token(static_cast<size_t>(T));
  int64_t received = 0;
  for (int s = 0; s < W; ++s)
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < K; ++j) {
        const size_t i = (size_t(r) * size_t(T) + size_t(t)) * size_t(K) + size_t(j);
        if (pick_rank[i] == s) by_token[size_t(t)].push_back({received++, pick_gate[i]});
      }
  std::vector<int64_t> offsets(size_t(T) + 1, 0), index;
  std::vector<float> gates;
  for (int64_t t = 0; t < T; ++t) {
    for (const auto& [row_index, g] : by_token[size_t(t)]) index.push_back(row_index), gates.push_back(g);
    offsets[size_t(t) + 1] = int64_t(index.size());
  }
  DeviceBuffer d_offsets(offsets.size() * 8), d_index(index.size() * 8), d_gates(gates.size() * 4);
  ck(cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (!index.empty()) {
    ck(cudaMemcpy(d_index.get(), index.data(), index.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
    ck(cudaMemcpy(d_gates.get(), gates.data(), gates.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  GemmAllToAllOptions opts;
  const std::string& p = cx.o.path;
  opts.path = p == "sequential" ? GemmAllToAllOptions::Path::Sequential
              : p == "slots"    ? GemmAllToAllOptions::Path::Slots
              : p == "nvlink"   ? GemmAllToAllOptions::Path::NVLink
                                : GemmAllToAllOptions::Path::Auto;
  opts.nccl_sms = cx.o.nccl_sms;
  const auto a = cx.random_buffer(size_t(rows * k), shape_seed(r, T, n, k, 1));
  const auto b = cx.random_buffer(size_t(n * k), shape_seed(r, T, n, k, 2));
  const size_t count = size_t(T * n);
  DeviceBuffer c(size_t(rows * n) * 2), recv(size_t(received * n) * 2), out_base(count * 2), out_op(count * 2);
  GemmAllToAll op(cx.comm, max_rows, T, K, n, k, cx.dtype, opts);  // (collective)
  auto baseline = [&] {
    cx.gemm(a->get(), b->get(), c.get(), rows, n, k);
    const size_t elem = 2;
    ck(ncclGroupStart(), "ncclGroupStart");
    int64_t sent = 0, got = 0;
    for (int d = 0; d < W; ++d) {
      if (send_counts[size_t(d)] > 0)
        ck(ncclSend(c.as<char>() + size_t(sent * n) * elem, size_t(send_counts[size_t(d)] * n), cx.nccl_type(), d,
                    cx.comm.get(), cx.stream),
           "ncclSend");
      if (recv_counts[size_t(d)] > 0)
        ck(ncclRecv(recv.as<char>() + size_t(got * n) * elem, size_t(recv_counts[size_t(d)] * n), cx.nccl_type(), d,
                    cx.comm.get(), cx.stream),
           "ncclRecv");
      sent += send_counts[size_t(d)], got += recv_counts[size_t(d)];
    }
    ck(ncclGroupEnd(), "ncclGroupEnd");
    launch_moe_combine(cx.bf16, recv.get(), n, d_offsets.as<int64_t>(), d_index.as<int64_t>(), d_gates.as<float>(), T,
                       out_base.get(), cx.stream);
    ck(cudaGetLastError(), "the combine kernel's launch");
  };
  auto ours = [&] { op.run(a->get(), b->get(), routing, out_op.get(), cx.stream); };
  check_then_time(cx, op, baseline, ours, out_op, out_base, count, bound_of(cx.bf16, k, std::max(K, 2)),
                  [&] { return op.last_plan(); }, row);
  return row;
}

// ----------------------------------------------------------------- output

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::ostringstream date;
  date << std::put_time(std::gmtime(&now), "%Y-%m-%dT%H:%M:%SZ");
  return date.str();
}

std::string shape_text(const Row& r) {
  return std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k);
}

std::string ms_text(double ms) {
  if (!std::isfinite(ms)) return "-";
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << ms;
  return s.str();
}

struct Machine {
  std::string gpu;
  std::string versions;  // "NVIDIA H200, 132 SMs, driver 13.0, CUDA 13.0, cuBLAS 13.1.0, NCCL 2.28.3, flashoverlap 0.1.0"
  std::string fields;    // the same as "sms=132; driver=13.0; cuda=13.0; cublas=13.1.0; nccl=2.28.3"
};

Machine machine_of(int device) {
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0, nccl = 0, major = 0, minor = 0, patch = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  auto cuda_version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string cublas = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  const std::string nccl_v =
      std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  Machine mc;
  mc.gpu = prop.name;
  mc.versions = mc.gpu + ", " + std::to_string(prop.multiProcessorCount) + " SMs, driver " + cuda_version(driver) +
                ", CUDA " + cuda_version(runtime) + ", cuBLAS " + cublas + ", NCCL " + nccl_v + ", flashoverlap " +
                version();
  mc.fields = "sms=" + std::to_string(prop.multiProcessorCount) + "; driver=" + cuda_version(driver) +
              "; cuda=" + cuda_version(runtime) + "; cublas=" + cublas + "; nccl=" + nccl_v;
  return mc;
}

void print_table(const std::vector<Row>& rows, const Options& o, int world, const Machine& mc) {
  std::cout << "# " << mc.versions << "; world " << world << "; the public ops (flashoverlap.h, path " << o.path
            << ") against cuBLAS + NCCL\n";
  std::cout << std::left << std::setw(14) << "op" << std::setw(18) << "shape" << std::setw(6) << "dtype" << std::right
            << std::setw(6) << "world" << std::setw(13) << "baseline ms" << std::setw(9) << "op ms" << std::setw(9)
            << "speedup" << "  " << std::left << std::setw(30) << "check" << "plan\n";
  for (const Row& r : rows) {
    std::ostringstream sp;
    if (std::isfinite(r.speedup())) sp << std::fixed << std::setprecision(2) << r.speedup() << "x";
    else sp << "-";
    std::cout << std::left << std::setw(14) << r.op << std::setw(18) << shape_text(r) << std::setw(6) << o.dtype
              << std::right << std::setw(6) << world << std::setw(13) << ms_text(r.baseline_ms) << std::setw(9)
              << ms_text(r.op_ms) << std::setw(9) << sp.str() << "  " << std::left << std::setw(30) << r.check
              << r.plan << "\n";
  }
  std::cout << std::right;
  if (o.op == "alltoall")
    std::cout << "alltoall: shape TxNxK, T tokens per rank, top-" << (rows.empty() ? 0 : rows.front().topk)
              << ", uniform routing; the op's times include its per-call exchange of the ranks' routings; the "
                 "baseline's combine is the tool's own kernel (bench_ops_combine.cu)\n";
  if (world == 1)
    std::cout << "world 1: nothing to overlap; the op must tie cuBLAS + NCCL\n";
  else
    std::cout << "speedup: baseline ms / op ms (medians over " << o.turns << " turns of " << o.iters
              << " calls, the slowest rank's)\n";
}

nlohmann::json row_json(const Row& r, const Options& o, int world) {
  nlohmann::json j{{"op", r.op},
                   {"M", r.m},
                   {"N", r.n},
                   {"K", r.k},
                   {"dtype", o.dtype},
                   {"world", world},
                   {"path", o.path},
                   {"nccl_sms", o.nccl_sms},
                   {"baseline_ms", std::isfinite(r.baseline_ms) ? nlohmann::json(r.baseline_ms) : nlohmann::json()},
                   {"op_ms", std::isfinite(r.op_ms) ? nlohmann::json(r.op_ms) : nlohmann::json()},
                   {"speedup", std::isfinite(r.speedup()) ? nlohmann::json(r.speedup()) : nlohmann::json()},
                   {"max_abs_diff", r.max_abs_diff},
                   {"bitwise", r.bitwise},
                   {"pass", r.pass},
                   {"check", r.check},
                   {"plan", r.plan}};
  if (r.op == "alltoall") j["tokens"] = r.tokens, j["topk"] = r.topk;
  if (o.registered) j["registered_output"] = true;
  return j;
}

void append_csv(const std::vector<Row>& rows, const Options& o, int world, const Machine& mc) {
  const bool fresh = !std::ifstream(o.csv).good();
  std::ofstream csv(o.csv, std::ios::app);
  if (!csv) throw Error("bench: cannot write " + o.csv);
  if (fresh)
    csv << "# gpu=" << mc.gpu << "; world=" << world << "; date=" << utc_now() << "; version=" << version() << "; "
        << mc.fields << "\n"
        << "op,M,N,K,dtype,world,path,nccl_sms,tokens,topk,baseline_ms,op_ms,speedup,max_abs_diff,check,plan\n";
  for (const Row& r : rows) {
    csv << r.op << "," << r.m << "," << r.n << "," << r.k << "," << o.dtype << "," << world << "," << o.path << ","
        << o.nccl_sms << "," << (r.op == "alltoall" ? std::to_string(r.tokens) : "") << ","
        << (r.op == "alltoall" ? std::to_string(r.topk) : "") << ",";
    if (std::isfinite(r.baseline_ms)) csv << r.baseline_ms;
    csv << ",";
    if (std::isfinite(r.op_ms)) csv << r.op_ms;
    csv << ",";
    if (std::isfinite(r.speedup())) csv << r.speedup();
    csv << "," << r.max_abs_diff << "," << csv_field(r.check) << "," << csv_field(r.plan)
        << "\n";
  }
  if (!csv) throw Error("bench: cannot write " + o.csv);
}

// ----------------------------------------------------------------- the run

int run(const Options& o) {
  const auto shapes = check_options(o);  // (before the GPU: what the CPU tests see)
  const LocalGpus gpus = local_gpus();
  if (gpus.hopper < 1) {
    std::cerr << "bench: no Hopper (sm_90) GPU found on this machine (" << gpus.reason
              << "); nothing to measure (`flashoverlap plan` shows the plan without a GPU).\n";
    return 1;
  }
  // As a user's program: the process's GPU, then the job's communicator.
  const int device = env_local_rank();
  int visible = 0;
  ck(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
  if (device >= visible)
    throw InvalidArgument("bench: local rank " + std::to_string(device) + " but only " + std::to_string(visible) +
                          " GPUs are visible");
  ck(cudaSetDevice(device), "cudaSetDevice (LOCAL_RANK)");
  Communicator comm = Communicator::from_env();  // (collective)
  ck(cudaSetDevice(device), "cudaSetDevice (LOCAL_RANK)");
  g_fail.rank = comm.rank();
  Context cx(o, comm);
  const Machine mc = machine_of(device);
  std::vector<Row> rows;
  for (const auto& s : shapes) {
    rows.push_back(o.op == "reducescatter" ? bench_reducescatter(cx, s[0], s[1], s[2])
                   : o.op == "alltoall"    ? bench_alltoall(cx, s[0], s[1], s[2])
                                           : bench_allreduce(cx, s[0], s[1], s[2]));
    if (cx.rank == 0 && !o.csv.empty()) append_csv({rows.back()}, o, cx.world, mc);  // (shape by shape)
  }
  const bool all_pass = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.pass; });
  if (cx.rank == 0) {
    if (o.json) {
      nlohmann::json all = nlohmann::json::array();
      for (const Row& r : rows) all.push_back(row_json(r, o, cx.world));
      std::cout << nlohmann::json{{"gpu", mc.gpu},       {"versions", mc.versions}, {"world", cx.world},
                                  {"date", utc_now()},   {"version", version()},    {"warmup", o.warmup},
                                  {"iters", o.iters},    {"turns", o.turns},        {"rows", all}}
                       .dump(1)
                << "\n";
    } else {
      print_table(rows, o, cx.world, mc);
    }
    if (!all_pass) std::cerr << "bench: a result differs from cuBLAS + NCCL beyond the bound (its row: FAIL); not timed\n";
  }
  return all_pass ? 0 : 1;
}

}  // namespace

int run_default_ops_bench() { return run(Options{}); }

void add_bench_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "The public ops (GemmAllReduce, GemmReduceScatter, GemmAllToAll) as users build them, against cuBLAS + "
      "NCCL, on all local GPUs: correctness first, then both timed in turns");
  cmd->add_option("--op", o->op,
                  "allreduce (GemmAllReduce), reducescatter (GemmReduceScatter: M % world == 0) or alltoall "
                  "(GemmAllToAll, the MoE combine: shapes TxNxK, T tokens per rank; --tokens, --topk)")
      ->capture_default_str();
  cmd->add_option("--m", o->m, "Rows of A and C (on every rank; alltoall: tokens per rank)")
      ->capture_default_str()
      ->check(integer_at_least(1));
  cmd->add_option("--n", o->n, "Columns of C (rows of B)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--k", o->k, "Inner dimension (a multiple of 8)")->capture_default_str()->check(integer_at_least(1));
  CLI::Option* shapes = cmd->add_option("--shapes", o->shapes, "Several shapes MxNxK,MxNxK (overrides --m --n --k)");
  cmd->add_option("--dtype", o->dtype, "bf16 or fp16")->capture_default_str();
  cmd->add_option("--path", o->path,
                  "The op's path option: allreduce auto, sequential, row-bands, slots or owners; reducescatter and "
                  "alltoall auto, sequential, slots or nvlink")
      ->capture_default_str();
  cmd->add_option("--nccl-sms", o->nccl_sms, "SMs left to NCCL beside the GEMM (the op's nccl_sms)")
      ->capture_default_str()
      ->check(integer_at_least(1));
  cmd->add_option("--tokens", o->tokens, "alltoall: tokens per rank for every shape (0: the shape's first number)")
      ->capture_default_str()
      ->check(integer_at_least(0));
  cmd->add_option("--topk", o->topk, "alltoall: ranks each token picks (0: min(2, world))")
      ->capture_default_str()
      ->check(integer_at_least(0));
  cmd->add_option("--warmup", o->warmup, "Calls before each timed run")->capture_default_str()->check(integer_at_least(0));
  cmd->add_option("--iters", o->iters, "Calls per timed run (between two CUDA events)")
      ->capture_default_str()
      ->check(integer_at_least(1));
  cmd->add_option("--turns", o->turns,
                  "Turns of both (ABBA: each side first in half of them, as the first after a pause may meet other "
                  "clocks); the median over turns is reported")
      ->capture_default_str()
      ->check(even_turns());
  cmd->add_option("--tuning-cache", o->tuning_cache,
                  "allreduce, reducescatter: the op's tuning_cache option (a file of picks `flashoverlap-lab lab-bench "
                  "--tuning-cache` measured; empty: the op reads $FLASHOVERLAP_TUNING_CACHE itself)");
  cmd->add_flag("--registered-output", o->registered,
                "allreduce: the op writes into an output registered with it (register_output, run_registered), "
                "the baseline into one registered with NCCL (ncclCommRegister)");
  cmd->add_option("--csv", o->csv, "Append the rows to this CSV file (a new file: a '# gpu=...' line and a header)");
  cmd->add_flag("--json", o->json, "Print JSON instead of the table");
  cmd->add_option("--nproc", o->nproc, "Processes (GPUs); default: all local GPUs");
  cmd->footer(
      "Without a Hopper GPU it says so and exits 1 (`flashoverlap plan` shows the plan). The internal variants, the "
      "measured tuner and the diagnostics: `flashoverlap-lab lab-bench`.");
  cmd->callback([o, shapes, &rc] {
    o->shapes_given = shapes->count() > 0;
    rc = run(*o);
  });
}

}  // namespace flashoverlap::cli
