// gemm_reducescatter.cpp — flashoverlap::GemmReduceScatter (flashoverlap.h):
// one op for any m <= max_m, built as GemmAllReduce is (gemm_allreduce.cpp):
// the communicator bounded to the SMs left to NCCL, the scratch for max_m,
// the GEMM's time per wave (max over ranks). A new m is planned from rank
// 0's tuning cache by its tile rows (Auto), else from the model
// (plan::make_plan: the built-in ReduceScatter curve scaled to the world,
// the measured wave times), and its op made, sharing the core.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>

#include "api/communicator_impl.h"
#include "api/reducescatter_planner.h"
#include "api/op_cache.h"
#include "api/op_setup.h"
#include "kernels/reorder.h"
#include "plan/planner.h"
#include "runtime/core/checks.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/exchange.h"
#include "runtime/ops/reducescatter.h"
#include "runtime/transport/peer_windows.h"
#include "runtime/tune/picks.h"
#include "runtime/transport/peers.h"

namespace flashoverlap {
namespace {

using api::to_kernels;

}  // namespace

struct GemmReduceScatter::Impl {
  std::shared_ptr<Communicator::Impl> comm;
  rt::Communicator bounded;  // NCCL on nccl_sms CTAs beside the GEMM
  std::unique_ptr<rt::CallWatch> watch;  // (after the communicators it may revoke: gone before them)
  int64_t max_m = 0, n = 0, k = 0;
  DType dtype = DType::BF16;
  GemmReduceScatterOptions opts;
  int rank = 0, world = 1, sms = 0;
  bool check_m = false;
  // What each m is planned from (wave times and sequential GEMMs measured,
  // rank 0's picks): the model, without a GPU.
  api::ReduceScatterPlanner planner;
  // The sequential calls' cuBLAS GEMM, one object for every m's op.
  std::unique_ptr<rt::CublasGemm> cublas;
  rt::OverlapCore core;              // (before the ops)
  using Planned = api::ReduceScatterPlanner::Planned;
  std::map<int64_t, Planned> plans;  // by m (the standard layout's parts depend on m itself)
  rt::PeerWindows windows;  // the NVLink form: every rank's, shared by the ops of every m (before them)
  api::OpCache<rt::OverlapReduceScatter> ops;  // by m (at most api::kOpsKept not captured)
  rt::OverlapReduceScatter* last = nullptr;
  // all_gather_rows of the sub-tile layout: per m, where each gathered row
  // goes (-1: padding), and the padded send and receive rows.
  std::map<int64_t, rt::DeviceBuffer> gather_rows_of;
  rt::DeviceBuffer gather_send, gather_recv, zeros;

  std::string who() const {
    return "GemmReduceScatter (rank " + std::to_string(rank) + " of " + std::to_string(world) + ", max_m " +
           std::to_string(max_m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")";
  }
  plan::RsLayout layout() const { return planner.layout(); }
  void check_m_value(int64_t m) const {
    if (m < 1 || m > max_m) throw InvalidArgument(who() + ": m must be in [1, max_m], not " + std::to_string(m));
    if (layout() == plan::RsLayout::Standard && m % world != 0)
      throw InvalidArgument(who() + ": m = " + std::to_string(m) + " is not a multiple of the world size " +
                            std::to_string(world) + " (the standard layout gives every rank m / world rows)");
  }
  rt::OverlapReduceScatter& op_for(int64_t m, cudaStream_t stream = nullptr, bool calling = false) {
    check_m_value(m);
    if (rt::OverlapReduceScatter* op = ops.find(m)) return *op;
    if (calling) api::refuse_planning_under_capture(stream, m, who());
    auto pit = plans.find(m);
    if (pit == plans.end()) pit = plans.emplace(m, planner.plan_for(m)).first;
    const plan::Plan& p = pit->second.plan;
    rt::OverlapReduceScatterOptions o;
    o.sched = p.schedule;
    o.groups = p.groups, o.layout = p.rs_layout, o.k = int(k), o.dtype = to_kernels(dtype);
    o.fp8 = api::fp8_of(opts.input, opts.scales);
    o.comm = p.sequential ? comm->comm.get() : bounded.get();
    if (pit->second.nvlink) o.nvlink = true, o.peers = &windows;
    o.fallback_cublas = pit->second.cublas, o.cublas = cublas.get();
    o.tail_comm = comm->comm.get();  // the last group, after the GEMM: NCCL's default CTAs
    o.wait_timeout_s = opts.wait_timeout_s;
    o.core = &core;
    return ops.add(m, std::make_unique<rt::OverlapReduceScatter>(o), [this](int64_t gone_m, rt::OverlapReduceScatter& gone) {
      forget(gone);
      plans.erase(gone_m);
    });
  }
  void check_earlier_calls() const {
    if (last && core.wait_error()->failed) last->check();  // (a timed-out wait's message first: it names the group)
    watch->check();
  }
  // An op about to go (ops' least recently used): if it ran the last call,
  // that call is waited for and its errors thrown now (then the op stays).
  void forget(const rt::OverlapReduceScatter& gone) {
    if (&gone != last) return;
    core.wait_last_call();
    check_earlier_calls();
    last = nullptr;
  }
  // The rows of C rank r's output holds for m, in order (they depend on m,
  // the tile height and the world only).
  std::vector<int32_t> rows_of(int64_t m, int r) const {
    plan::Schedule s;
    s.m = int32_t(m), s.n = int32_t(n), s.bm = api::kBm, s.bn = 256;
    return plan::rs_rows_of_rank(s, world, r, layout());
  }
  // all_gather_rows of the sub-tile layout for m: the padded buffers and the
  // rows' places, made once per m (allocates: prepare(m) makes them too).
  std::map<int64_t, rt::DeviceBuffer>::iterator prepare_gather(int64_t m) {
    if (auto it = gather_rows_of.find(m); it != gather_rows_of.end()) return it;
    if (n % 8 != 0) throw InvalidArgument(who() + "::all_gather_rows: the sub-tile layout's row exchange needs n % 8 == 0");
    const int64_t h = api::kBm / world, most = api::bucket_of(m) * h;
    const size_t part = size_t(most) * size_t(n) * 2;
    auto grow = [](rt::DeviceBuffer& b, size_t bytes) {
      if (b.bytes() < bytes) b = rt::DeviceBuffer(bytes);
    };
    grow(gather_send, part), grow(gather_recv, part * size_t(world));
    std::vector<int32_t> dst(size_t(most) * size_t(world), -1);
    for (int r = 0; r < world; ++r) {
      const std::vector<int32_t> rows = rows_of(m, r);
      std::copy(rows.begin(), rows.end(), dst.begin() + ptrdiff_t(r) * most);
    }
    if (zeros.bytes() < dst.size() * 4) {
      zeros = rt::DeviceBuffer(dst.size() * 4);
      FO_CUDA_CHECK(cudaMemset(zeros.get(), 0, zeros.bytes()));
    }
    return gather_rows_of.emplace(m, rt::to_device(dst)).first;
  }
};

GemmReduceScatter::GemmReduceScatter(const Communicator& comm, int64_t max_m, int64_t n, int64_t k, DType dtype,
                                     const GemmReduceScatterOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  if (!comm.impl_) throw InvalidArgument("GemmReduceScatter: no communicator");
  d.comm = comm.impl_;
  d.max_m = max_m, d.n = n, d.k = k, d.dtype = dtype, d.opts = options;
  d.rank = comm.rank(), d.world = comm.world();
  api::check_shape(d.who(), max_m, n, k);
  if (options.layout == GemmReduceScatterOptions::Layout::SubTile && api::kBm % d.world != 0)
    throw InvalidArgument(d.who() + ": the sub-tile layout needs the world size to divide 128, not " +
                          std::to_string(d.world));
  if (options.layout == GemmReduceScatterOptions::Layout::Standard && max_m < d.world)
    throw InvalidArgument(d.who() + ": max_m must be at least the world size (every rank gets m / world rows)");
  d.sms = rt::current_device_sms();
  api::check_op_options(d.who(), d.sms, options.nccl_sms, options.wait_timeout_s);
  api::check_input_options(d.who(), options.input, options.scales, k);
  d.check_m = api::check_m_enabled(options.check_m);
  d.planner.n = n, d.planner.k = k, d.planner.world = d.world, d.planner.sms = d.sms, d.planner.dtype = dtype;
  d.planner.opts = options;
  // Every rank plans every m alike and builds the same windows: from the same SMs and options.
  struct Agreed {
    int32_t sms, nccl_sms, path, layout;
    bool operator==(const Agreed&) const = default;
  };
  const Agreed here{d.sms, options.nccl_sms, int32_t(options.path), int32_t(options.layout)};
  for (const Agreed& x : rt::gather_from_all(comm.get(), d.rank, here, d.who() + ": the ranks' options"))
    if (!(x == here))
      throw InvalidArgument(d.who() + ": the ranks differ in SMs (" + std::to_string(x.sms) + " against " +
                            std::to_string(here.sms) + "), nccl_sms, path or layout: every rank needs the same");
  // The tuning cache's picks for this machine and shape (Auto): rank 0's.
  if (options.path == GemmReduceScatterOptions::Path::Auto) {
    rt::PickKey shape;
    shape.gpu = api::current_gpu_name();
    shape.sms = d.sms, shape.world = d.world, shape.dtype = to_kernels(dtype), shape.tile_rows = 1, shape.n = n,
    shape.k = k, shape.op = rt::reducescatter_op(d.layout());
    d.planner.picks = rt::PickCache::parse_reducescatter_entries(
        api::rank0_tuning_entries(comm.get(), d.rank, options.tuning_cache, shape, d.who()), shape);
    if (options.input == InputType::E4M3) d.planner.picks.clear();  // (the cache's picks are for 16-bit inputs)
  }
  const bool nvlink_picked = std::any_of(d.planner.picks.begin(), d.planner.picks.end(), [](const auto& e) {
    return e.second.path == rt::ReduceScatterPick::Path::NVLink;
  });
  const bool forced = options.path == GemmReduceScatterOptions::Path::NVLink;
  if (forced || nvlink_picked) {  // (the same verdict on every rank: the same options and picks)
    const bool fits = options.layout == GemmReduceScatterOptions::Layout::Standard && n % 8 == 0 && d.world <= 8;
    if (forced && !fits)
      throw InvalidArgument(d.who() + ": Path::NVLink needs the standard layout, n % 8 == 0 and at most 8 ranks");
    const int32_t mine = d.world == 1 || rt::all_ranks_reachable(comm.get()) ? 1 : 0;
    bool reach = true;
    for (int32_t x : rt::gather_from_all(comm.get(), d.rank, mine, d.who() + ": the ranks' NVLink reach")) reach &= x != 0;
    if (forced && !reach)
      throw InvalidArgument(d.who() + ": Path::NVLink needs every rank's GPU within load/store reach of every "
                                      "other's (NVLink, one host); some rank's is not (use Auto or Slots)");
    if (fits && reach) d.windows = rt::PeerWindows(d.rank, d.world, size_t(max_m) * size_t(n) * 2, comm.get(), d.who());
  }
  d.planner.nvlink_ready = d.windows.connected();
  d.bounded = comm.impl_->comm.split({0, options.nccl_sms, 1, -1});  // (docs/design.md §5.5)
  d.watch = api::make_call_watch(d.who(), options.wait_timeout_s,
                                 {d.bounded.get(), comm.impl_->comm.owned() ? comm.get() : nullptr});
  d.planner.wave_ms = api::gemm_wave_ms(comm.get(), d.rank, max_m, n, k, dtype, d.sms, d.who(), options.input);
  d.cublas = std::make_unique<rt::CublasGemm>();
  d.planner.seq = api::measure_sequential_gemms(comm.get(), d.rank, max_m, n, k, dtype, d.sms, *d.cublas, d.who(),
                                                options.input, options.scales);
  // Scratch for the largest m: the send slots (whole tiles, with the
  // standard layout's padding: at most one tile row per destination and
  // group beyond C; bounded here by twice C's tiles) and the received rows.
  size_t send = 0;
  for (plan::TileShape t : api::op_tiles(options.input))
    send = std::max(send, 2 * size_t(api::bucket_of(max_m) + d.world) * t.bm * size_t((n + t.bn - 1) / t.bn) * t.bn * 2);
  d.core.reserve(0, send);
}

GemmReduceScatter::~GemmReduceScatter() = default;
GemmReduceScatter::GemmReduceScatter(GemmReduceScatter&&) noexcept = default;
GemmReduceScatter& GemmReduceScatter::operator=(GemmReduceScatter&&) noexcept = default;

void GemmReduceScatter::run(const void* a, const void* b, void* out, int64_t m, cudaStream_t stream, int64_t ld_out,
                            const InputScales& scales) {
  Impl& d = *impl_;
  api::check_run_args(d.who(), a, b, out, ld_out, d.n);
  api::check_input_scales(d.who(), d.opts.input, d.opts.scales, scales);
  d.check_earlier_calls();
  rt::OverlapReduceScatter& op = d.op_for(m, stream, true);
  const rt::CallWatch::Scope watched(*d.watch, stream);
  if (d.check_m) api::check_same_m(d.comm->comm.get(), d.rank, m, stream, d.who());
  op.set_input_scales(scales.a, scales.b);
  op.run(a, b, out, ld_out == 0 ? d.n : ld_out, stream);
  d.last = &op;
}

void GemmReduceScatter::run_rmsnorm(const void* a, const void* b, const void* residual, const void* norm_weight,
                                    float eps, void* out, void* residual_out, int64_t m, cudaStream_t stream,
                                    const InputScales& scales) {
  Impl& d = *impl_;
  api::check_rmsnorm_args(d.who(), a, b, residual, norm_weight, out, eps);
  api::check_input_scales(d.who(), d.opts.input, d.opts.scales, scales);
  d.check_earlier_calls();
  rt::OverlapReduceScatter& op = d.op_for(m, stream, true);
  const rt::CallWatch::Scope watched(*d.watch, stream);
  if (d.check_m) api::check_same_m(d.comm->comm.get(), d.rank, m, stream, d.who());
  op.set_input_scales(scales.a, scales.b);
  op.run_rmsnorm(a, b, rt::RmsNormArgs{residual, norm_weight, eps, residual_out}, out, stream);
  d.last = &op;
}

int64_t GemmReduceScatter::rows_out(int64_t m) const {
  const Impl& d = *impl_;
  d.check_m_value(m);
  if (d.layout() == plan::RsLayout::Standard) return m / d.world;
  return int64_t(rows(m).size());
}

std::vector<int64_t> GemmReduceScatter::rows(int64_t m) const {
  const Impl& d = *impl_;
  d.check_m_value(m);
  const std::vector<int32_t> r = d.rows_of(m, d.rank);
  return std::vector<int64_t>(r.begin(), r.end());
}

void GemmReduceScatter::all_gather_rows(const void* local, void* full, int64_t m, cudaStream_t stream) {
  Impl& d = *impl_;
  if (!local || !full) throw InvalidArgument(d.who() + "::all_gather_rows: local and full must not be null");
  d.check_m_value(m);
  d.check_earlier_calls();
  const ncclDataType_t type = d.dtype == DType::BF16 ? ncclBfloat16 : ncclFloat16;
  const ncclComm_t c = d.comm->comm.get();
  const std::string ctx = d.who() + "::all_gather_rows (m " + std::to_string(m) + ")";
  const rt::CallWatch::Scope watched(*d.watch, stream);
  if (d.layout() == plan::RsLayout::Standard) {
    FO_NCCL_CHECK_CTX(ncclAllGather(local, full, size_t(m / d.world) * d.n, type, c, stream), ctx);
    return;
  }
  if (capturing(stream) && !d.gather_rows_of.count(m))
    throw InvalidArgument(ctx + ": the row exchange of this m is not set up yet, and setting it up allocates, which a "
                          "CUDA graph capture forbids: call prepare(m) before capturing");
  const auto it = d.prepare_gather(m);
  const int64_t h = api::kBm / d.world, most = api::bucket_of(m) * h, mine = rows_out(m);
  FO_CUDA_CHECK(cudaMemcpyAsync(d.gather_send.get(), local, size_t(mine) * d.n * 2, cudaMemcpyDeviceToDevice, stream));
  FO_NCCL_CHECK_CTX(ncclAllGather(d.gather_send.get(), d.gather_recv.get(), size_t(most) * d.n, type, c, stream), ctx);
  kernels::scatter_slot_rows(to_kernels(d.dtype), d.gather_recv.get(), most * d.world, int32_t(d.n),
                             it->second.as<int32_t>(), d.zeros.as<int32_t>(), full, d.n, int32_t(d.n), stream);
}

void GemmReduceScatter::prepare(int64_t m) {
  Impl& d = *impl_;
  (void)d.op_for(m);
  d.ops.pin(m);  // (kept from now on: a graph will capture it)
  if (d.layout() == plan::RsLayout::SubTile && d.n % 8 == 0) (void)d.prepare_gather(m);  // (all_gather_rows' too)
}

std::string GemmReduceScatter::plan(int64_t m) {
  Impl& d = *impl_;
  (void)d.op_for(m);  // (planned, its op made)
  return d.planner.describe(m, d.plans.at(m), d.rank);
}

void GemmReduceScatter::check() const {
  if (impl_->last) impl_->last->check();
  impl_->watch->check();
}

int64_t GemmReduceScatter::max_m() const { return impl_->max_m; }
int64_t GemmReduceScatter::n() const { return impl_->n; }
int64_t GemmReduceScatter::k() const { return impl_->k; }
DType GemmReduceScatter::dtype() const { return impl_->dtype; }
int GemmReduceScatter::world() const { return impl_->world; }

}  // namespace flashoverlap
