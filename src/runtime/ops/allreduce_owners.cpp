// allreduce_owners.cpp — the owner layout of OverlapAllReduce (row bands,
// 2-8 ranks; see allreduce.h and kernels::Owner):
// setup of the symmetric window and the per-tile flags; one call = the GEMM,
// which sums, stores and exchanges every tile itself (then RMSNorm).
#include <algorithm>
#include <string>
#include <vector>
#include <utility>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "runtime/core/checks.h"
#include "runtime/ops/allreduce.h"
#include "runtime/transport/peer_windows.h"
#include "runtime/transport/peers.h"

namespace flashoverlap::rt {

void OverlapAllReduce::setup_owned() {
  const plan::Schedule& s = opts_.sched;
  const ncclComm_t comm = opts_.comm;
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world_), "comm");
  FO_NCCL_CHECK_CTX(ncclCommUserRank(comm, &comm_rank_), "comm");
  const std::string what = "the owner layout of " + std::to_string(s.m) + "x" + std::to_string(s.n);
  if (world_ < 2 || world_ > 8)
    throw InvalidArgument("OverlapAllReduce: " + what + " needs 2 to 8 ranks, not " + std::to_string(world_));
  if (wide() && !(opts_.four_stages && s.bn == 256))
    throw InvalidArgument("OverlapAllReduce: " + what + ": owners on more than 2 ranks need 128x256 tiles on 4 stages");
  if (s.n % 8 != 0) throw InvalidArgument("OverlapAllReduce: " + what + " needs n % 8 == 0 (rows by TMA)");
  // Every CTA resident at once: a CTA's storer and copy warps wait for tiles
  // that other CTAs (here and on the peer) compute.
  const int sms = current_device_sms();
  if (s.ctas > sms)
    throw InvalidArgument("OverlapAllReduce: " + what + " needs at most one CTA per SM (" + std::to_string(s.ctas) +
                          " CTAs, " + std::to_string(sms) + " SMs)");
  // Two halves (call parity) of tiles_m * bm rows, whole tiles: the peer's
  // stores are not clipped to m; one such slot per other rank (its
  // partials: kernels::owner_slot_of_sender). Then the flags, one per tile.
  // A shared window (OwnerWindow): its halves, of its largest tile rows, and
  // this op's tile rows' flag region; zeroed and agreed on when it was built.
  OwnerWindow* ow = opts_.owner_window;
  std::vector<char*> bases;  // every rank's copy of the window, by rank
  size_t flags_at = 0;
  if (ow) {
    if (ow->world != world_ || s.tiles_m() > ow->max_tile_rows || s.tiles_n() > ow->max_tiles_n)
      throw InvalidArgument("OverlapAllReduce: " + what + ": the shared owner window is for " +
                            std::to_string(ow->world) + " ranks and " + std::to_string(ow->max_tile_rows) + " x " +
                            std::to_string(ow->max_tiles_n) + " tiles at most");
    if (opts_.testing.first_epoch != 0)
      throw InvalidArgument("OverlapAllReduce: first_epoch needs the op's own window (its flags start at zero here)");
    owner_half_rows_ = ow->half_rows;
    flags_at = ow->flags_of(s.tiles_m());
    bases = ow->bases;
  } else {
    const int64_t half_rows = int64_t(s.tiles_m()) * s.bm;
    flags_at = (size_t(world_ - 1) * size_t(2 * half_rows) * s.n * 2 + 255) / 256 * 256;
    const size_t descs_at = (flags_at + size_t(s.tiles()) * sizeof(uint32_t) + 255) / 256 * 256;
    owner_window_ = SymmetricBuffer(comm, descs_at + OwnerCallSlots::kBytes, what);
    FO_CUDA_CHECK(cudaMemset(static_cast<char*>(owner_window_.get()) + descs_at, 0, OwnerCallSlots::kBytes));
    owner_half_rows_ = half_rows;
    std::vector<void*> at = window_peer_pointers(comm, owner_window_.window(), world_);
    at[size_t(comm_rank_)] = owner_window_.get();
    for (int r = 0; r < world_; ++r) {
      if (!at[size_t(r)])
        throw Error("rank " + std::to_string(opts_.rank) + ": NCCL gave no address for rank " + std::to_string(r) +
                    "'s copy of " + what);
      bases.push_back(static_cast<char*>(at[size_t(r)]));
    }
    own_calls_ = OwnerCallSlots(bases, descs_at, comm_rank_);
  }
  owner_base_ = bases[size_t(comm_rank_)];
  owner_flags_ = reinterpret_cast<uint32_t*>(owner_base_ + flags_at);
  if (!ow) {
    // Per call a tile's flag counts the final of a tile another rank owns, or
    // the W - 1 partials of a tile this rank owns (2 ranks: one either way).
    std::vector<uint32_t> per_call(size_t(s.tiles()), 1);
    if (wide())
      for (int32_t t = kernels::owned_begin(comm_rank_, s.tiles(), world_);
           t < kernels::owned_end(comm_rank_, s.tiles(), world_); ++t)
        per_call[size_t(t)] = uint32_t(world_ - 1);
    copy_to_device(owner_flags_, counts_after(epoch_, per_call));
  }
  // 2 ranks: the peer; more: every rank's window and flags, by rank (the
  // next rank's stands in for the 2-rank fields, which the kernel checks).
  owner_peer_base_ = bases[size_t((comm_rank_ + 1) % world_)];
  owner_peer_flags_ = reinterpret_cast<uint32_t*>(owner_peer_base_ + flags_at);
  owner_split_ = s.tiles() / 2;
  if (wide()) {
    const size_t w = static_cast<size_t>(world_);
    std::vector<void*> windows(w), flags(w);
    for (int r = 0; r < world_; ++r) windows[size_t(r)] = bases[size_t(r)], flags[size_t(r)] = bases[size_t(r)] + flags_at;
    windows_of_ = to_device(windows), flags_of_ = to_device(flags);
  }
  // 4 stages (kernels::GemmParams::four_stages): 128x256 tiles (traced too).
  four_stages_ = opts_.four_stages && s.bn == 256;
  owner_producers_ = opts_.owner_copy_in_gemm;
  owner_claims_ = DeviceBuffer(2 * sizeof(uint32_t));  // [call parity]
  FO_CUDA_CHECK(cudaMemset(owner_claims_.get(), 0, owner_claims_.bytes()));
  if (!ow) setup_barrier(comm, opts_.rank, what);  // every rank's flags are zero before any rank's first call
}

OwnerWindow::OwnerWindow(ncclComm_t comm, int rank, int64_t max_tile_rows_, int64_t n, int64_t max_tiles_n_,
                         const std::string& what)
    : max_tile_rows(max_tile_rows_), max_tiles_n(max_tiles_n_), half_rows(max_tile_rows_ * 128) {
  FO_NCCL_CHECK_CTX(ncclCommCount(comm, &world), what);
  if (world < 2 || world > 8) throw InvalidArgument(what + ": the owner layout needs 2 to 8 ranks, not " + std::to_string(world));
  flags_at = (size_t(world - 1) * size_t(2 * half_rows) * size_t(n) * 2 + 255) / 256 * 256;
  const size_t descs_at = (flags_of(max_tile_rows + 1) + 255) / 256 * 256;  // (after every tile rows' flags)
  const size_t zeroed = descs_at + OwnerCallSlots::kBytes - flags_at;
  buffer = SymmetricBuffer(comm, descs_at + OwnerCallSlots::kBytes, what);
  FO_CUDA_CHECK(cudaMemset(static_cast<char*>(buffer.get()) + flags_at, 0, zeroed));
  const std::vector<void*> at = window_peer_pointers(comm, buffer.window(), world);
  for (int r = 0; r < world; ++r) {
    char* b = r == rank ? static_cast<char*>(buffer.get()) : static_cast<char*>(at[size_t(r)]);
    if (!b) throw Error(what + ": NCCL gave no address for rank " + std::to_string(r) + "'s copy of the window");
    bases.push_back(b);
  }
  calls = OwnerCallSlots(bases, descs_at, rank);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  setup_barrier(comm, rank, what);  // every rank's flags are zero before any rank's first call
}

OwnerCallSlots::OwnerCallSlots(const std::vector<char*>& bases, size_t at, int rank) : world_(int(bases.size())) {
  if (world_ < 2 || world_ > kernels::kMaxCounters || rank < 0 || rank >= world_)
    throw InvalidArgument("OwnerCallSlots: rank " + std::to_string(rank) + " of " + std::to_string(world_) +
                          " ranks (2 to " + std::to_string(kernels::kMaxCounters) + ")");
  std::vector<void*> publish;  // [parity][rank d]: this rank's slot in d's window
  for (int parity = 0; parity < 2; ++parity)
    for (char* b : bases)
      publish.push_back(reinterpret_cast<kernels::CallDesc*>(b + at) + parity * kernels::kMaxCounters + rank);
  publish_ = to_device(publish);
  mine_ = reinterpret_cast<const kernels::CallDesc*>(bases[size_t(rank)] + at);
}

void OwnerCallSlots::prepare(kernels::Owner& o, uint32_t m, uint32_t plan) const {
  const int parity = int(calls_ % 2);
  const uint32_t seq = calls_ + 1;  // (from 1: slots of zeros hold no call)
  o.publish.slots = publish_.as<kernels::CallDesc*>() + parity * world_;
  o.publish.desc = {seq, m, plan, 0};
  o.check = kernels::CallCheck{};
  o.check.slots = mine_, o.check.parity = parity, o.check.seq = seq;
  for (int r = 0; r < world_; ++r) o.check.m[r] = m, o.check.plan[r] = plan;
}

uint32_t owner_call_plan(const plan::Schedule& s, int world, int k, kernels::DType dtype, int32_t split,
                         int registered_slot) {
  PlanDigest d;
  for (const int64_t v : {int64_t(world), int64_t(s.n), int64_t(k), int64_t(dtype), int64_t(s.bm), int64_t(s.bn),
                          int64_t(s.tiles_m()), int64_t(s.raster), int64_t(s.swizzle), int64_t(s.row_shift),
                          int64_t(split), int64_t(registered_slot)})
    d.mix(uint64_t(v));
  return d.h;
}

bool OverlapAllReduce::finals_into_outputs() const { return owners() && !sequential() && four_stages_; }

int OverlapAllReduce::register_output(void* out, int64_t ld_out) {
  const plan::Schedule& s = opts_.sched;
  const std::string who = "OverlapAllReduce::register_output (rank " + std::to_string(opts_.rank) + ")";
  const bool ok = out && kernels::aligned16(out) && ld_out >= s.n && ld_out % 8 == 0;
  const std::string why = who + ": the output must be 16-byte aligned with ld_out >= n (" + std::to_string(s.n) +
                          ") and ld_out % 8 == 0, not ld_out " + std::to_string(ld_out);
  // Only the plans that store into it map it on the peer (the same on every
  // rank); there a bad output makes every rank throw, none is left waiting.
  PeerMappedBuffer mapped;
  if (finals_into_outputs()) {
    try {
      mapped = PeerMappedBuffer(opts_.comm, comm_rank_, out, ld_out, ok,
                                std::chrono::milliseconds(std::max<int64_t>(1, int64_t(opts_.exchange_timeout_s * 1e3))));
    } catch (const Error&) {
      if (!ok) throw InvalidArgument(why);
      throw;
    }
  } else if (!ok) {
    throw InvalidArgument(why);
  }
  RegisteredOutput reg{out, ld_out, std::move(mapped), {}, {}};
  if (finals_into_outputs() && wide()) {  // every rank's C, by rank (kernels::Owner::outs_of, lds_of)
    const size_t w = static_cast<size_t>(world_);
    std::vector<void*> outs(w);
    std::vector<int64_t> lds(w);
    for (int r = 0; r < world_; ++r) outs[size_t(r)] = reg.mapped.of(r), lds[size_t(r)] = reg.mapped.ld_of(r);
    reg.outs_of = to_device(outs), reg.lds_of = to_device(lds);
  }
  registered_.push_back(std::move(reg));
  return int(registered_.size()) - 1;
}

void OverlapAllReduce::run_rows(const void* a, const void* b, void* out, int64_t ld_out, int64_t m,
                                cudaStream_t stream) {
  check_rows(m, "run_rows");
  if (!out) throw InvalidArgument("OverlapAllReduce::run_rows (rank " + std::to_string(opts_.rank) + "): null output");
  if (ld_out < opts_.sched.n) throw InvalidArgument("OverlapAllReduce::run_rows: ld_out < n");
  begin_call(stream);
  enqueue_owned(a, b, out, ld_out, nullptr, stream, nullptr, m);
  end_call(stream);
}

void OverlapAllReduce::run_rmsnorm_rows(const void* a, const void* b, const RmsNormArgs& norm, void* out, int64_t m,
                                        cudaStream_t stream) {
  check_rows(m, "run_rmsnorm_rows");
  check_rmsnorm_args(norm, out, m);
  begin_call(stream);
  enqueue_owned(a, b, out, opts_.sched.n, &norm, stream, nullptr, m);
  end_call(stream);
}

void OverlapAllReduce::check_rows(int64_t m, const char* call) const {
  const plan::Schedule& s = opts_.sched;
  const std::string who = std::string("OverlapAllReduce::") + call + " (rank " + std::to_string(opts_.rank) + ")";
  if (!owners() || sequential()) throw InvalidArgument(who + ": only the owner plans run any m of their tile rows");
  if (m < 1 || (m + s.bm - 1) / s.bm != s.tiles_m())
    throw InvalidArgument(who + ": m = " + std::to_string(m) + " is not of the plan's " + std::to_string(s.tiles_m()) +
                          " tile rows");
}

void OverlapAllReduce::run_registered(const void* a, const void* b, int slot, cudaStream_t stream, int64_t m) {
  if (slot < 0 || size_t(slot) >= registered_.size())
    throw InvalidArgument("OverlapAllReduce::run_registered (rank " + std::to_string(opts_.rank) + "): no output " +
                          std::to_string(slot) + " (" + std::to_string(registered_.size()) + " registered)");
  const RegisteredOutput& r = registered_[size_t(slot)];
  if (m > 0) check_rows(m, "run_registered");
  if (!finals_into_outputs()) return m > 0 ? run_rows(a, b, r.out, r.ld, m, stream) : run(a, b, r.out, r.ld, stream);
  begin_call(stream);
  enqueue_owned(a, b, r.out, r.ld, nullptr, stream, &r, m);
  end_call(stream);
}

void OverlapAllReduce::enqueue_owned(const void* a, const void* b, void* out, int64_t ld_out, const RmsNormArgs* norm,
                                     cudaStream_t stream, const RegisteredOutput* reg, int64_t m) {
  plan::Schedule s = opts_.sched;  // (the call's rows: the same tiles, the last tile row clipped elsewhere)
  if (m > 0) s.m = int32_t(m);
  // This rank's tiles go to the peer's window, the peer's are read here (kernels::Owner).
  // In place (the norm reads C): C is this call's half of the
  // window, where the peer's finals land. Else the GEMM stores C by TMA:
  // 16-byte aligned rows; other outputs get a copy from this op's scratch
  // (allocated at the first such call).
  const bool in_place = result_in_window() && norm;
  const bool direct = in_place || (kernels::aligned16(out) && ld_out % 8 == 0);
  if (!direct && !owned_scratch_.get()) owned_scratch_ = DeviceBuffer(size_t(opts_.sched.m) * s.n * 2);  // (the most rows a call has)
  EpochBump bump(epoch_);
  const uint32_t epoch = epoch_;  // this call's
  OwnerWindow* ow = opts_.owner_window;
  const int64_t row0 = ((ow ? ow->calls.count() : epoch) & 1) * owner_half_rows_;  // (shared: every owner call alternates)
  void* c = in_place ? static_cast<void*>(owner_base_ + row0 * s.n * 2)
                     : direct ? out : owned_scratch_.get();
  kernels::GemmParams p =
      kernels::plain_gemm(opts_.dtype, a, b, s, opts_.k, c, direct && !in_place ? ld_out : s.n);
  p.group_of_tile = group_of_tile_.as<int32_t>();
  p.four_stages = four_stages_;
  kernels::Owner& o = p.owner;
  o.rank = comm_rank_, o.split = owner_split_;
  o.window = owner_base_, o.peer_window = owner_peer_base_, o.window_rows = 2 * owner_half_rows_;
  o.row0 = int32_t(row0);
  o.in_place = in_place;
  if (four_stages_ && !wide()) o.push_tma = opts_.push_tma, o.push_window = owner_peer_base_;
  o.pushers = opts_.owner_pushers < 0 ? kernels::owner_pushers_by_k(opts_.k) : opts_.owner_pushers != 0;
  if (wide()) {  // (kernels::Owner::world: no TMA pushes, the pusher warps push)
    o.world = world_, o.walk = kernels::OwnerWalk::Ranges, o.pushers = true;
    o.own_begin = kernels::owned_begin(comm_rank_, s.tiles(), world_);
    o.own_end = kernels::owned_end(comm_rank_, s.tiles(), world_);
    o.flags_of = flags_of_.as<uint32_t*>(), o.windows_of = windows_of_.as<void*>();
  }
  if (reg && !wide()) {  // the peer's finals into this C, this rank's into the peer's (run_registered)
    const int peer = 1 - comm_rank_;
    o.finals_in_c = true, o.peer_out = reg->mapped.of(peer), o.peer_ld = reg->mapped.ld_of(peer);
  } else if (reg) {  // every other rank's C
    o.finals_in_c = true, o.outs_of = reg->outs_of.as<void*>(), o.lds_of = reg->lds_of.as<int64_t>();
  }
  o.flags = owner_flags_, o.peer_flags = owner_peer_flags_, o.epoch = epoch;
  OwnerCallSlots& calls = ow ? ow->calls : own_calls_;
  const int slot = o.finals_in_c ? int(reg - registered_.data()) : -1;  // (the peers' C this call stores into)
  calls.prepare(o, uint32_t(s.m), owner_call_plan(s, world_, opts_.k, opts_.dtype, owner_split_, slot));
  uint32_t* claims = owner_claims_.as<uint32_t>();
  o.claims = claims + (epoch & 1);
  o.claims_reset = claims + ((epoch + 1) & 1);  // (this call's were zeroed by the last)
  o.producers = owner_producers_;
  o.timeout_ns = timeout_ns(), o.err = wait_error_;
  // Once the GEMM may be queued (bump.keep), this call's number (and with a
  // shared window its half) is taken, also when the launch then throws (the
  // epoch stays taken too).
  try {
    if (opts_.testing.fault_drop_group >= 0)  // (a test's fault: this rank's waits for the group time out)
      kernels::launch_uncount_group(owner_flags_, p.group_of_tile, s.tiles(), opts_.testing.fault_drop_group, stream);
    launch_call_gemm(p, stream, bump);
  } catch (...) {
    if (bump.keep) calls.advance();
    throw;
  }
  calls.advance();
  if (tracing_) traced_ = true;  // (the GEMM's end is this call's last event: timeline() reads it and the monitors)
  if (!direct)
    FO_CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(ld_out) * 2, c, size_t(s.n) * 2, size_t(s.n) * 2, size_t(s.m),
                                    cudaMemcpyDeviceToDevice, stream));
  if (norm)  // (in place: from the window into out)
    kernels::add_rmsnorm_rows(opts_.dtype, in_place ? c : out, s.m, s.n, norm->residual, norm->weight, norm->eps,
                              out, norm->residual_out, stream);
}

}  // namespace flashoverlap::rt
