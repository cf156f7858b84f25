// baselines_alltoall.cpp — see baselines_alltoall.h.
#include "runtime/ops/baselines_alltoall.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "flashoverlap/error.h"
#include "kernels/reorder.h"
#include "plan/slot_map_alltoall.h"
#include "runtime/core/checks.h"
#include "runtime/transport/send_recv.h"

namespace flashoverlap::rt {

MoeCombineBaseline::MoeCombineBaseline(const plan::MoeRouting& routing, int rank, int64_t n, kernels::DType dtype,
                                       ncclComm_t comm, int chunks)
    : ChunkStreams(chunks), routing_(routing), rank_(rank), world_(routing.world), n_(n), dtype_(dtype), comm_(comm) {
  plan::validate_moe_routing(routing);
  if (n % 8 != 0) throw InvalidArgument("the MoE combine baseline needs n % 8 == 0, not n = " + std::to_string(n));
  const auto& dest = routing.dest_rank[size_t(rank)];
  rows_ = int64_t(dest.size());
  for (int r = 0; r < routing.world; ++r)  // (every rank's: the same verdict everywhere)
    if (!std::is_sorted(routing.dest_rank[size_t(r)].begin(), routing.dest_rank[size_t(r)].end()))
      throw InvalidArgument("the MoE combine baseline needs every rank's rows by destination (the dispatch's "
                            "order); rank " + std::to_string(r) + "'s are not");
  block_of_.assign(size_t(world_) + 1, 0);
  from_.assign(size_t(world_) + 1, 0);
  src_block_at_.assign(size_t(world_), 0);
  for (int d = 0; d < world_; ++d) block_of_[size_t(d) + 1] = block_of_[size_t(d)] + routing.send_count(rank, d);
  for (int s = 0; s < world_; ++s) {
    from_[size_t(s) + 1] = from_[size_t(s)] + routing.send_count(s, rank);
    for (int d = 0; d < rank; ++d) src_block_at_[size_t(s)] += routing.send_count(s, d);
  }
  recv_rows_ = from_.back();
  const plan::CombineTable t = plan::make_combine_table(routing, rank);
  tokens_ = t.tokens;
  std::vector<int32_t> iota(size_t(std::max<int64_t>(recv_rows_, 1)));
  std::iota(iota.begin(), iota.end(), 0);
  std::vector<int32_t> rows = t.token_rows;
  std::vector<float> gate = t.gate;
  rows.push_back(0), gate.push_back(0.f);  // (never empty buffers)
  slot_of_out_ = to_device(iota), token_begin_ = to_device(t.token_begin), token_rows_ = to_device(rows);
  gate_ = to_device(gate);
}

void MoeCombineBaseline::exchange(const void* y, void* recv, int chunk, int chunks, cudaStream_t stream) const {
  auto range = [&](int64_t m) { return std::pair<int64_t, int64_t>{m * chunk / chunks, m * (chunk + 1) / chunks}; };
  // Spans in elements: this rank's rows of the chunk in each destination's
  // block; from each source, its chunk's rows of its block for this rank.
  std::vector<plan::Span> send_to, recv_from;
  const auto [r0, r1] = range(rows_);
  for (int d = 0; d < world_; ++d) {
    const int64_t lo = std::max(r0, block_of_[size_t(d)]), hi = std::min(r1, block_of_[size_t(d) + 1]);
    send_to.push_back({lo * n_, std::max<int64_t>(hi - lo, 0) * n_});
  }
  for (int s = 0; s < world_; ++s) {
    const auto [c0, c1] = range(routing_.rows(s));
    const int64_t b0 = src_block_at_[size_t(s)], b1 = b0 + routing_.send_count(s, rank_);
    const int64_t lo = std::max(c0, b0), hi = std::min(c1, b1);
    recv_from.push_back({(from_[size_t(s)] + lo - b0) * n_, std::max<int64_t>(hi - lo, 0) * n_});
  }
  // (this rank's own rows through NCCL too, as all_to_all_single moves them)
  send_recv_spans(y, recv, send_to, recv_from, dtype_, comm_, rank_, /*self_by_copy=*/false, stream,
                  "the MoE combine baseline's all-to-all (rank " + std::to_string(rank_) + ")");
}

void MoeCombineBaseline::all_to_all(const void* y, void* recv, cudaStream_t stream) const {
  exchange(y, recv, 0, 1, stream);
}

void MoeCombineBaseline::run(CublasGemm& cublas, const void* a, const void* b, int k, void* y, void* recv, void* out,
                             cudaStream_t stream, bool combine) {
  const int c_total = chunks();
  for (int c = 0; c < c_total; ++c) {
    const int64_t r0 = rows_ * c / c_total, r1 = rows_ * (c + 1) / c_total;
    if (r1 > r0)
      cublas.run(dtype_, static_cast<const char*>(a) + size_t(r0) * size_t(k) * 2, b,
                 static_cast<char*>(y) + size_t(r0) * size_t(n_) * 2, int(r1 - r0), int(n_), k, n_, stream);
    if (c_total == 1) {
      exchange(y, recv, 0, 1, stream);
    } else {
      exchange(y, recv, c, c_total, hand_over(c, stream));
    }
  }
  if (c_total > 1) join(stream);
  if (combine) this->combine(recv, out, stream);
}

void MoeCombineBaseline::combine(const void* recv, void* out, cudaStream_t stream) const {
  kernels::combine_slot_rows(dtype_, recv, int32_t(n_), slot_of_out_.as<int32_t>(), 1, token_begin_.as<int32_t>(),
                             token_rows_.as<int32_t>(), gate_.as<float>(), tokens_, int32_t(n_), out, n_, stream);
}

}  // namespace flashoverlap::rt
