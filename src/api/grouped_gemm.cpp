// grouped_gemm.cpp — flashoverlap::GroupedGemm (flashoverlap.h): ours (the
// signalling kernel's grouped tile rows, plan/grouped.h, in one launch) or
// cuBLAS's one GEMM per expert, by the call's mean rows per expert and the
// times taken at construction.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>

#include "api/op_setup.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "kernels/grouped_tables.h"
#include "plan/gemm_choice.h"
#include "plan/grouped.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/core/staging_ring.h"
#include "runtime/tune/host_gate.h"
#include "runtime/tune/timing.h"

namespace flashoverlap {

namespace {
// The staging ring's pinned memory at most, and its slots: the calls the host may queue ahead of the GPU.
constexpr size_t kStagingBytes = size_t(16) << 20, kStagingSlots = 256;
// The calibration's weights at most: all experts where they fit, so that it times the calls' own loads.
constexpr int64_t kCalibrationWeightBytes = int64_t(1) << 30;
}  // namespace

struct GroupedGemm::Impl {
  int64_t max_rows = 0, n = 0, k = 0;
  int experts = 0, sms = 0;
  DType dtype = DType::BF16;
  GroupedGemmOptions opts;
  // (made once the arguments are checked; GemmEx: no per-shape state, and every call's counts differ)
  std::unique_ptr<rt::CublasGemm> cublas;
  // Path::Auto: per sample of mean rows per expert, the two GEMMs' times.
  struct Sample {
    int64_t rows = 0;
    double ours_ms = 0, cublas_ms = 0;
    size_t tile = 0;  // ours: the faster of op_tiles()
    bool cublas = false;
  };
  std::vector<Sample> samples;
  std::vector<int64_t> sample_rows;
  // A call's tables, [a_row0 | b_row0 | rows] of its tile rows: built in a
  // pinned slot of the ring (reused once its copy has run), copied in one
  // piece to the device.
  int32_t max_tile_rows = 0;
  rt::DeviceBuffer tables;
  rt::StagingRing staging;
  cudaEvent_t done = nullptr;  // the last call's end (a call on another stream waits for it)
  rt::PinnedBuffer bad;  // host-mapped (made once the arguments are checked): run_offsets' first bad expert + 1
  cudaStream_t last_stream = nullptr;
  bool called = false;
  // The last call, told by last_plan() (its text is made there, not per call).
  struct Last {
    enum Kind { None, Empty, Cublas, Ours, Offsets } kind = None;
    int64_t mean = 0, tile_rows = 0;
    size_t tile = 0;
    int32_t ctas = 0;
    const Sample* at = nullptr;
  } last;

  ~Impl() {
    if (done) cudaEventSynchronize(done);  // (its last call reads the tables)
    if (done) cudaEventDestroy(done);
  }
  std::string who() const {
    return "GroupedGemm (max_rows " + std::to_string(max_rows) + ", " + std::to_string(experts) + " experts, n " +
           std::to_string(n) + ", k " + std::to_string(k) + ")";
  }
  // Our GEMM of these tile rows, their tables at device_tables.
  kernels::GemmParams ours(const plan::GroupedTileRows& g, size_t tile, const void* a, const void* b, void* out,
                           int64_t ld, const int32_t* device_tables, int64_t a_rows, int e) const {
    const plan::TileShape t = api::op_tiles()[tile];
    const plan::Schedule s = plan::make_grouped_schedule(g, n, t, sms, plan::Raster::AlongN,
                                                         plan::default_swizzle(sms, t, g.tile_rows()));
    kernels::GemmParams p = kernels::plain_gemm(api::to_kernels(dtype), a, b, s, int32_t(k), out, ld);
    const int64_t v = g.tile_rows();
    p.grouped = {device_tables, device_tables + v, device_tables + 2 * v, a_rows, int64_t(e) * n};
    return p;
  }
  // The tables of g into the device's, on stream.
  void upload(const plan::GroupedTileRows& g, int32_t* device_tables, cudaStream_t stream) {
    const size_t v = size_t(g.tile_rows());
    auto* host = static_cast<int32_t*>(staging.take());
    std::copy(g.a_row0.begin(), g.a_row0.end(), host);
    std::copy(g.b_row0.begin(), g.b_row0.end(), host + v);
    std::copy(g.rows.begin(), g.rows.end(), host + 2 * v);
    FO_CUDA_CHECK(cudaMemcpyAsync(device_tables, host, 3 * v * 4, cudaMemcpyHostToDevice, stream));
    staging.queued(stream);
  }
  // Each expert's GEMM by cuBLAS; expert e's weight is b's (e % b_experts)-th (the calibration's fewer weights).
  void cublas_loop(const void* a, const void* b, const int64_t* counts, void* out, int64_t ld, int e_count,
                   cudaStream_t stream, int b_experts) {
    const auto* pa = static_cast<const char*>(a);
    const auto* pb = static_cast<const char*>(b);
    auto* pc = static_cast<char*>(out);
    int64_t row = 0;
    for (int e = 0; e < e_count; ++e) {
      if (counts[e] > 0)
        cublas->run(api::to_kernels(dtype), pa + row * k * 2, pb + int64_t(e % b_experts) * n * k * 2, pc + row * ld * 2,
                    int(counts[e]), int(n), int(k), ld, stream);
      row += counts[e];
    }
  }
  // Both entry points' refusals, worded alike: a capture (the call runs host work), ld_out, and operands.
  void refuse_capture(cudaStream_t stream, const std::string& why) const {
    if (capturing(stream)) throw InvalidArgument(who() + ": " + why);
  }
  int64_t ld_of(int64_t ld_out) const {
    if (ld_out != 0 && (ld_out < n || ld_out > INT32_MAX))
      throw InvalidArgument(who() + ": ld_out = " + std::to_string(ld_out) + " is below n (0 means n) or past 2^31 - 1");
    return ld_out == 0 ? n : ld_out;
  }
  void check_operands(const void* a, const void* b, const void* out) const {
    if (!a || !b || !out) throw InvalidArgument(who() + ": a, b and out must not be null with rows");
    if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16 != 0)
      throw InvalidArgument(who() + ": a and b must be 16-byte aligned");
  }
  // Queues work on stream after this op's last call, and records the call's end once anything is queued, also
  // where work throws: the next call on another stream then waits for what this one queued.
  template <class Work>
  void enqueue(cudaStream_t stream, Work&& work) {
    if (called && stream != last_stream) FO_CUDA_CHECK(cudaStreamWaitEvent(stream, done, 0));
    auto ended = [&] {
      FO_CUDA_CHECK(cudaEventRecord(done, stream));
      called = true, last_stream = stream;
    };
    try {
      work();
    } catch (...) {
      ended();
      throw;
    }
    ended();
  }
  void measure();
};


// The two GEMMs timed in turns at each sample of mean rows per expert, as a
// call runs them (ours with its tables' upload), every expert loaded, so that
// the waves are the calls' own: counts r + h and r - h in turns (h = half a
// tile row at most), ragged as drawn counts are, where exactly r each would
// fill whole tile rows and flatter the larger tiles' waves. The weights are the
// experts' where they fit kCalibrationWeightBytes, else expert e reads weight
// e % e_cal; a near tie then goes to ours (one launch against cuBLAS's one per
// expert, whose weights' reads the fewer weights flatter).
void GroupedGemm::Impl::measure() {
  const int e_cal = int(std::clamp<int64_t>(kCalibrationWeightBytes / (n * k * 2), 1, experts));
  const std::vector<int64_t> rows = plan::gemm_choice_samples(std::max<int64_t>(max_rows / experts, 1));
  const int64_t most = rows.back() * experts;
  const kernels::DType dt = api::to_kernels(dtype);
  rt::DeviceBuffer a(size_t(most) * k * 2), b(size_t(e_cal) * n * k * 2), c(size_t(most) * n * 2),
      cal_tables(size_t(3) * max_tile_rows * 4);
  const rt::ScopedStream st;
  kernels::fill_random(dt, a.get(), most * k, 1, -1.f, 1.f, st.s);
  kernels::fill_random(dt, b.get(), int64_t(e_cal) * n * k, 2, -1.f, 1.f, st.s);
  constexpr double kMargin = 0.04;  // what a near tie is
  const bool all_timed = e_cal == experts;
  for (int64_t r : rows) {
    const std::vector<int64_t> counts = plan::ragged_counts(experts, r);
    plan::GroupedTileRows g = plan::make_grouped_tile_rows(plan::expert_segments(counts), experts, n, 128);
    for (int32_t& b0 : g.b_row0) b0 = int32_t((b0 / n) % e_cal * n);
    std::vector<kernels::GemmParams> ps;
    for (size_t t = 0; t < api::op_tiles().size(); ++t)
      ps.push_back(ours(g, t, a.get(), b.get(), c.get(), n, cal_tables.as<int32_t>(), r * experts, e_cal));
    std::vector<std::function<void()>> fns = {
        [&] { cublas_loop(a.get(), b.get(), counts.data(), c.get(), n, experts, st.s, e_cal); }};
    for (const kernels::GemmParams& p : ps)
      fns.push_back([&, &p = p] {
        upload(g, cal_tables.as<int32_t>(), st.s);
        kernels::launch_gemm(p, st.s);
      });
    const std::vector<rt::TimingStats> t =
        rt::time_interleaved(fns, st.s, 2, r <= 256 ? 15 : 7, {}, &rt::thread_gate());
    Sample x;
    x.rows = r, x.cublas_ms = t[0].median_ms;
    x.tile = t[2].median_ms < t[1].median_ms ? 1 : 0;
    x.ours_ms = t[1 + x.tile].median_ms;
    x.cublas = all_timed ? !(x.ours_ms < (1 - kMargin) * x.cublas_ms) : x.cublas_ms < (1 - kMargin) * x.ours_ms;
    samples.push_back(x);
  }
  sample_rows = rows;
}

GroupedGemm::GroupedGemm(int64_t max_rows, int experts, int64_t n, int64_t k, DType dtype,
                         const GroupedGemmOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.max_rows = max_rows, d.experts = experts, d.n = n, d.k = k, d.dtype = dtype, d.opts = options;
  api::check_shape(d.who(), max_rows, n, k);
  if (experts < 1 || experts > 4096 || int64_t(experts) * n > INT32_MAX)
    throw InvalidArgument(d.who() + ": experts must be in [1, 4096], and experts x n below 2^31 (B's rows)");
  if (options.path != GroupedGemmOptions::Path::Auto && options.path != GroupedGemmOptions::Path::Ours &&
      options.path != GroupedGemmOptions::Path::Cublas)
    throw InvalidArgument(d.who() + ": unknown path");
  d.sms = rt::current_device_sms();
  kernels::preload_kernels();  // (the tables' kernel too: a lazy load at a call would synchronise the context)
  d.cublas = std::make_unique<rt::CublasGemm>(rt::CublasGemm::Api::GemmEx);
  // Each expert's rows in tile rows of their own: at most one ragged tile row per expert.
  d.max_tile_rows = int32_t(std::min<int64_t>((max_rows + 127) / 128 + experts, INT32_MAX / 3));
  d.tables = rt::DeviceBuffer(size_t(3) * d.max_tile_rows * 4);
  const size_t slot = size_t(3) * d.max_tile_rows * 4;
  d.staging = rt::StagingRing(slot, rt::StagingRing::slots_within(kStagingBytes, slot, kStagingSlots));
  FO_CUDA_CHECK(cudaEventCreateWithFlags(&d.done, cudaEventDisableTiming));
  d.bad = rt::PinnedBuffer(sizeof(int32_t));
  *d.bad.as<int32_t>() = 0;
  if (options.path == GroupedGemmOptions::Path::Auto) d.measure();
}

GroupedGemm::~GroupedGemm() = default;
GroupedGemm::GroupedGemm(GroupedGemm&&) noexcept = default;
GroupedGemm& GroupedGemm::operator=(GroupedGemm&&) noexcept = default;

void GroupedGemm::run(const void* a, const void* b, const int64_t* counts, void* out, cudaStream_t stream,
                      int64_t ld_out) {
  Impl& d = *impl_;
  d.refuse_capture(stream, "run cannot be captured into a CUDA graph (each call uploads its counts' tables)");
  if (!counts) throw InvalidArgument(d.who() + ": counts must not be null (" + std::to_string(d.experts) + " entries)");
  int64_t rows = 0;
  for (int e = 0; e < d.experts; ++e) {
    if (counts[e] < 0 || counts[e] > d.max_rows)
      throw InvalidArgument(d.who() + ": counts[" + std::to_string(e) + "] = " + std::to_string(counts[e]) +
                            " is outside [0, max_rows]");
    rows += counts[e];
  }
  if (rows > d.max_rows)
    throw InvalidArgument(d.who() + ": the counts sum to " + std::to_string(rows) + " rows, more than max_rows");
  const int64_t ld = d.ld_of(ld_out);
  if (rows == 0) {
    d.last = {Impl::Last::Empty};
    return;
  }
  d.check_operands(a, b, out);
  const int64_t mean = std::max<int64_t>(rows / d.experts, 1);
  using Path = GroupedGemmOptions::Path;
  const Impl::Sample* at = d.samples.empty() ? nullptr : &d.samples[plan::gemm_choice_sample_of(d.sample_rows, mean)];
  const bool use_cublas = d.opts.path == Path::Cublas || (d.opts.path == Path::Auto && at->cublas);
  d.enqueue(stream, [&] {
    if (use_cublas) {
      d.cublas_loop(a, b, counts, out, ld, d.experts, stream, d.experts);
      d.last = {Impl::Last::Cublas, mean, 0, 0, 0, at};
    } else {
      const std::vector<int64_t> c(counts, counts + d.experts);
      const plan::GroupedTileRows g = plan::make_grouped_tile_rows(plan::expert_segments(c), d.experts, d.n, 128);
      const size_t tile = at ? at->tile : d.n > 128 ? 0 : 1;
      const kernels::GemmParams p = d.ours(g, tile, a, b, out, ld, d.tables.as<int32_t>(), rows, d.experts);
      kernels::check_gemm_params(p);  // (before the upload: a refused call queues nothing)
      d.upload(g, d.tables.as<int32_t>(), stream);
      kernels::launch_gemm(p, stream);
      d.last = {Impl::Last::Ours, mean, g.tile_rows(), tile, p.sched.ctas, at};
    }
  });
}

void GroupedGemm::run_offsets(const void* a, const void* b, const int32_t* offsets, int64_t rows, void* out,
                              cudaStream_t stream, int64_t ld_out) {
  Impl& d = *impl_;
  d.refuse_capture(stream, "run_offsets cannot be captured into a CUDA graph yet");
  if (rows < 0 || rows > d.max_rows)
    throw InvalidArgument(d.who() + ": rows = " + std::to_string(rows) + " is outside [0, max_rows]");
  const int64_t ld = d.ld_of(ld_out);
  if (!offsets || reinterpret_cast<uintptr_t>(offsets) % 4 != 0)
    throw InvalidArgument(d.who() + ": offsets must be a 4-byte aligned int32 pointer in device memory");
  if (rows == 0) {
    d.last = {Impl::Last::Empty};
    return;
  }
  d.check_operands(a, b, out);
  // Tables for the most tile rows the experts' rows can take (the GEMM skips those left empty).
  plan::GroupedTileRows most;
  most.a_row0.assign(size_t(std::min<int64_t>((rows + 127) / 128 + d.experts, d.max_tile_rows)), 0);
  const size_t tile = [&] {
    if (d.samples.empty()) return size_t(d.n > 128 ? 0 : 1);
    return d.samples[plan::gemm_choice_sample_of(d.sample_rows, std::max<int64_t>(rows / d.experts, 1))].tile;
  }();
  int32_t* t = d.tables.as<int32_t>();
  const int32_t v = most.tile_rows();
  const kernels::GemmParams p = d.ours(most, tile, a, b, out, ld, t, rows, d.experts);
  kernels::check_gemm_params(p);
  d.enqueue(stream, [&] {
    kernels::build_grouped_tables(offsets, d.experts, rows, d.n, 128, v, t, t + v, t + 2 * int64_t(v),
                                  d.bad.as<int32_t>(), stream);
    kernels::launch_gemm(p, stream);
  });
  d.last = {Impl::Last::Offsets, 0, v, tile, p.sched.ctas, nullptr};
}

void GroupedGemm::check() const {
  int32_t* bad = impl_->bad.as<int32_t>();
  const int32_t e = *reinterpret_cast<volatile int32_t*>(bad);
  if (e == 0) return;
  *bad = 0;
  throw InvalidArgument(impl_->who() + ": an earlier run_offsets call's offsets[" + std::to_string(e - 1) +
                        "] decreased or passed its rows: that expert's rows and every later one's were left out");
}

std::string GroupedGemm::last_plan() const {
  const Impl::Last& l = impl_->last;
  std::ostringstream os;
  os.precision(3);
  os << std::fixed;
  switch (l.kind) {
    case Impl::Last::None: return "no call yet";
    case Impl::Last::Empty: return "nothing to compute (0 rows)";
    case Impl::Last::Cublas: os << "cuBLAS's GEMM per expert"; break;
    case Impl::Last::Ours:
    case Impl::Last::Offsets:
      os << (l.kind == Impl::Last::Ours ? "ours: " : "ours, offsets on the GPU: up to ") << l.tile_rows
         << " tile rows of 128x" << api::op_tiles()[l.tile].bn << " on " << l.ctas << " CTAs";
      break;
  }
  if (l.at)
    os << " (mean " << l.mean << " rows per expert: ours " << l.at->ours_ms << " ms against cuBLAS's "
       << l.at->cublas_ms << " ms at " << l.at->rows << ")";
  return os.str();
}
int64_t GroupedGemm::max_rows() const { return impl_->max_rows; }
int GroupedGemm::experts() const { return impl_->experts; }
int64_t GroupedGemm::n() const { return impl_->n; }
int64_t GroupedGemm::k() const { return impl_->k; }
DType GroupedGemm::dtype() const { return impl_->dtype; }

}  // namespace flashoverlap
