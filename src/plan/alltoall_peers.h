// alltoall_peers.h — the MoE combine's NVLink form (docs/design.md §11): no
// send slots and no collective; the GEMM stores each row of rank `rank`
// straight into its destination's receive rows, where the rows from every
// source lie in (source rank, source row) order, n wide: the order of the
// unweighted output and of the combine's tables (make_combine_table), so
// the receiver's post step reads them as they are.
#pragma once
#include <cstdint>

#include "plan/routing.h"
#include "plan/schedule.h"
#include "plan/slot_map_alltoall.h"

namespace flashoverlap::plan {

// The GEMM's row table for this form in the compact form of
// AllToAllTables (tm_of, sbase, dest, rrank: expand_row_of gives row_of),
// with every destination d's rows numbered from d * rows_per_rank: row i
// of `rank` with destination d goes to receive row
//   (rows every rank s < rank sends d) + (rows of `rank` before i with destination d)
// of d, encoded d * rows_per_rank + that. No groups, no slot rows;
// out_rows = the rows `rank` receives. The routing must be valid
// (validate_moe_routing); s is `rank`'s schedule (moe_schedule_rows: with
// several experts the grouped GEMM's, tm_of its virtual tile rows and
// a_row0 / rows_of set, so idle rows map to -1).
// Throws InvalidArgument when some rank receives more than rows_per_rank
// rows or world * rows_per_rank does not fit int32.
AllToAllTables make_alltoall_peer_tables(const Schedule& s, const MoeRouting& routing, int32_t rank,
                                         int64_t rows_per_rank);

}  // namespace flashoverlap::plan
