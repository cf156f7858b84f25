// slot_map.h — where each tile row goes in the communication buffers, which
// element ranges each group's NCCL call covers, and how received rows go back
// to row-major output (docs/design.md §2.3). One structure for all three
// collectives; the builders are in slot_map_{allreduce,reducescatter,alltoall}.h.
//
// Buffers are arrays of SLOT ROWS, each exactly bn elements wide: one tile's
// row segment. Ragged right-edge tiles keep the full width (the GEMM stores
// zeros in columns >= N); rows >= M inside a ragged bottom tile are zeros too,
// or are not stored at all where row_of says -1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "plan/collective.h"
#include "plan/partition.h"
#include "plan/schedule.h"

namespace flashoverlap::plan {

// A contiguous range of a buffer, in elements.
struct Span {
  int64_t offset = 0, count = 0;
  int64_t end() const { return offset + count; }
  friend bool operator==(const Span&, const Span&) = default;
};

// The NCCL work of one group (all spans in elements of the slot buffers).
//   AllReduce:     ncclAllReduce(send, count = send.count), in place (recv == send).
//   ReduceScatter: ncclReduceScatter(sendbuff + send.offset, recvbuff + recv.offset,
//                  recvcount = recv.count); send.count == world * recv.count.
//   AllToAll:      in one ncclGroupStart/End, for each peer p: ncclSend(send_to[p])
//                  and ncclRecv(recv_from[p]) (zero counts may be skipped);
//                  send / recv are the unions of those per-peer spans.
struct GroupCall {
  int32_t first_tile = 0, end_tile = 0;
  Span send, recv;
  std::vector<Span> send_to, recv_from;  // AllToAll only, indexed by peer rank
};

// Where a received slot row goes: output row `row`, columns
// [col_block*bn, min((col_block+1)*bn, N)). row == -1: padding, not read.
struct SlotTarget {
  int32_t row = -1, col_block = 0;
  friend bool operator==(const SlotTarget&, const SlotTarget&) = default;
};

struct SlotMap {
  Collective op = Collective::AllReduce;
  int32_t world = 1, rank = 0;  // the map is for this rank (AllReduce: any rank)
  int32_t bm = 0, bn = 0, tiles_n = 0;
  int64_t n = 0;         // output columns (N)
  int64_t out_rows = 0;  // rows of this rank's row-major output (out_rows x N)
  bool in_place = false; // AllReduce: the receive buffer is the send buffer

  // Pre-communication reorder (the GEMM epilogue): row r of tile idx is stored
  // to send slot row row_of[idx*bm + r], or not stored when -1.
  std::vector<int32_t> row_of;
  int64_t send_rows = 0, recv_rows = 0;  // buffer sizes in slot rows
  std::vector<GroupCall> groups;

  // Post-communication reorder, both directions (each a bijection between the
  // data rows of the receive buffer and the output's (row, column block)s):
  std::vector<SlotTarget> target_of_slot;  // [recv_rows]
  std::vector<int32_t> slot_of_out;        // [out_rows * tiles_n]: recv slot row
  int64_t padding_rows = 0;  // send slot rows that carry no data (bytes sent for nothing)

  int32_t slot_row(int32_t idx, int32_t r) const { return row_of[size_t(idx) * bm + r]; }
  int64_t send_elements() const { return send_rows * bn; }
  int64_t recv_elements() const { return recv_rows * bn; }
};

// The builders' last step: throws InvalidArgument when a buffer has more slot
// rows than int32 row indices address (e.g. skewed All-to-All receivers), then
// fills slot_of_out from target_of_slot; throws Error if the targets are not
// a bijection onto out_rows x tiles_n.
void finish_slot_map(SlotMap& map);

// The same inverse as the per-slot tables of kernels::scatter_slot_rows:
// dst_row[s] (-1: skip) and dst_col[s] = first output column, per receive slot row.
struct ScatterTables {
  std::vector<int32_t> dst_row, dst_col;
};
ScatterTables scatter_tables(const SlotMap& map);

// Reference post-reorder (what the fused element-wise kernel does, minus the
// arithmetic): out (out_rows x N, row-major) gathered from the receive buffer.
template <class T>
void post_reorder(const SlotMap& map, const T* recv, T* out) {
  for (int64_t row = 0; row < map.out_rows; ++row)
    for (int32_t cb = 0; cb < map.tiles_n; ++cb) {
      const T* src = recv + int64_t{map.slot_of_out[size_t(row) * map.tiles_n + cb]} * map.bn;
      const int64_t c0 = int64_t{cb} * map.bn;
      const int64_t width = map.n - c0 < map.bn ? map.n - c0 : map.bn;
      for (int64_t c = 0; c < width; ++c) out[row * map.n + c0 + c] = src[c];
    }
}

// Visits the rows of group g's tiles in schedule order (tile idx, then row r),
// skipping rows >= M. bucket(global_row) returns the row's bucket in
// [0, starts.size()) or -1 to skip it; each visited row gets the next slot row
// of its bucket, starting at starts[bucket]: f(bucket, idx, tile, r, slot).
// Used by every destination-ordered layout (ReduceScatter standard, AllToAll).
template <class Bucket, class F>
void place_rows_by_bucket(const Schedule& s, const Group& g, Bucket bucket,
                          std::vector<int64_t> starts, F f) {
  for (int32_t idx = g.first_tile; idx < g.end_tile; ++idx) {
    const TileCoord t = s.tile_of(idx);
    const int32_t rows = s.rows_of(t);
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t b = bucket(t.tm * s.bm + r);
      if (b >= 0) f(b, idx, t, r, starts[size_t(b)]++);
    }
  }
}

// Per-tile counts (rows by destination, ...) summed over runs of waves in O(1):
// sum(w0, w1, b) = sum over the tiles of waves [w0, w1) of count(tile, b).
// The counts of a tile depend only on its tile row, as they do for row
// destinations: per_tile_row[tm * bins + b]. Used by the builders (group
// sizes) and by the planner (bytes of every candidate group).
class WaveCounts {
 public:
  WaveCounts(const Schedule& s, int32_t bins, const std::vector<int64_t>& per_tile_row);
  int64_t sum(int32_t w0, int32_t w1, int32_t bin) const {
    return prefix_[size_t(w1) * bins_ + bin] - prefix_[size_t(w0) * bins_ + bin];
  }
  int32_t bins() const { return bins_; }
  int32_t waves() const { return waves_; }

 private:
  int32_t bins_ = 0, waves_ = 0;
  std::vector<int64_t> prefix_;  // [(waves + 1) * bins]
};

// Where every 64-row half of every tile is one run of consecutive send slot
// rows (all its rows stored: none >= M), the slot row of each half's first
// row, [tiles * 2]: the GEMM then stores the halves by TMA
// (kernels::GemmParams::half_row). Empty otherwise, and for tiles of other
// than 128 rows. (The standard ReduceScatter layout where the ranks' rows
// split at multiples of 64; the sub-tile layout on 2 ranks.)
constexpr int32_t kStoreHalfRows = 64;
std::vector<int32_t> half_rows_of(const SlotMap& map);

// The empty map skeleton every builder starts from (shape fields, row_of all -1).
SlotMap slot_map_base(Collective op, const Schedule& s, int32_t world, int32_t rank);

}  // namespace flashoverlap::plan
