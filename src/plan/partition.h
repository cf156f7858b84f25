// partition.h — wave groups. A partition splits the T waves of a schedule into
// consecutive groups (a composition of T: positive sizes summing to T); each
// group is signalled and communicated as one unit (docs/design.md §2.2).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/schedule.h"

namespace flashoverlap::plan {

using Partition = std::vector<int32_t>;  // group sizes in waves

// Largest T for which all 2^(T-1) partitions may be enumerated.
inline constexpr int32_t kMaxEnumerableWaves = 20;

// Calls f for each of the 2^(T-1) partitions of T waves, in a fixed order
// (bit b of the counter set = a group boundary after wave b+1).
// Throws InvalidArgument when T < 1 or T > kMaxEnumerableWaves.
void for_each_partition(int32_t waves, const std::function<void(const Partition&)>& f);
std::vector<Partition> enumerate_partitions(int32_t waves);

// Throws InvalidArgument naming the problem: an empty partition, a
// non-positive entry (and where), or a sum other than `waves`.
void validate_partition(const Partition& p, int32_t waves);

// "1,2,2" -> {1,2,2}. Only the syntax is checked; use validate_partition too.
Partition parse_partition(std::string_view s);
std::string to_string(const Partition& p);  // "1,2,2"

// One group: waves [first_wave, end_wave) = tiles [first_tile, end_tile) in
// schedule order (the last wave may be partial).
struct Group {
  int32_t first_wave = 0, end_wave = 0;
  int32_t first_tile = 0, end_tile = 0;
  int32_t tiles() const { return end_tile - first_tile; }
  friend bool operator==(const Group&, const Group&) = default;
};

// Tiles covered by waves [first_wave, end_wave) of `s`.
Group group_spanning(const Schedule& s, int32_t first_wave, int32_t end_wave);

// The groups of a validated partition of s.waves().
std::vector<Group> make_groups(const Schedule& s, const Partition& p);

// Row bands: `swizzle` tile rows each, walked along N (the AllReduce's
// row-band and owner layouts).
int band_count(const Schedule& s);  // ceil(tiles_m / swizzle)
// Groups of whole bands: band_counts[g] bands in group g (they must cover
// every band). Throws InvalidArgument otherwise, or for a raster along M.
std::vector<Group> band_groups(const Schedule& s, const std::vector<int>& band_counts);

// Group index of each wave (the kernel's signal counter of a tile is
// group_of_wave[round_of(idx)]).
std::vector<int32_t> group_of_wave(const std::vector<Group>& groups);

// Throws InvalidArgument (after `who`) unless `groups` are consecutive
// non-empty tile ranges covering [0, tiles): what an overlapped op runs on.
void require_tile_groups(const std::vector<Group>& groups, int32_t tiles, const std::string& who);
// Group index of each of the `tiles` tiles (the runtime's group_of_tile);
// the tiles of group `sink` (tests' dropped group; -1: none) get index
// groups.size() instead, a counter nothing waits on.
std::vector<int32_t> group_of_tiles(const std::vector<Group>& groups, int32_t tiles, int32_t sink = -1);

}  // namespace flashoverlap::plan
