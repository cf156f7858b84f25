// tuner.cpp — see tuner.h.
#include "runtime/tune/tuner.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <numeric>
#include <map>
#include <optional>
#include <tuple>

#include "kernels/reorder.h"
#include "plan/partition.h"
#include "plan/search.h"
#include "plan/tile_grid.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/gemm_monitor.h"

namespace flashoverlap::rt {

std::vector<double> max_over_ranks(Rendezvous& rv, const std::vector<double>& mine) {
  const auto all = rv.allgather(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(mine.data()),
                                                         mine.size() * sizeof(double)));
  std::vector<double> out = mine;
  for (const auto& bytes : all) {
    if (bytes.size() != mine.size() * sizeof(double)) throw Error("max_over_ranks: ranks sent different sizes");
    for (size_t i = 0; i < mine.size(); ++i) {
      double v;
      std::memcpy(&v, bytes.data() + i * sizeof(double), sizeof(double));
      out[i] = std::max(out[i], v);
    }
  }
  return out;
}

TimingStats time_collective(const std::function<void()>& enqueue, cudaStream_t stream, ncclComm_t sync_comm,
                            int warmup, int iters, bool gate) {
  return time_collective_interleaved({enqueue}, stream, sync_comm, warmup, iters, gate).front();
}

std::vector<TimingStats> time_collective_interleaved(const std::vector<std::function<void()>>& fns,
                                                     cudaStream_t stream, ncclComm_t sync_comm, int warmup, int iters,
                                                     bool gate) {
  // (one token per device: a thread may time communicators of several GPUs)
  static thread_local std::map<int, DeviceBuffer> tokens;
  int device = 0;
  FO_CUDA_CHECK(cudaGetDevice(&device));
  auto it = tokens.find(device);
  if (it == tokens.end()) it = tokens.emplace(device, DeviceBuffer(256)).first;
  void* token = it->second.get();
  auto sync = [&] {
    FO_NCCL_CHECK_CTX(ncclAllReduce(token, token, 1, ncclFloat, ncclSum, sync_comm, stream), "timing sync");
  };
  return time_interleaved(fns, stream, warmup, iters, sync, gate ? &thread_gate() : nullptr);
}

namespace {

// Latency of `call(count)` (max over ranks, median of `iters`) at log-spaced
// sizes from 64 KiB to `max_bytes` per rank (count = bytes / 2 elements).
plan::BandwidthCurve sample_curve(Rendezvous& rv, plan::Collective op, ncclComm_t comm, cudaStream_t stream,
                                  double max_bytes, int iters, const std::string& gpu,
                                  const std::function<void(size_t count)>& call) {
  std::vector<double> sizes, ms;
  for (double b = 65536; b <= max_bytes; b *= 2) {
    sizes.push_back(b);
    ms.push_back(time_collective([&] { call(size_t(b / 2)); }, stream, comm, 2, iters).median_ms);
  }
  ms = max_over_ranks(rv, ms);
  std::vector<plan::CurveSample> samples;
  for (size_t i = 0; i < sizes.size(); ++i) samples.push_back({sizes[i], ms[i]});
  return plan::BandwidthCurve(op, rv.world(), samples, gpu);
}

}  // namespace

plan::BandwidthCurve measure_allreduce_curve(Rendezvous& rv, ncclComm_t comm, kernels::DType dt, cudaStream_t stream,
                                             double max_bytes, int iters, const std::string& gpu) {
  DeviceBuffer buf{static_cast<size_t>(max_bytes)};
  FO_CUDA_CHECK(cudaMemset(buf.get(), 0, buf.bytes()));
  return sample_curve(rv, plan::Collective::AllReduce, comm, stream, max_bytes, iters, gpu, [&](size_t count) {
    FO_NCCL_CHECK_CTX(ncclAllReduce(buf.get(), buf.get(), count, nccl_type(dt), ncclSum, comm, stream),
                      "curve sample");
  });
}

double measure_gemm_ms(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b, void* c,
                       cudaStream_t stream, int iters) {
  kernels::GemmParams p = kernels::plain_gemm(dt, a, b, sched, k, c, sched.n);
  // The model's GEMM per wave: 3 stages, as the slot layout runs it (its
  // slowdown factors were fitted to 3 stages; row bands and owners may run
  // 4 stages, a little faster than this: stage_finalists); the measured
  // choice decides.
  p.four_stages = false;
  return time_on_stream([&] { kernels::launch_gemm(p, stream); }, stream, 2, iters).median_ms;
}

TileClocks measure_gemm_clocks(const plan::Schedule& sched, int k, kernels::DType dt, const void* a, const void* b,
                               void* c, cudaStream_t stream, int warmup, GemmPhases* phases, bool four_stages) {
  kernels::GemmParams p = kernels::plain_gemm(dt, a, b, sched, k, c, sched.n);
  p.four_stages = four_stages;  // the reference of a trace: the overlapped GEMM's pipeline
  for (int i = 0; i < warmup; ++i) kernels::launch_gemm(p, stream);
  const GemmMonitor monitor(sched, stream);
  monitor.attach(p, phases != nullptr);
  kernels::launch_gemm(p, stream);
  const GemmMonitor::Reading r = monitor.read(stream);
  if (phases) *phases = r.phases;
  return r.clocks;
}

}  // namespace flashoverlap::rt

// ---------------------------------------------------------------------------
namespace flashoverlap::rt {
namespace {

struct Candidate {
  AllReducePlan plan;
  double gemm_ms = 0;
};

}  // namespace

std::string describe(const AllReducePlan& p) {
  std::string out = std::to_string(p.sched.bm) + "x" + std::to_string(p.sched.bn) + ", " +
                    std::to_string(p.sched.ctas) + " CTAs, swizzle " + std::to_string(p.sched.swizzle) + ", ";
  if (p.sequential) return out + (p.fallback_cublas ? "sequential (cuBLAS)" : "sequential (ours)");
  out += layout_name(p.layout);
  if (p.layout == ArLayout::Owners)
    out += p.copy_in_gemm ? " (summed in the epilogues; copies in the GEMM)"
                          : " (summed in the epilogues; copies at the GEMM's end)";
  else
    out += ", NCCL " + std::to_string(p.reserve) + " CTAs";
  if (!p.four_stages && plan_has_stage_choice(p)) out += ", 3 stages";
  return out + ", " + std::to_string(p.groups.size()) + " groups";
}

std::vector<int> whole_wave_reserves(int64_t tiles, int sms, int max_count) {
  std::vector<int> all;
  for (int64_t w = (tiles + sms - 1) / sms; w <= tiles; ++w) {
    const int64_t res = sms - (tiles + w - 1) / w;
    if (res > 40) break;
    if (res >= 2 && (all.empty() || all.back() != res)) all.push_back(int(res));
  }
  if (all.empty()) return {8, 16};
  if (int(all.size()) <= max_count) return all;
  std::vector<int> r;  // spread over the range: communication-heavy shapes want more
  for (int i = 0; i < max_count; ++i) r.push_back(all[size_t(i) * (all.size() - 1) / (max_count - 1)]);
  return r;
}

std::vector<AllReducePlan> finalists_of(const std::vector<AllReducePlan>& ranked) {
  std::vector<AllReducePlan> out;
  // (a plan of one group is the sequential one's work: never a finalist)
  auto overlaps = [](const AllReducePlan& pl) { return !pl.sequential && pl.groups.size() >= 2; };
  for (ArLayout l : {ArLayout::RowBands, ArLayout::Slots})
    for (const auto& pl : ranked)
      if (overlaps(pl) && pl.layout == l) {
        out.push_back(pl);
        break;
      }
  std::vector<std::pair<int, int>> seen;  // owners: (bn, swizzle)
  for (const auto& pl : ranked) {
    const std::pair<int, int> key{pl.sched.bn, pl.sched.swizzle};
    if (overlaps(pl) && pl.layout == ArLayout::Owners && std::find(seen.begin(), seen.end(), key) == seen.end()) {
      seen.push_back(key);
      for (bool copy : {true, false}) {
        out.push_back(pl);
        out.back().copy_in_gemm = copy;
      }
    }
  }
  for (const auto& pl : ranked)
    if (pl.sequential) out.push_back(pl);
  return out;
}

bool plan_has_stage_choice(const AllReducePlan& p) {
  // (one group: the op runs the sequential GEMM, on 4 stages where it can)
  if (p.sched.bn != 256 || p.sched.n % 8 != 0 || p.sequential || p.groups.size() < 2) return false;
  return p.layout == ArLayout::RowBands;
}

std::vector<AllReducePlan> stage_finalists(const AllReducePlan& best) {
  std::vector<AllReducePlan> out{best};
  if (!plan_has_stage_choice(best)) return out;
  out.push_back(best);
  out.back().four_stages = !best.four_stages;
  return out;
}

std::vector<size_t> runoff_candidates(const std::vector<double>& ms, double within, size_t most) {
  std::vector<size_t> idx(ms.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return ms[x] < ms[y]; });
  std::vector<size_t> out;
  for (size_t i : idx)
    if (out.size() < most && ms[i] <= ms[idx.front()] * (1 + within)) out.push_back(i);
  return out;
}

namespace {

// Median ms of each fns (timed in turns, iters runs), max over ranks; throws
// on every rank if an op's wait failed on any.
std::vector<double> time_ops(const AllReduceTuning& t, const std::vector<std::function<void()>>& fns,
                             const std::vector<OverlapAllReduce*>& ops, int iters) {
  std::vector<double> ms;
  for (const auto& st : time_collective_interleaved(fns, t.stream, t.sync_comm, 3, iters, t.host_gate))
    ms.push_back(st.median_ms);
  FO_CUDA_CHECK(cudaStreamSynchronize(t.stream));
  std::string failure;  // every rank throws if any failed (none may be left waiting in max_over_ranks)
  for (auto* op : ops) try {
      op->check();
    } catch (const Error& e) {
      if (failure.empty()) failure = e.what();
    }
  ms.push_back(failure.empty() ? 0.0 : 1.0);
  ms = max_over_ranks(*t.rv, ms);
  if (ms.back() != 0.0)
    throw Error("choosing the plan by measurement failed: " + (failure.empty() ? "on another rank" : failure));
  ms.pop_back();
  return ms;
}

// The fastest of `finalists`, measured (see AllReduceTuning::options_for).
AllReducePlan measure_finalists(const AllReduceTuning& t, const std::vector<AllReducePlan>& finalists, int64_t n,
                                const void* a, const void* b, void* out) {
  if (!t.sync_comm) throw InvalidArgument("tune_allreduce: choosing by measurement needs sync_comm");
  std::vector<std::unique_ptr<OverlapAllReduce>> ops;
  std::vector<std::function<void()>> fns;
  for (const auto& pl : finalists) {
    OverlapAllReduceOptions o = t.options_for(pl);
    o.four_stages = o.four_stages && pl.four_stages;  // (the stage round's twins differ only here)
    ops.push_back(std::make_unique<OverlapAllReduce>(o));
    OverlapAllReduce* op = ops.back().get();
    if (t.registered_output) {  // (collective: every rank registers in the same order)
      const int slot = op->register_output(out, n);
      fns.push_back([&, op, slot] { op->run_registered(a, b, slot, t.stream); });
    } else {
      fns.push_back([&, op] { op->run(a, b, out, n, t.stream); });
    }
  }
  std::vector<OverlapAllReduce*> all;
  for (auto& op : ops) all.push_back(op.get());
  const std::vector<double> ms = time_ops(t, fns, all, t.select_iters);
  size_t pick = size_t(std::min_element(ms.begin(), ms.end()) - ms.begin());
  // Close ones again, longer (the same on every rank: ms is the max over ranks).
  const std::vector<size_t> close = runoff_candidates(ms, t.runoff_within, 3);
  std::vector<double> again;
  if (close.size() >= 2 && t.runoff_iters > 0) {
    std::vector<std::function<void()>> f2;
    std::vector<OverlapAllReduce*> o2;
    for (size_t i : close) f2.push_back(fns[i]), o2.push_back(all[i]);
    again = time_ops(t, f2, o2, t.runoff_iters);
    pick = close[size_t(std::min_element(again.begin(), again.end()) - again.begin())];
  }
  if (t.selection) {
    std::ostringstream sel;
    sel << std::fixed << std::setprecision(3);
    for (size_t i = 0; i < finalists.size(); ++i)
      sel << (i ? "; " : "") << (i == pick ? "* " : "") << describe(finalists[i]) << ": " << ms[i]
          << " ms (predicted " << finalists[i].predicted_ms << ")";
    if (!again.empty()) {
      sel << "; runoff (" << t.runoff_iters << " runs):";
      for (size_t j = 0; j < close.size(); ++j) sel << (j ? "," : "") << " #" << close[j] + 1 << " " << again[j] << " ms";
    }
    *t.selection = sel.str();
  }
  return finalists[pick];
}

}  // namespace

AllReducePlan tune_allreduce(const AllReduceTuning& t, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                             void* scratch, double sequential_ms) {
  // (world decides the layouts' sums and whether owners are tried: 2 ranks, or where asked for)
  if (t.rv && t.rv->world() != t.world)
    throw InvalidArgument("tune_allreduce: AllReduceTuning::world is " + std::to_string(t.world) + ", the ranks are " +
                          std::to_string(t.rv->world()));
  if (t.options_for && t.group_sizes.empty()) {  // rank by the model, then measure the finalists
    std::vector<AllReducePlan> local;
    AllReduceTuning rank_only = t;
    rank_only.options_for = nullptr;
    if (!rank_only.ranked) rank_only.ranked = &local;
    tune_allreduce(rank_only, m, n, k, a, b, scratch, sequential_ms);
    const std::vector<AllReducePlan> first_round = finalists_of(*rank_only.ranked);
    const AllReducePlan best = measure_finalists(t, first_round, n, a, b, scratch);  // (the same on every rank)
    const std::vector<AllReducePlan> second = stage_finalists(best);  // (row bands: the GEMM's stages)
    if (second.size() == 1 || !t.stage_round) return best;
    const std::string first = t.selection ? *t.selection : "";
    const AllReducePlan pick = measure_finalists(t, second, n, a, b, scratch);
    if (t.selection) *t.selection = first + "; then the stages: " + *t.selection;
    return pick;
  }
  // 1. Candidate schedules and their measured GEMM times (max over ranks).
  std::vector<Candidate> cands;
  std::map<std::tuple<int, int, int, int>, double> gemm_ms_of;  // (bm, bn, ctas, swizzle)
  for (plan::TileShape tile : t.tiles) {
    const int64_t tiles = ((m + tile.bm - 1) / tile.bm) * ((n + tile.bn - 1) / tile.bn);
    const int32_t tiles_m = int32_t((m + tile.bm - 1) / tile.bm);
    for (ArLayout layout : t.layouts) {
      const bool owners = layout == ArLayout::Owners;
      if (owners && (!t.push_reachable || t.world < 2 || t.world > 8 || n % 8 != 0 || (t.world != 2 && tile.bn != 256)))
        continue;  // more than 2 ranks: 128x256 tiles (4 stages)
      const std::vector<int> reserves = owners            ? std::vector<int>{0}  // no waiter, no NCCL
                                        : t.reserve >= 0 ? std::vector<int>{t.reserve}
                                                         : whole_wave_reserves(tiles, t.sms);
      for (int r : reserves) {
        std::vector<int> swizzles;
        if (!is_banded(layout)) swizzles = {plan::default_swizzle(t.sms - r, tile, tiles_m)};
        else
          for (int s : t.band_swizzles)
            if (s <= tiles_m) swizzles.push_back(s);
        for (int sw : swizzles) {
          Candidate c;
          c.plan.layout = layout;
          c.plan.reserve = r;
          c.plan.sched = plan::make_schedule(m, n, tile, t.sms - r, plan::Raster::AlongN, sw);
          const auto key = std::make_tuple(tile.bm, tile.bn, t.sms - r, sw);
          auto it = gemm_ms_of.find(key);
          if (it == gemm_ms_of.end())
            it = gemm_ms_of
                     .emplace(key, t.gemm_ms ? t.gemm_ms(c.plan.sched)
                                             : measure_gemm_ms(c.plan.sched, int(k), t.dtype, a, b, scratch, t.stream, 10))
                     .first;
          c.gemm_ms = it->second;
          cands.push_back(c);
        }
      }
    }
  }
  if (!t.gemm_ms) {  // measured: each rank's times, the slowest rank's count
    std::vector<double> ms;
    for (auto& c : cands) ms.push_back(c.gemm_ms);
    ms = max_over_ranks(*t.rv, ms);
    for (size_t i = 0; i < cands.size(); ++i) cands[i].gemm_ms = ms[i];
  }

  // The Slots layout pays a post-reorder pass over C (plain output).
  double reorder_ms = 0;
  if (t.gemm_ms) {
    reorder_ms = double(m) * double(n) * 2 * 2 / (t.reorder_gb_s * 1e6);
  } else if (std::find(t.layouts.begin(), t.layouts.end(), ArLayout::Slots) != t.layouts.end() && !cands.empty()) {
    const plan::Schedule s = cands.front().plan.sched;
    DeviceBuffer slots(size_t(s.tiles()) * s.bm * s.bn * 2);
    reorder_ms = time_on_stream([&] { kernels::reorder_tiles_to_rows(t.dtype, slots.get(), s, scratch, n, t.stream); },
                                t.stream, 2, 10)
                     .median_ms;
    reorder_ms = max_over_ranks(*t.rv, {reorder_ms})[0];
  }

  // 2. Predict each candidate with the best (or the given) groups.
  std::optional<AllReducePlan> best;
  bool one_group = false;  // a candidate whose best (or given) groups were one: the sequential plan's
  for (Candidate& c : cands) {
    const plan::Schedule& s = c.plan.sched;
    if (c.plan.layout == ArLayout::Owners) {  // one group per band: no per-call cost
      const int units = plan::band_count(s);
      plan::Partition part(size_t(units), 1);
      if (!t.group_sizes.empty()) {
        part = plan::parse_partition(t.group_sizes);
        if (std::accumulate(part.begin(), part.end(), 0) != units) continue;
      }
      c.plan.groups = plan::band_groups(s, part);
      // (one group would run the sequential fallback: no owner plan here, NoPlan
      // below where nothing else is; a forced owner layout's shape is then skipped)
      if (c.plan.groups.size() < 2) continue;
      const plan::Group& last = c.plan.groups.back();
      const double last_rows = double(s.m) - double(last.first_tile / s.tiles_n()) * s.bm;
      const double push_ms = double(s.m) * s.n * 2 * (t.world - 1) / (t.push_gb_s * 1e6);
      // The last wave's tiles are copied after they are computed: after the
      // GEMM when it is the bound; inside push_ms when the copies are.
      const int64_t last_tiles = s.tiles() - int64_t(s.waves() - 1) * s.ctas;
      const double last_ms = double(last_tiles) * s.bm * s.bn * 2 * (t.world - 1) / (t.push_gb_s * 1e6);
      c.plan.predicted_ms = std::max(c.gemm_ms * t.push_gemm_slowdown + last_ms, push_ms) +
                            last_rows * s.n * 2 * (t.world + 1) / (t.sum_gb_s * 1e6);
      if (!best || c.plan.predicted_ms < best->predicted_ms) best = c.plan;
      if (t.ranked) t.ranked->push_back(c.plan);
      continue;
    }
    const plan::BandwidthCurve& curve = t.curve_for(c.plan.reserve);
    // The last group: after the GEMM, an AllReduce with NCCL's defaults.
    const plan::BandwidthCurve& tail_curve = t.curve_for(0);
    const double wave_ms = c.gemm_ms / s.waves() * t.slowdown;
    plan::CostModel cost;
    std::function<int64_t(int)> unit_end_tile;  // tiles done when unit i is done
    if (!is_banded(c.plan.layout)) {
      unit_end_tile = [&s](int w) { return std::min<int64_t>(int64_t(w + 1) * s.ctas, s.tiles()); };
      cost.wave_ms.assign(s.waves(), wave_ms);
    } else {
      const int bands = plan::band_count(s);
      const int64_t band_tiles = int64_t(s.swizzle) * s.tiles_n();
      unit_end_tile = [&s, band_tiles](int b) { return std::min<int64_t>((b + 1) * band_tiles, s.tiles()); };
      int prev_wave = 0;
      for (int b = 0; b < bands; ++b) {  // band b is done with the wave of its last tile
        const int wave = s.round_of(int32_t(unit_end_tile(b) - 1)) + 1;
        cost.wave_ms.push_back((wave - prev_wave) * wave_ms);
        prev_wave = wave;
      }
    }
    const bool slots = !is_banded(c.plan.layout);  // units are waves of tiles
    cost.comm_ms = [&, slots, unit_end_tile](int32_t u0, int32_t u1) {
      const int64_t t0 = u0 == 0 ? 0 : unit_end_tile(u0 - 1), t1 = unit_end_tile(u1 - 1);
      double bytes;
      if (slots) {
        bytes = double(t1 - t0) * s.bm * s.bn * 2;
      } else {
        const int64_t r0 = t0 / s.tiles_n() * s.bm, r1 = std::min<int64_t>(t1 / s.tiles_n() * s.bm, s.m);
        bytes = double(r1 - r0) * s.n * 2;
      }
      const bool tail = u1 == int32_t(cost.wave_ms.size());
      return tail ? tail_curve.latency_ms(bytes) : curve.latency_ms(bytes) * t.comm_slowdown;
    };
    plan::Partition part;
    if (!t.group_sizes.empty()) {
      part = plan::parse_partition(t.group_sizes);
      if (std::accumulate(part.begin(), part.end(), 0) != cost.waves()) continue;  // fits another candidate
    } else {
      part = plan::search_dp(cost).partition;
    }
    c.plan.predicted_ms = plan::predict(cost, part).total_ms + (c.plan.layout == ArLayout::Slots ? reorder_ms : 0);
    c.plan.groups = slots ? plan::make_groups(s, part) : plan::band_groups(s, part);
    // One group is the GEMM, then one AllReduce: the sequential fallback's
    // work, never faster (the search returns it where the collective costs
    // ~nothing, as on one rank). Ranked (a forced path splits it), never picked.
    if (c.plan.groups.size() < 2) one_group = true;
    else if (!best || c.plan.predicted_ms < best->predicted_ms) best = c.plan;
    if (t.ranked) t.ranked->push_back(c.plan);
  }
  if (t.ranked)
    std::stable_sort(t.ranked->begin(), t.ranked->end(),
                     [](const AllReducePlan& x, const AllReducePlan& y) { return x.predicted_ms < y.predicted_ms; });
  if (!best && !t.group_sizes.empty())
    throw NoPlan("group sizes " + t.group_sizes + (one_group ? " are one group: the sequential plan's (give two or more)"
                                                            : " fit none of the candidate schedules"));
  if (!best && !one_group)
    throw NoPlan("no candidate plan for the layouts asked (owners need 2-8 ranks that reach each other's memory "
                 "over NVLink, n % 8 == 0, 128x256 tiles on more than 2 ranks, and row bands of at least 2 groups)");
  if (t.group_sizes.empty() && (t.ranked || !best || best->predicted_ms >= sequential_ms * 0.99)) {
    // Sequential fallback: our GEMM on every SM with its fastest tile.
    std::vector<plan::Schedule> full;
    std::vector<double> full_ms;
    for (plan::TileShape tile : t.tiles) {
      full.push_back(plan::make_schedule(m, n, tile, t.sms, plan::Raster::AlongN,
                                         plan::default_swizzle(t.sms, tile, int32_t((m + tile.bm - 1) / tile.bm))));
      full_ms.push_back(t.gemm_ms ? t.gemm_ms(full.back())
                                  : measure_gemm_ms(full.back(), int(k), t.dtype, a, b, scratch, t.stream, 10));
    }
    if (!t.gemm_ms) full_ms = max_over_ranks(*t.rv, full_ms);
    const size_t i = size_t(std::min_element(full_ms.begin(), full_ms.end()) - full_ms.begin());
    AllReducePlan seq = best ? *best : AllReducePlan{};
    seq.sequential = true;
    seq.layout = ArLayout::RowBands;
    seq.sched = full[i];
    seq.groups = plan::make_groups(seq.sched, {seq.sched.waves()});
    seq.reserve = 0;
    seq.predicted_ms = sequential_ms;
    seq.fallback_cublas = t.cublas_gemm_ms > 0 && t.cublas_gemm_ms < full_ms[i];
    if (t.ranked) t.ranked->push_back(seq);
    if (!best || best->predicted_ms >= sequential_ms * 0.99) best = seq;
  }
  return *best;
}

}  // namespace flashoverlap::rt
