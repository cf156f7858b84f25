// alltoall.cpp — see alltoall.h.
#include "runtime/ops/alltoall.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "flashoverlap/error.h"
#include "kernels/alltoall_tables.h"
#include "kernels/reorder.h"
#include "runtime/core/checks.h"
#include "plan/alltoall_peers.h"
#include "runtime/transport/send_recv.h"

namespace flashoverlap::rt {
namespace {

constexpr size_t kAlign = 256;
// The staging ring's pinned memory (an op is made per tile shape, a model may hold one per layer) and its slots at
// most: the calls the host may queue ahead of the GPU.
constexpr size_t kStagingBytes = size_t(4) << 20, kStagingSlots = 64;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The call's compact tables, in the order they are packed (alltoall.h).
enum Table {
  kTmOf, kSbase, kDest, kRrank, kGroupOfTile, kRtab, kRkey, kTokenBegin, kTokenRows, kToken, kGate,
  kARow0, kBRow0, kRowsOf,  // (several experts: the grouped GEMM's tile rows)
  kTables
};

}  // namespace

OverlapAllToAll::OverlapAllToAll(const OverlapAllToAllOptions& opts) : opts_(opts) {
  const std::string who = "OverlapAllToAll (n " + std::to_string(opts_.n) + ", k " + std::to_string(opts_.k) + ")";
  world_ = opts_.world, rank_ = opts_.rank;
  rank_and_world(opts_.comm, bool(opts_.transport), rank_, world_, who);
  if (opts_.n < 1 || opts_.k < 8 || opts_.k % 8 != 0)
    throw InvalidArgument(who + ": n must be >= 1 and k a positive multiple of 8");
  if (!kernels::op_tile_supported(opts_.tile.bm, opts_.tile.bn, opts_.fp8.on))
    throw InvalidArgument(who + ": unsupported tile " + plan::to_string(opts_.tile) +
                          " (" + (opts_.fp8.on ? "FP8: " : "") + kernels::op_tile_names(opts_.fp8.on) + ")");
  if (opts_.sequential_ctas == 0) opts_.sequential_ctas = opts_.ctas;
  if (opts_.ctas < 1 || opts_.sequential_ctas < 1) throw InvalidArgument(who + ": the grids need >= 1 CTA");
  if (opts_.max_rows < 0 || opts_.max_recv_rows < 0 || opts_.max_tokens < 0 ||
      opts_.max_rows * ((opts_.n + opts_.tile.bn - 1) / opts_.tile.bn) > INT32_MAX ||
      opts_.max_recv_rows * ((opts_.n + opts_.tile.bn - 1) / opts_.tile.bn) > INT32_MAX)
    throw InvalidArgument(who + ": max_rows, max_recv_rows and max_tokens must be >= 0, and the slot rows they "
                                "make (rows x column tiles) fit int32");
  if (!(opts_.wait_timeout_s > 0 && opts_.wait_timeout_s <= 7 * 24 * 3600.0))
    throw InvalidArgument(who + ": wait_timeout_s must be > 0 and at most a week");
  if (opts_.experts < 1 || int64_t{opts_.experts} * opts_.n > INT32_MAX)
    throw InvalidArgument(who + ": experts must be >= 1, and experts x n (the rows of b) fit int32");
  if (opts_.fp8.on && (opts_.experts != 1 || (opts_.nvlink && opts_.tile.bn != 128)))
    throw InvalidArgument(who + ": FP8 inputs take one expert, and 128x128 tiles on the NVLink form");

  if (!opts_.core) own_core_ = std::make_unique<OverlapCore>();
  core_ = opts_.core ? opts_.core : own_core_.get();
  wait_error_ = core_->wait_error();
  kernels::preload_kernels();  // before any wait is enqueued (docs/design.md §5.4)

  const int64_t tiles_n = (opts_.n + opts_.tile.bn - 1) / opts_.tile.bn;
  // With several experts the GEMM's tile rows are the segments' (each ragged
  // at its end): at most one more per (source, expert) segment.
  const int64_t bm = opts_.tile.bm, rows_most = std::max<int64_t>(opts_.max_rows, 1);
  const int64_t tile_rows_most =
      (rows_most + bm - 1) / bm + (opts_.experts > 1 ? std::min<int64_t>(int64_t{world_} * opts_.experts, rows_most) : 0);
  const plan::Schedule most = schedule_of(opts_.experts > 1 ? tile_rows_most * bm : rows_most, false);
  max_groups_ = size_t(std::max(most.waves(), 1));
  // Every row is stored once per tile column; no padding.
  send_bytes_ = size_t(std::max<int64_t>(opts_.max_rows, 1)) * tiles_n * opts_.tile.bn * 2;
  recv_bytes_ = size_t(std::max<int64_t>(opts_.max_recv_rows, 1)) * tiles_n * opts_.tile.bn * 2;
  send_ = core_->scratch(kSendScratch, send_bytes_);
  recv_ = core_->scratch(kRecvScratch, recv_bytes_);
  // Bounds of the compact tables: this rank's tiles (max_rows), every
  // source's tile rows (each has at most max_rows), the rows received.
  const size_t tiles = size_t(most.tiles()), rows = size_t(std::max<int64_t>(opts_.max_rows, 1)),
               recv = size_t(std::max<int64_t>(opts_.max_recv_rows, 1)), W = size_t(world_),
               src_tiles = W * size_t(most.tiles_m()) * size_t(tiles_n);
  const size_t grouped = opts_.experts > 1 ? size_t(tile_rows_most) * 4 : 0;
  const size_t sizes[kTables] = {tiles * 4, tiles * W * 4, rows * 4, rows * 4, tiles * 4, src_tiles * 4, recv * 4,
                                 (size_t(opts_.max_tokens) + 1) * 4, recv * 4, recv * 4, recv * 4,
                                 grouped, grouped, grouped};
  offsets_.assign(kTables + 1, 0);
  for (int t = 0; t < kTables; ++t) offsets_[size_t(t) + 1] = offsets_[size_t(t)] + aligned(sizes[t]);
  staging_ = StagingRing(offsets_.back(), StagingRing::slots_within(kStagingBytes, offsets_.back(), kStagingSlots));
  tables_ = DeviceBuffer(offsets_.back());
  row_of_ = DeviceBuffer(tiles * size_t(opts_.tile.bm) * 4);
  slot_of_out_ = DeviceBuffer(recv * size_t(tiles_n) * 4);
  counters_ = DeviceBuffer((max_groups_ + 1) * 4);  // (+ the fault-injection sink)
  std::vector<int32_t> iota(recv);  // the direct sequential call's slot of each received row
  for (size_t i = 0; i < recv; ++i) iota[i] = int32_t(i);
  iota_ = to_device(iota);
  FO_CUDA_CHECK(cudaMemset(counters_.get(), 0, counters_.bytes()));
  if (opts_.nvlink) {
    if (opts_.n % 8 != 0 || int64_t{world_} * std::max<int64_t>(opts_.max_recv_rows, 1) > INT32_MAX)
      throw InvalidArgument(who + ": the NVLink form needs n % 8 == 0 and world * max_recv_rows within int32");
    peers_ = PeerWindows(rank_, world_, size_t(std::max<int64_t>(opts_.max_recv_rows, 1)) * size_t(opts_.n) * 2,
                         opts_.transport ? nullptr : opts_.comm, who);
  }
  if (!opts_.core) FO_CUDA_CHECK(cudaDeviceSynchronize());
}

OverlapAllToAll::~OverlapAllToAll() {
  core_->wait_last_call();
}

plan::Schedule OverlapAllToAll::schedule_of(const plan::MoeRouting& routing, int rank, bool sequential) const {
  return plan::make_moe_schedule(routing, rank, opts_.n, opts_.tile, sequential ? opts_.sequential_ctas : opts_.ctas);
}

plan::Schedule OverlapAllToAll::schedule_of(int64_t rows, bool sequential) const {
  const int32_t ctas = sequential ? opts_.sequential_ctas : opts_.ctas;
  const int32_t tiles_m = int32_t(std::max<int64_t>((rows + opts_.tile.bm - 1) / opts_.tile.bm, 1));
  return plan::make_expert_schedule(rows, opts_.n, opts_.tile, ctas, plan::Raster::AlongN,
                                    plan::default_swizzle(ctas, opts_.tile, tiles_m));
}

void OverlapAllToAll::upload(cudaStream_t stream) {
  // (the slot's copy of staging_.slots() calls before must be done: take() waits for it, mostly long since)
  char* host = static_cast<char*>(staging_.take());
  size_t used[kTables] = {};
  auto put = [&](Table t, const void* src, size_t bytes) {
    if (offsets_[size_t(t)] + bytes > offsets_[size_t(t) + 1])
      throw Error("OverlapAllToAll: table " + std::to_string(int(t)) + " outgrew its " +
                  std::to_string(offsets_[size_t(t) + 1] - offsets_[size_t(t)]) + " bytes (internal error)");
    if (bytes) std::memcpy(host + offsets_[size_t(t)], src, bytes);
    used[t] = bytes;
  };
  const plan::AllToAllTables& t = tables_host_;
  const std::vector<int32_t> group_of_tile =
      whole_rows() ? std::vector<int32_t>{} : plan::group_of_tiles(my_groups_, t.tiles(), opts_.testing.fault_drop_group);
  put(kTmOf, t.tm_of.data(), t.tm_of.size() * 4);
  put(kSbase, t.sbase.data(), t.sbase.size() * 4);
  put(kDest, t.dest.data(), t.dest.size() * 4);
  put(kRrank, t.rrank.data(), t.rrank.size() * 4);
  put(kGroupOfTile, group_of_tile.data(), group_of_tile.size() * 4);
  put(kRtab, t.rtab.data(), t.rtab.size() * 4);
  put(kRkey, t.rkey.data(), t.rkey.size() * 4);
  put(kTokenBegin, table_.token_begin.data(), table_.token_begin.size() * 4);
  put(kTokenRows, table_.token_rows.data(), table_.token_rows.size() * 4);
  put(kToken, table_.token.data(), table_.token.size() * 4);
  put(kGate, table_.gate.data(), table_.gate.size() * 4);
  const plan::GroupedTileRows& g = grouped_host_;
  put(kARow0, g.a_row0.data(), g.a_row0.size() * 4);
  put(kBRow0, g.b_row0.data(), g.b_row0.size() * 4);
  put(kRowsOf, g.rows.data(), g.rows.size() * 4);
  // One copy of the used prefix (the tables' ends are mostly unused space).
  size_t last = 0;
  for (int t = 0; t < kTables; ++t)
    if (used[t]) last = offsets_[size_t(t)] + used[t];
  if (last) FO_CUDA_CHECK(cudaMemcpyAsync(tables_.get(), host, last, cudaMemcpyHostToDevice, stream));
  staging_.queued(stream);
  const bool grouped = opts_.experts > 1;  // (the tile rows put above: grouped_host_'s)
  kernels::expand_row_of(table(kTmOf), table(kSbase), table(kDest), table(kRrank), t.tiles(), t.bm, t.world, t.m,
                         row_of_.as<int32_t>(), stream, grouped ? table(kARow0) : nullptr,
                         grouped ? table(kRowsOf) : nullptr);
  if (!whole_rows())  // (the rows n wide, one each, need no slot table: the NVLink tables have none)
    kernels::expand_slot_of_out(table(kRtab), table(kRkey), t.out_rows, t.tiles_n, slot_of_out_.as<int32_t>(), stream);
}

void OverlapAllToAll::set_grouped(kernels::GemmParams& p, int64_t rows) const {
  if (opts_.experts > 1)
    p.grouped = {table(kARow0), table(kBRow0), table(kRowsOf), rows, int64_t{opts_.experts} * opts_.n};
}

void OverlapAllToAll::move(const A2aGroupCall& c) {
  if (opts_.transport) {
    opts_.transport(c);
    return;
  }
  const bool last = c.group < 0 || size_t(c.group) + 1 == calls_.size();
  const ncclComm_t comm = last && opts_.tail_comm ? opts_.tail_comm : opts_.comm;
  send_recv_spans(c.send, c.recv, *c.send_to, *c.recv_from, opts_.dtype, comm, rank_, /*self_by_copy=*/true, c.stream,
                  "rank " + std::to_string(rank_) +
                      (c.group < 0 ? " sequential all-to-all" : " group " + std::to_string(c.group)));
}

void OverlapAllToAll::run(const void* a, const void* b, const A2aCall& call, void* out, int64_t ld_out,
                          cudaStream_t stream, int32_t* tokens_out) {
  const std::string who = "OverlapAllToAll::run (rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ")";
  if (!call.routing) throw InvalidArgument(who + ": no routing");
  const plan::MoeRouting& routing = *call.routing;
  if (routing.world != world_)
    throw InvalidArgument(who + ": a routing of " + std::to_string(routing.world) + " ranks");
  if (routing.experts != opts_.experts)
    throw InvalidArgument(who + ": a routing of " + std::to_string(routing.experts) + " experts per rank, the op has " +
                          std::to_string(opts_.experts));
  const bool counted = call.counts && call.counts->counts.size() == size_t(world_);
  if (!counted) plan::validate_moe_routing(routing);  // (counts are made by the routing's check)
  const plan::MoeRowCounts* counts = counted && call.counts->bm == opts_.tile.bm ? call.counts : nullptr;
  const int64_t rows = routing.rows(rank_);
  int64_t recv_rows = 0;
  for (int s = 0; s < world_; ++s) recv_rows += routing.send_count(s, rank_);
  const int32_t tokens = routing.tokens[size_t(rank_)];
  int64_t most_rows = 0;
  for (int r = 0; r < world_; ++r) most_rows = std::max(most_rows, routing.rows(r));
  if (most_rows > opts_.max_rows || recv_rows > opts_.max_recv_rows || tokens > opts_.max_tokens)
    throw InvalidArgument(who + ": " + std::to_string(most_rows) + " rows on a rank, " + std::to_string(recv_rows) +
                          " received rows and " + std::to_string(tokens) + " tokens exceed the op's " +
                          std::to_string(opts_.max_rows) + ", " + std::to_string(opts_.max_recv_rows) + " and " +
                          std::to_string(opts_.max_tokens));
  if ((rows > 0 && (!a || !b)) || (!out && (call.combine ? tokens : recv_rows) > 0))
    throw InvalidArgument(who + ": null input or output");
  if (ld_out < opts_.n) throw InvalidArgument(who + ": ld_out < n");
  if (call.nvlink) {
    run_nvlink(a, b, call, out, ld_out, stream, tokens_out);
    return;
  }
  nvlink_call_ = false;

  // This call's plan: every rank's schedule and groups.
  const bool seq = call.common.size() <= 1;
  std::vector<plan::Schedule> scheds;
  std::vector<std::vector<plan::Group>> groups;
  for (int r = 0; r < world_; ++r) {
    scheds.push_back(schedule_of(routing, r, seq));
    groups.push_back(seq ? std::vector<plan::Group>{plan::group_spanning(scheds.back(), 0, scheds.back().waves())}
                         : plan::make_clipped_groups(scheds.back(), call.common));
  }
  if (groups[size_t(rank_)].size() > max_groups_)
    throw InvalidArgument(who + ": " + std::to_string(groups[size_t(rank_)].size()) + " groups, more than the " +
                          std::to_string(max_groups_) + " waves of max_rows");
  // The sequential call on rows in the dispatch's order (each destination's
  // rows one block, on every rank: the same choice everywhere) skips the
  // slots: our GEMM stores C whole (no row-by-row stores), each block goes
  // as it is, and the rows arrive in (source, row) order.
  direct_ = seq && opts_.n % 8 == 0 && plan::in_dispatch_order(routing);
  plan::fill_combine_table(routing, rank_, table_);  // (its memory kept across calls)
  my_groups_ = groups[size_t(rank_)];
  grouped_host_ = opts_.experts > 1 ? plan::moe_tile_rows(routing, rank_, opts_.n, opts_.tile.bm) : plan::GroupedTileRows{};
  if (direct_) {
    tables_host_ = plan::AllToAllTables{};
    plan::GroupCall c;
    int64_t sent = 0, got = 0;
    for (int p = 0; p < world_; ++p) {
      const int64_t out = routing.send_count(rank_, p), in = routing.send_count(p, rank_);
      c.send_to.push_back({sent * opts_.n, out * opts_.n});
      c.recv_from.push_back({got * opts_.n, in * opts_.n});
      sent += out, got += in;
    }
    c.send = {0, sent * opts_.n}, c.recv = {0, got * opts_.n};
    calls_ = {c};
    recv_rows_ = got;
    rows_elems_ = {sent * opts_.n, got * opts_.n};
  } else {
    tables_host_ = plan::make_alltoall_tables(scheds, groups, routing, rank_, counts);
    calls_ = tables_host_.groups;
    recv_rows_ = tables_host_.out_rows;
  }
  target_.clear();
  for (const plan::Group& g : my_groups_) target_.push_back(uint32_t(g.tiles()) * kernels::kSignalsPerTile);

  core_->begin_call(stream);
  send_ = core_->scratch(kSendScratch, send_bytes_);  // (another op of the core may have grown them)
  recv_ = core_->scratch(kRecvScratch, recv_bytes_);
  upload(stream);

  const plan::Schedule& s = scheds[size_t(rank_)];
  if (!seq) {
    FO_CUDA_CHECK(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), stream));
    core_->fork(stream);  // the waits start no earlier than the GEMM
  }
  cublas_call_ = direct_ && call.cublas && opts_.experts == 1;
  // (several experts: every GEMM is the grouped one over this rank's segments, C's rows those of A)
  if (rows > 0 && cublas_call_) {
    if (!opts_.cublas && !own_cublas_) own_cublas_ = std::make_unique<CublasGemm>();
    kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, send_, opts_.n);
    p.m = int32_t(rows), p.n = int32_t(opts_.n), p.fp8 = opts_.fp8;
    run_plain_gemm(opts_.cublas ? opts_.cublas : own_cublas_.get(), p, stream);
  } else if (rows > 0 && direct_) {
    kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, send_, opts_.n);
    p.fp8 = opts_.fp8;
    set_grouped(p, rows);
    kernels::launch_gemm(p, stream);
  } else if (rows > 0) {
    kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, nullptr, 0);
    p.fp8 = opts_.fp8;
    p.store = kernels::Store::SlotRows, p.slots = send_, p.row_of = row_of_.as<int32_t>();
    p.slot_rows = tables_host_.send_rows;
    if (!seq) p.counters = counters_.as<uint32_t>(), p.group_of_tile = table(kGroupOfTile);
    set_grouped(p, rows);
    kernels::check_gemm_params(p);
    kernels::launch_gemm(p, stream);  // in host order before the waits (lazy-loading hazard)
  }
  const cudaStream_t comm_stream = seq ? stream : core_->comm_stream();
  for (size_t g = 0; g < calls_.size(); ++g) {
    if (!seq)
      kernels::launch_wait_counter(counter(g), counter_target(g), timeout_ns(), wait_error_, int32_t(g), comm_stream);
    move({seq ? -1 : int32_t(g), send_, recv_, &calls_[g].send_to, &calls_[g].recv_from, comm_stream});
  }
  if (!seq) core_->join(stream);

  post(call, recv_, out, ld_out, stream, tokens_out);
  core_->end_call(stream);
}

void OverlapAllToAll::run_nvlink(const void* a, const void* b, const A2aCall& call, void* out, int64_t ld_out,
                                 cudaStream_t stream, int32_t* tokens_out) {
  const plan::MoeRouting& routing = *call.routing;
  if (!nvlink_ready())
    throw InvalidArgument("OverlapAllToAll::run (rank " + std::to_string(rank_) +
                          "): the NVLink form needs the op built with nvlink and every rank's window connected");
  if (capturing(stream))
    throw InvalidArgument("OverlapAllToAll::run (rank " + std::to_string(rank_) +
                          "): the NVLink form cannot be captured into a CUDA graph (its counters run across calls)");
  // The whole grid (no SMs for NCCL), each rank's walk starting at the
  // next rank's rows as the slotted calls' (make_moe_schedule).
  const plan::Schedule s = schedule_of(routing, rank_, /*sequential=*/true);
  tables_host_ = plan::make_alltoall_peer_tables(s, routing, rank_, std::max<int64_t>(opts_.max_recv_rows, 1));
  plan::fill_combine_table(routing, rank_, table_);  // (its memory kept across calls)
  my_groups_.clear(), calls_.clear(), target_.clear();
  direct_ = false, nvlink_call_ = true, cublas_call_ = false;
  grouped_host_ = opts_.experts > 1 ? plan::moe_tile_rows(routing, rank_, opts_.n, opts_.tile.bm) : plan::GroupedTileRows{};
  recv_rows_ = tables_host_.out_rows;
  rows_elems_ = {routing.rows(rank_) * opts_.n, recv_rows_ * opts_.n};
  // Every source's: 2 per tile (1 for a call with none); its rows; its
  // plan's digest for the call check (its signals and its rows to each
  // rank, FNV-1a), so that routings that differ in where rows go differ.
  // (Several experts: its tiles are its grouped GEMM's, a tile row per
  // (source, expert) segment's 128 rows or fewer.)
  std::vector<uint32_t> counts, rows, plans;
  for (int src = 0; src < world_; ++src) {
    const int32_t tiles = schedule_of(plan::moe_schedule_rows(routing, src, opts_.tile.bm), true).tiles();
    counts.push_back(tiles > 0 ? uint32_t(tiles) * kernels::kSignalsPerTile : 1u);
    rows.push_back(uint32_t(routing.rows(src)));
    PlanDigest h;
    h.mix(counts.back());
    for (int d = 0; d < world_; ++d) h.mix(uint64_t(routing.send_count(src, d)));
    plans.push_back(h.h);
  }
  uint32_t* const* arrivals = peers_.arrivals(opts_.testing.fault_drop_arrivals);
  kernels::GemmParams p = kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, nullptr, 0);
  p.fp8 = opts_.fp8;
  p.store = kernels::Store::SlotRows, p.row_of = row_of_.as<int32_t>();
  p.scatter.world = world_, p.scatter.rows = peers_.rows(0);
  p.scatter.rows_per_rank = int32_t(std::max<int64_t>(opts_.max_recv_rows, 1)), p.scatter.arrivals = arrivals;
  set_grouped(p, routing.rows(rank_));  // (the tables' places: filled by upload below, before the GEMM)
  if (s.m > 0) kernels::check_gemm_params(p);  // (what can be refused, before the windows' state moves)

  const PeerWindows::Call next = peers_.next_call(counts, rows, plans);
  const int half = next.half;
  try {
    core_->begin_call(stream);
    upload(stream);
    p.scatter.rows = peers_.rows(half), p.scatter.publish = next.publish;
    if (s.m > 0)
      kernels::launch_gemm(p, stream);
    else
      kernels::launch_signal_counters(arrivals, world_, 1, stream, next.publish);
    kernels::launch_wait_counters(peers_.counters(), world_, next.targets, timeout_ns(), wait_error_, stream,
                                  next.check);
  } catch (...) {
    peers_.mark_broken();  // (the other ranks count on this call: every later one would wait in vain)
    throw;
  }
  post(call, peers_.half(half), out, ld_out, stream, tokens_out);
  core_->end_call(stream);
}

void OverlapAllToAll::post(const A2aCall& call, const void* recv, void* out, int64_t ld_out, cudaStream_t stream,
                           int32_t* tokens_out) {
  // The received slot rows: bn wide, per (row, column block) through
  // slot_of_out; in the direct and NVLink calls the rows themselves (n
  // wide, one each).
  const int32_t tiles_n = int32_t((opts_.n + opts_.tile.bn - 1) / opts_.tile.bn);
  const int32_t row_width = whole_rows() ? int32_t(opts_.n) : opts_.tile.bn, blocks = whole_rows() ? 1 : tiles_n;
  const int32_t* slot_of = whole_rows() ? iota_.as<int32_t>() : slot_of_out_.as<int32_t>();
  const int32_t tokens = call.routing->tokens[size_t(rank_)];
  if (call.combine)
    kernels::combine_slot_rows(opts_.dtype, recv, row_width, slot_of, blocks, table(kTokenBegin), table(kTokenRows),
                               reinterpret_cast<const float*>(table(kGate)), tokens, int32_t(opts_.n), out,
                               ld_out, stream);
  else if (recv_rows_ > 0)
    kernels::gather_slot_rows(opts_.dtype, recv, row_width, slot_of, blocks, int32_t(recv_rows_), int32_t(opts_.n),
                              out, ld_out, stream);
  if (tokens_out && recv_rows_ > 0)
    FO_CUDA_CHECK(cudaMemcpyAsync(tokens_out, table(kToken), size_t(recv_rows_) * 4, cudaMemcpyDeviceToDevice, stream));
}

void OverlapAllToAll::check() const {
  if (!wait_error_->failed) return;
  const kernels::WaitError e = *wait_error_;
  std::ostringstream os;
  if (e.failed == kernels::kCallCheckFailed)
    throw Error(describe_call_check(e, rank_, "the overlapped GEMM+All-to-All (NVLink form; n " +
                                                  std::to_string(opts_.n) + ", k " + std::to_string(opts_.k) + ")",
                                    "rows"));
  if (e.group < 0)  // (the NVLink form's wait: group -1 - source)
    os << "rank " << rank_ << ": the rows from rank " << (-1 - e.group)
       << " of the overlapped GEMM+All-to-All (NVLink form; n " << opts_.n << ", k " << opts_.k
       << ") did not arrive within " << opts_.wait_timeout_s << " s: arrivals " << e.value << ", expected "
       << e.expected << " (that rank's GEMM did not count all of its tiles here, or it is out of step)";
  else
    os << "rank " << rank_ << ": group " << e.group << " of the overlapped GEMM+All-to-All (n " << opts_.n << ", k "
       << opts_.k << ") did not complete within " << opts_.wait_timeout_s << " s: counter " << e.value
       << ", expected " << e.expected << " (the GEMM did not signal all of the group's tiles)";
  throw Error(os.str());
}

}  // namespace flashoverlap::rt
