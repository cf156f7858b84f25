// op_setup.cpp — see op_setup.h.
#include "api/op_setup.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "kernels/check.h"
#include "runtime/core/buffer.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/communicator.h"
#include "runtime/core/exchange.h"
#include "runtime/core/cublas.h"
#include "plan/gemm_choice.h"
#include "plan/latency_model.h"
#include "runtime/tune/picks.h"
#include "runtime/tune/timing.h"
#include "runtime/tune/tuner.h"

namespace flashoverlap::api {

std::string from_rank0(ncclComm_t comm, int rank, const std::string& mine, const std::string& what) {
  const std::vector<int64_t> lengths = rt::gather_from_all(comm, rank, int64_t(mine.size()), what + " (lengths)");
  const size_t longest = size_t(*std::max_element(lengths.begin(), lengths.end()));
  std::string padded = mine;
  padded.resize(std::max<size_t>(longest, 1));
  const std::vector<uint8_t> all = rt::gather_bytes(comm, rank, padded.data(), padded.size(), what);
  return std::string(reinterpret_cast<const char*>(all.data()), size_t(lengths[0]));
}

namespace {

// What the construction-time GEMM timings run on: m = `rows` (A: m x k, C:
// m x n), random inputs (e4m3 with FP8 inputs), a stream of their own;
// schedule(i, rows): tile i of op_tiles() on the full grid, for `rows`
// (default m) of A; gemm(i, rows): our GEMM on it, FP8 unscaled where the
// inputs are (the scales cost the epilogue a multiply: nothing to time).
struct Calibration {
  int64_t m, n, k;
  kernels::DType dt;
  InputType input;
  int sms;
  rt::DeviceBuffer a, b, c;
  rt::ScopedStream stream;  // (after the buffers: synchronised before they are freed)
  cudaStream_t st = stream.s;
  Calibration(int64_t rows, int64_t n_, int64_t k_, DType dtype, int sms_, InputType input_ = InputType::Same)
      : m(rows), n(n_), k(k_), dt(to_kernels(dtype)), input(input_), sms(sms_),
        a(size_t(m) * size_t(k) * (fp8() ? 1 : 2)), b(size_t(n) * size_t(k) * (fp8() ? 1 : 2)),
        c(size_t(m) * size_t(n) * 2) {
    if (fp8()) {
      kernels::fill_random_e4m3(a.get(), m * k, 1, -2.f, 2.f, st);
      kernels::fill_random_e4m3(b.get(), n * k, 2, -2.f, 2.f, st);
    } else {
      kernels::fill_random(dt, a.get(), m * k, 1, -1.f, 1.f, st);
      kernels::fill_random(dt, b.get(), n * k, 2, -1.f, 1.f, st);
    }
  }
  bool fp8() const { return input == InputType::E4M3; }
  plan::Schedule schedule(size_t i, int64_t rows = 0) const {
    const plan::TileShape tile = op_tiles(input)[i];
    const int64_t r = rows ? rows : m;
    return plan::make_schedule(r, n, tile, sms, plan::Raster::AlongN,
                               plan::default_swizzle(sms, tile, int32_t((r + tile.bm - 1) / tile.bm)));
  }
  kernels::GemmParams gemm(size_t i, int64_t rows = 0) const {
    kernels::GemmParams p = kernels::plain_gemm(dt, a.get(), b.get(), schedule(i, rows), int(k), c.get(), n);
    p.fp8.on = fp8();
    return p;
  }
};

// Each entry's largest value over the ranks (collective; every rank's
// vector of the same length).
std::vector<double> max_over_ranks(ncclComm_t comm, int rank, const std::vector<double>& mine,
                                   const std::string& what) {
  const std::vector<uint8_t> raw = rt::gather_bytes(comm, rank, mine.data(), mine.size() * sizeof(double), what);
  std::vector<double> all(raw.size() / sizeof(double)), most(mine.size(), 0.0);
  std::memcpy(all.data(), raw.data(), all.size() * sizeof(double));
  for (size_t i = 0; i < all.size(); ++i) most[i % most.size()] = std::max(most[i % most.size()], all[i]);
  return most;
}

}  // namespace

std::vector<double> gemm_wave_ms(ncclComm_t comm, int rank, int64_t max_m, int64_t n, int64_t k, DType dtype,
                                 int sms, const std::string& who, InputType input) {
  const Calibration cal(std::min<int64_t>(max_m, 4096), n, k, dtype, sms, input);
  std::vector<double> mine(op_tiles(input).size());
  for (size_t i = 0; i < op_tiles(input).size(); ++i) {
    kernels::GemmParams p = cal.gemm(i);
    p.four_stages = false;  // (the model's wave: 3 stages, as rt::measure_gemm_ms times it)
    mine[i] = rt::time_on_stream([&] { kernels::launch_gemm(p, cal.st); }, cal.st, 2, 5).median_ms / p.sched.waves();
  }
  FO_CUDA_CHECK(cudaStreamSynchronize(cal.st));
  return max_over_ranks(comm, rank, mine, who + ": the GEMM's wave times");
}

const SequentialGemms::Sample& SequentialGemms::at(int64_t m) const {
  return samples[plan::gemm_choice_sample_of(ms, m)];
}

double SequentialGemms::ratio(int64_t m) const {
  const Sample& x = at(m);
  return x.cublas && x.ours_ms > 0 ? std::min(1.0, x.cublas_ms / x.ours_ms) : 1.0;
}

std::string SequentialGemms::describe(int64_t m) const {
  const Sample& x = at(m);
  std::ostringstream os;
  os.precision(3);
  if (!x.cublas && x.cublas_ms >= kNoGemm) {
    os << std::fixed << "our GEMM (" << x.ours_ms << " ms at m = " << x.m << "; cuBLAS has none for these inputs)";
    return os.str();
  }
  os << std::fixed << (x.cublas ? "cuBLAS's GEMM (" : "our GEMM (") << (x.cublas ? x.cublas_ms : x.ours_ms)
     << " ms against " << (x.cublas ? "ours " : "cuBLAS's ") << (x.cublas ? x.ours_ms : x.cublas_ms) << " ms at m = "
     << x.m << ")";
  return os.str();
}

SequentialGemms measure_sequential_gemms(ncclComm_t comm, int rank, int64_t max_m, int64_t n, int64_t k, DType dtype,
                                         int sms, rt::CublasGemm& cublas, const std::string& who, InputType input,
                                         ScaleKind scales) {
  // Ours must be this much faster: cuBLAS's is F.linear's own kernel, a tie
  // by construction, and a construction-time timing can misjudge a few
  // percent where the GPU runs at its power limit.
  constexpr double kOursMargin = 0.04;
  const std::vector<int64_t> ms = plan::gemm_choice_samples(max_m);
  const Calibration cal(ms.back(), n, k, dtype, sms, input);
  const size_t tiles = op_tiles(input).size();
  std::vector<double> mine;  // per sample: cuBLAS's (kNoGemm where cuBLAS has no such GEMM), then each tile's
  // (cuBLASLt's FP8 matmul wants n % 16 == 0, as torch._scaled_mm, and has
  // no row-wise scales on some GPUs: there ours alone)
  const bool cublas_takes = !cal.fp8() || (n % 16 == 0 && cublas.takes_fp8(fp8_of(input, scales).scales));
  for (int64_t m : ms) {
    std::vector<std::function<void()>> fns = {[&, m] {
      if (!cublas_takes) return;
      if (cal.fp8())
        cublas.run_fp8(cal.dt, kernels::Fp8{true}, cal.a.get(), cal.b.get(), cal.c.get(), int(m), int(n), int(k), n,
                       cal.st);
      else
        cublas.run(cal.dt, cal.a.get(), cal.b.get(), cal.c.get(), int(m), int(n), int(k), n, cal.st);
    }};
    std::vector<kernels::GemmParams> params;
    for (size_t i = 0; i < tiles; ++i) params.push_back(cal.gemm(i, m));
    for (const kernels::GemmParams& p : params) fns.push_back([&p, &cal] { kernels::launch_gemm(p, cal.st); });
    // (fewer runs where a call takes long: the construction stays well under a second)
    const int iters = m <= 1024 ? 15 : 7;
    const std::vector<rt::TimingStats> times = rt::time_interleaved(fns, cal.st, 2, iters, {}, &rt::thread_gate());
    mine.push_back(cublas_takes ? times[0].median_ms : kNoGemm);
    for (size_t i = 0; i < tiles; ++i) mine.push_back(times[1 + i].median_ms);
  }
  FO_CUDA_CHECK(cudaStreamSynchronize(cal.st));
  std::vector<double> most(mine.size(), 0.0);  // (every rank times the same samples: equal lengths)
  const std::vector<uint8_t> all =
      rt::gather_bytes(comm, rank, mine.data(), mine.size() * sizeof(double), who + ": the sequential GEMMs' times");
  for (size_t r = 0; r < all.size() / (mine.size() * sizeof(double)); ++r)
    for (size_t i = 0; i < most.size(); ++i) {
      double t = 0;
      std::memcpy(&t, all.data() + (r * mine.size() + i) * sizeof(double), sizeof(double));
      most[i] = std::max(most[i], t);
    }
  SequentialGemms out;
  for (size_t j = 0; j < ms.size(); ++j) {
    const double* t = &most[j * (tiles + 1)];
    SequentialGemms::Sample x;
    x.m = ms[j], x.cublas_ms = t[0];
    x.ours_tile = size_t(std::min_element(t + 1, t + 1 + tiles) - (t + 1));
    x.ours_ms = t[1 + x.ours_tile];
    x.cublas = !(x.ours_ms < (1 - kOursMargin) * x.cublas_ms);
    out.samples.push_back(x);
  }
  out.ms = ms;
  return out;
}

void check_input_options(const std::string& who, InputType input, ScaleKind scales, int64_t k) {
  if (input != InputType::Same && input != InputType::E4M3) throw InvalidArgument(who + ": unknown input type");
  if (scales != ScaleKind::None && scales != ScaleKind::PerTensor && scales != ScaleKind::RowWise)
    throw InvalidArgument(who + ": unknown scale kind");
  if (input == InputType::Same && scales != ScaleKind::None)
    throw InvalidArgument(who + ": scales are for FP8 inputs (input E4M3)");
  if (input == InputType::E4M3 && k % 16 != 0)
    throw InvalidArgument(who + ": FP8 inputs need k % 16 == 0 (16-byte rows), not k = " + std::to_string(k));
}

void check_input_scales(const std::string& who, InputType input, ScaleKind kind, const InputScales& s) {
  const bool wanted = input == InputType::E4M3 && kind != ScaleKind::None;
  if (!wanted && (s.a || s.b))
    throw InvalidArgument(who + ": scales given to an op built " +
                          (input == InputType::E4M3 ? "with ScaleKind::None" : "for 16-bit inputs"));
  auto aligned4 = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  if (wanted && (!s.a || !s.b || !aligned4(s.a) || !aligned4(s.b)))
    throw InvalidArgument(who + ": FP8 inputs scaled " + (kind == ScaleKind::PerTensor ? "per tensor" : "row-wise") +
                          " need both scales (a and b), 4-byte aligned fp32 in device memory");
}

kernels::Fp8 fp8_of(InputType input, ScaleKind scales) {
  kernels::Fp8 f;
  f.on = input == InputType::E4M3;
  f.scales = !f.on                                ? kernels::Scales::None
             : scales == ScaleKind::PerTensor ? kernels::Scales::PerTensor
             : scales == ScaleKind::RowWise   ? kernels::Scales::RowWise
                                              : kernels::Scales::None;
  return f;
}

bool scatter_takes_tile(InputType input, plan::TileShape tile) {
  return input != InputType::E4M3 || tile.bn == 128;  // (kernels::Fp8: the wider tiles with plain and slot stores only)
}

void check_shape(const std::string& who, int64_t max_m, int64_t n, int64_t k) {
  if (max_m < 1 || n < 1 || k < 8 || k % 8 != 0 || max_m > (int64_t(1) << 30) || n > (int64_t(1) << 30))
    throw InvalidArgument(who + ": needs 1 <= max_m, 1 <= n (both below 2^30) and k a multiple of 8 (16-byte rows)");
}

void check_op_options(const std::string& who, int sms, int nccl_sms, double wait_timeout_s) {
  if (nccl_sms < 1 || nccl_sms > sms / 2)
    throw InvalidArgument(who + ": nccl_sms must be in [1, " + std::to_string(sms / 2) + "], not " +
                          std::to_string(nccl_sms));
  if (!(wait_timeout_s > 0 && wait_timeout_s <= 7 * 24 * 3600.0))
    throw InvalidArgument(who + ": wait_timeout_s must be > 0 and at most a week");
}

void check_run_args(const std::string& who, const void* a, const void* b, const void* out, int64_t ld_out, int64_t n) {
  if (!a || !b || !out) throw InvalidArgument(who + "::run: a, b and out must not be null");
  if (ld_out != 0 && ld_out < n)
    throw InvalidArgument(who + "::run: ld_out must be 0 (n) or at least n, not " + std::to_string(ld_out));
}

void check_rmsnorm_args(const std::string& who, const void* a, const void* b, const void* residual,
                        const void* norm_weight, const void* out, float eps) {
  if (!a || !b || !out || !residual || !norm_weight)
    throw InvalidArgument(who + "::run_rmsnorm: a, b, residual, norm_weight and out must not be null");
  if (!(eps >= 0) || !std::isfinite(eps)) throw InvalidArgument(who + "::run_rmsnorm: eps must be finite and >= 0");
}

std::string current_gpu_name() {
  int dev = 0;
  FO_CUDA_CHECK(cudaGetDevice(&dev));
  return rt::device_info(dev).name;
}

std::string tuning_cache_path(const std::string& option) {
  const char* env_cache = std::getenv("FLASHOVERLAP_TUNING_CACHE");
  return !option.empty() ? option : env_cache ? env_cache : "";
}

std::vector<double> model_wave_ms(int64_t k, InputType input) {
  const plan::GemmModel model;
  std::vector<double> out(op_tiles(input).size());
  for (size_t i = 0; i < out.size(); ++i) {
    const plan::TileShape t = op_tiles(input)[i];
    out[i] = input == InputType::E4M3 ? model.wave_ms(t, k) / 2 : model.wave_ms(t, k);
  }
  return out;
}

std::string rank0_tuning_entries(ncclComm_t comm, int rank, const std::string& option, const rt::PickKey& shape,
                                 const std::string& who) {
  const std::string path = tuning_cache_path(option);
  const std::string mine = path.empty() || rank != 0 ? "" : rt::PickCache(path).entries_for(shape);
  return from_rank0(comm, rank, mine, who + ": the tuning cache");
}

std::unique_ptr<rt::CallWatch> make_call_watch(const std::string& who, double wait_timeout_s,
                                               const std::vector<ncclComm_t>& revocable) {
  // FLASHOVERLAP_CALL_WATCH=0: no call watched (to measure what the watch costs a call).
  const char* env = std::getenv("FLASHOVERLAP_CALL_WATCH");
  auto w = std::make_unique<rt::CallWatch>(who, 2 * wait_timeout_s, !(env && std::strcmp(env, "0") == 0));
  std::vector<ncclComm_t> comms;
  for (ncclComm_t c : revocable)
    if (c && std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  w->on_failure([comms] {
    std::string failed;  // (every one tried; the first failure said)
    for (ncclComm_t c : comms) try {
        rt::revoke_communicator(c);  // (their kernels return)
      } catch (const Error& e) {
        if (failed.empty()) failed = e.what();
      }
    if (!failed.empty()) throw Error(failed);
  });
  return w;
}

bool check_m_enabled(bool option) {
  const char* env = std::getenv("FLASHOVERLAP_CHECK_M");
  return option || (env && std::strcmp(env, "1") == 0);
}

void check_same_m(ncclComm_t comm, int rank, int64_t m, cudaStream_t stream, const std::string& who) {
  if (capturing(stream)) return;
  const std::vector<int64_t> all = rt::gather_from_all(comm, rank, m, who + ": checking m");
  if (std::all_of(all.begin(), all.end(), [&](int64_t x) { return x == all[0]; })) return;
  std::ostringstream os;
  os << who << ": the ranks called with different m (";
  for (size_t r = 0; r < all.size(); ++r) os << (r ? ", " : "") << "rank " << r << ": " << all[r];
  os << "); every rank must pass the same m";
  throw InvalidArgument(os.str());
}

void refuse_planning_under_capture(cudaStream_t stream, int64_t m, const std::string& who) {
  if (capturing(stream))
    throw InvalidArgument(who + ": m = " + std::to_string(m) +
                          " is not planned yet, and planning allocates, which a CUDA graph capture forbids: call "
                          "prepare(m) (or run m once) before capturing");
}

}  // namespace flashoverlap::api
