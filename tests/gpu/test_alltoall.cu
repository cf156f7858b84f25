// GPU tests of rt::OverlapAllToAll (runtime/ops/alltoall.h), the MoE combine:
//  - world 1 on NCCL: routings of one rank (make_moe_routing's, and ones
//    made by hand from them: several rows per token, tokens without rows,
//    gates of any sign), experts without rows, random plans (tile shapes,
//    grids, groups, the sequential fallback and its own grid), strided
//    outputs, several calls of other routings and partitions on one op
//    (built once for their largest sizes), two ops of other tiles taking
//    turns on one core (as the public op holds them): the received rows
//    bitwise our GEMM, the combine bitwise its definition on the host from that GEMM
//    (fma in fp32 in (source rank, source row) order, rounded once), each
//    received row's token, nothing written outside the output;
//  - W = 2, 3, 4, 8 ranks side by side on one GPU, each its own op, the
//    groups moved by hand (collected while the ranks enqueue their calls,
//    moved once all have, behind a gate on each rank's stream that holds
//    its post step until its rows are in): every kind of routing, top-k,
//    experts that get no rows, the maps of every rank's routing, the
//    GEMM's stores, the waits and the post steps at W > 1 without NCCL,
//    bitwise against the ranks' plain GEMMs;
//  - the NVLink form (rows stored straight into the ranks' windows, counted
//    there) at world 1 on NCCL, in turns with the slotted calls, and at W =
//    2, 3, 4, 8 side by side (the windows on one GPU), bitwise the same;
//  - a group that never completes times out (no hang) and says which, and
//    so do a rank's lost arrivals in the NVLink form;
//  - input the op refuses, and a call that works after the refusals.
#include <cuda_bf16.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ios>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "host_reference.h"
#include "kernels/alltoall_tables.h"
#include "kernels/check.h"
#include "kernels/flags.h"
#include "plan/routing.h"
#include "plan/slot_map_alltoall.h"
#include "plan/tile_grid.h"
#include "rank_harness.h"
#include "runtime/core/cublas.h"
#include "runtime/ops/alltoall.h"

using namespace flashoverlap;
using rt::DeviceBuffer;
constexpr kernels::DType kBf16 = kernels::DType::BF16;

namespace {

// Ranks side by side put 2 W + 1 streams at work at once (17 at W = 8), and
// a rank's stream waits on the device for work that later ranks enqueue:
// streams that share one of the device's hardware queues (8 unless told)
// hold that work behind the wait until it times out (on an H200 the
// side-by-side cases then stalled for minutes). 32 queues, set before CUDA
// starts, whatever the environment said.
[[maybe_unused]] const bool kQueues = [] { return setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1) == 0; }();

constexpr int64_t kNs[] = {256, 1000, 768};
constexpr int64_t kKs[] = {64, 256};

plan::TileShape random_tile(std::mt19937_64& rng) {
  return rng() % 2 ? plan::TileShape{128, 256} : plan::TileShape{128, 128};
}

// A random partition of `waves` (>= 2) into two groups or more.
plan::Partition at_least_two(int32_t waves, std::mt19937_64& rng) {
  plan::Partition p = test::random_partition(waves, rng);
  if (p.size() == 1) p = {1, waves - 1};
  return p;
}

// A grid of 1/2 to 1/(1 + parts) of the tiles of `rows` (two waves or more there).
int32_t ctas_for(int64_t rows, int64_t n, plan::TileShape tile, int parts, std::mt19937_64& rng) {
  const int64_t tiles = (std::max<int64_t>(rows, 1) + tile.bm - 1) / tile.bm * ((n + tile.bn - 1) / tile.bn);
  return int32_t(std::max<int64_t>(1, tiles / int64_t(2 + rng() % uint64_t(parts))));
}

std::string rows_of(const plan::MoeRouting& r) {
  std::string s;
  for (int32_t x = 0; x < r.world; ++x) s += (x ? "," : "") + std::to_string(r.rows(x));
  return s;
}

std::string describe(const rt::OverlapAllToAllOptions& o) {
  return "n " + std::to_string(o.n) + ", k " + std::to_string(o.k) + ", " + plan::to_string(o.tile) + " tiles, " +
         std::to_string(o.ctas) + " CTAs (sequential " + std::to_string(o.sequential_ctas ? o.sequential_ctas : o.ctas) +
         "), max rows " + std::to_string(o.max_rows) + ", received " + std::to_string(o.max_recv_rows) + ", tokens " +
         std::to_string(o.max_tokens);
}

std::string describe(const rt::A2aCall& c, int64_t ld) {
  return std::string(c.common.size() <= 1 ? "sequential (partition \"" + plan::to_string(c.common) + "\")"
                                          : "groups " + plan::to_string(c.common)) +
         (c.combine ? ", combine" : ", received rows") + ", ld_out " + std::to_string(ld);
}

// A routing of one rank: make_moe_routing's (one row per token, gate 1), or
// (`mixed`) the same rows sent to a random one of 1 .. rows + 40 tokens each
// (tokens of several rows, tokens of none), with random gates in [-1, 1).
plan::MoeRouting one_rank_routing(int64_t rows, bool mixed, std::mt19937_64& rng, std::string& name) {
  plan::MoeRouting r = plan::make_moe_routing("uniform", 1, rows, 1, rng());
  name = "uniform, world 1, " + std::to_string(rows) + " tokens";
  if (mixed) {
    const int32_t tokens = 1 + int32_t(rng() % uint64_t(rows + 40));
    r.tokens[0] = tokens;
    for (int32_t& t : r.dest_token[0]) t = int32_t(rng() % uint64_t(tokens));
    for (float& g : r.gate[0]) g = float(int64_t(rng() >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
    name = "world 1, " + std::to_string(rows) + " rows to random ones of " + std::to_string(tokens) +
           " tokens, random gates";
  }
  plan::validate_moe_routing(r);
  return r;
}

// A routing of `world` ranks as a dispatch makes them: every kind, top-1 to
// top-min(world, 4), 0 to 800 tokens a rank (often none or a few).
plan::MoeRouting random_routing(int32_t world, std::mt19937_64& rng, std::string& name, int32_t experts = 1) {
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:", "empty:"};
  std::string kind = kinds[rng() % (world > 1 ? 4 : 3)];
  int32_t most_k = std::min(world * experts, 4 + 2 * (experts > 1));
  if (kind == "one:") kind += std::to_string(rng() % uint64_t(world));
  if (kind == "empty:") kind += std::to_string(rng() % uint64_t(world)), most_k = std::min(most_k, (world - 1) * experts);
  const int32_t topk = 1 + int32_t(rng() % uint64_t(most_k));
  const uint64_t pick = rng() % 8;
  const int64_t tokens = pick == 0 ? 0 : pick == 1 ? 1 + int64_t(rng() % 3) : int64_t(rng() % 801);
  const uint64_t rs = rng();
  plan::MoeRouting r = plan::make_moe_routing(kind, world, tokens, topk, rs, experts);
  // A third of them (one expert per rank) with every rank's rows shuffled:
  // destinations not in blocks (the slots make them contiguous per group; no
  // direct sequential call). Several experts take the rows by (source, expert).
  const bool shuffled = experts == 1 && rng() % 3 == 0;
  if (shuffled)
    for (int32_t e = 0; e < world; ++e) {
      std::vector<size_t> perm(r.dest_rank[size_t(e)].size());
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      auto permute = [&](auto& v) {
        auto old = v;
        for (size_t i = 0; i < perm.size(); ++i) v[i] = old[perm[i]];
      };
      permute(r.dest_rank[size_t(e)]), permute(r.dest_token[size_t(e)]), permute(r.gate[size_t(e)]);
    }
  name = kind + (shuffled ? " (rows shuffled)" : "") + ", world " + std::to_string(world) +
         (experts > 1 ? ", " + std::to_string(experts) + " experts a rank" : "") + ", top-" +
         std::to_string(topk) + ", " + std::to_string(tokens) + " tokens a rank (rows " + rows_of(r) + ")";
  return r;
}

// What rank d's output is, by definition, from the ranks' GEMM results y[s]
// (routing.rows(s) x n each, on the host): the rows sent to d in (source
// rank, source row) order; the combine of each of d's tokens over its rows
// in that order, acc = fma(gate, row, acc) in fp32 from 0, rounded once (a
// token without rows: zeros); each received row's token.
struct Expected {
  std::vector<std::pair<int32_t, int32_t>> from;  // [received]: (source rank, source row)
  std::vector<uint16_t> rows;                     // [received x n]
  std::vector<int32_t> token;                     // [received]
  int32_t tokens = 0;
  std::vector<uint16_t> combined;                 // [tokens x n]
  int64_t received() const { return int64_t(from.size()); }
};

Expected expected_on(const plan::MoeRouting& r, int32_t d, const std::vector<std::vector<uint16_t>>& y, int64_t n) {
  Expected e;
  e.tokens = r.tokens[size_t(d)];
  std::vector<std::vector<int64_t>> rows_of_token(size_t(e.tokens));
  for (int32_t s = 0; s < r.world; ++s)
    for (int64_t i = 0; i < r.rows(s); ++i) {
      if (r.dest_rank[size_t(s)][size_t(i)] != d) continue;
      const int32_t t = r.dest_token[size_t(s)][size_t(i)];
      rows_of_token[size_t(t)].push_back(e.received());
      e.from.emplace_back(s, int32_t(i));
      e.token.push_back(t);
      e.rows.insert(e.rows.end(), y[size_t(s)].begin() + i * n, y[size_t(s)].begin() + (i + 1) * n);
    }
  e.combined.assign(size_t(e.tokens) * size_t(n), 0);
  std::vector<float> acc(static_cast<size_t>(n));
  for (int32_t t = 0; t < e.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j : rows_of_token[size_t(t)]) {
      const auto [s, i] = e.from[size_t(j)];
      const float g = r.gate[size_t(s)][size_t(i)];
      const uint16_t* row = e.rows.data() + j * n;
      for (int64_t c = 0; c < n; ++c) acc[size_t(c)] = std::fma(g, test::value_of(kBf16, row[c]), acc[size_t(c)]);
    }
    for (int64_t c = 0; c < n; ++c) e.combined[size_t(t * n + c)] = test::rounded(kBf16, acc[size_t(c)]);
  }
  return e;
}

// Bitwise on the host: the first `rows` rows of the device output p (ld
// elements apart, `cap` rows allocated, poisoned before the call) against
// want (rows x n); the columns [n, ld) and the row after the output (where
// there is one) must still hold the poison. name(i) says what output row i is.
::testing::AssertionResult same_rows(const void* p, int64_t ld, int64_t cap, const std::vector<uint16_t>& want,
                                     int64_t rows, int64_t n, cudaStream_t st,
                                     const std::function<std::string(int64_t)>& name) {
  const int64_t seen = std::min(rows + 1, cap);
  const std::vector<uint16_t> got = seen > 0 ? test::download(p, seen, ld, ld, st) : std::vector<uint16_t>{};
  int64_t bad = 0, first = -1, stray = 0, first_stray = -1;
  for (int64_t i = 0; i < seen; ++i)
    for (int64_t c = 0; c < ld; ++c) {
      const uint16_t x = got[size_t(i * ld + c)];
      if (i < rows && c < n) {
        if (x != want[size_t(i * n + c)]) {
          if (first < 0) first = i * n + c;
          ++bad;
        }
      } else if (x != 0xFFFF) {
        if (first_stray < 0) first_stray = i * ld + c;
        ++stray;
      }
    }
  if (bad == 0 && stray == 0) return ::testing::AssertionSuccess();
  ::testing::AssertionResult f = ::testing::AssertionFailure();
  if (bad) {
    const int64_t i = first / n, c = first % n;
    std::ostringstream os;
    os << std::hex << "0x" << got[size_t(i * ld + c)] << " vs 0x" << want[size_t(first)];
    f << bad << " of " << rows * n << " elements differ, first at output row " << i << " (" << name(i) << "), column "
      << c << ": " << os.str();
  }
  if (stray)
    f << (bad ? "; " : "") << stray << " elements written outside the " << rows << " x " << n
      << " output, first at row " << first_stray / ld << ", column " << first_stray % ld;
  return f;
}

// Each received row's token (device, `cap` entries, -1 before the call)
// against want; the entry after them (where there is one) still -1.
::testing::AssertionResult same_tokens(const int32_t* p, int64_t cap, const std::vector<int32_t>& want,
                                       cudaStream_t st) {
  const int64_t rows = int64_t(want.size()), seen = std::min(rows + 1, cap);
  std::vector<int32_t> got(size_t(std::max<int64_t>(seen, 0)));
  if (seen > 0) {
    FO_CUDA_CHECK(cudaMemcpyAsync(got.data(), p, got.size() * 4, cudaMemcpyDeviceToHost, st));
    FO_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < std::min(rows, seen); ++i)
    if (got[size_t(i)] != want[size_t(i)]) {
      if (first < 0) first = i;
      ++bad;
    }
  ::testing::AssertionResult f = ::testing::AssertionFailure();
  if (bad) f << bad << " of " << rows << " tokens differ, first at row " << first << ": " << got[size_t(first)] << " vs " << want[size_t(first)];
  if (seen > rows && got[size_t(rows)] != -1) f << (bad ? "; " : "") << "entry " << rows << " (past the rows) written: " << got[size_t(rows)];
  if (bad || (seen > rows && got[size_t(rows)] != -1)) return f;
  return ::testing::AssertionSuccess();
}

std::string row_from(const Expected& e, int64_t i) {
  if (i < 0 || i >= e.received()) return "?";
  return "rank " + std::to_string(e.from[size_t(i)].first) + "'s row " + std::to_string(e.from[size_t(i)].second);
}

}  // namespace

// One rank on NCCL: its rows come back to itself, Y = A B^T in row order.
// The device's expansion of the send side's row table equals the host's
// (plan::expand_row_of), with one expert per rank (plain tile rows) and with
// several (the grouped GEMM's tile rows: each real row once, a ragged tile
// row's idle rows -1), on fresh random routings.
TEST(AllToAllTables, DeviceExpansionEqualsTheHosts) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  static const char* kinds[] = {"uniform", "zipf:1.2", "one:0"};
  int grouped = 0, idle = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int32_t W = 1 + int32_t(rng() % 4), E = 1 + int32_t(rng() % 4);
    const int32_t K = 1 + int32_t(rng() % uint64_t(std::min(W * E, 8)));
    const plan::MoeRouting r = plan::make_moe_routing(kinds[trial % 3], W, 1 + int64_t(rng() % 400), K, rng(), E);
    const plan::TileShape tile = random_tile(rng);
    const int32_t ctas = 4 + int32_t(rng() % 60);
    const int64_t n = kNs[rng() % 3];  // (one N for every rank, as the op's)
    std::vector<plan::Schedule> scheds;
    int32_t most = 1;
    for (int32_t rank = 0; rank < W; ++rank) {
      scheds.push_back(plan::make_moe_schedule(r, rank, n, tile, ctas));
      most = std::max(most, scheds.back().waves());
    }
    std::vector<std::vector<plan::Group>> groups;
    for (const plan::Schedule& s : scheds) groups.push_back(plan::make_clipped_groups(s, {most}));
    for (int32_t rank = 0; rank < W; ++rank) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) + " rank " + std::to_string(rank));
      const plan::AllToAllTables t = plan::make_alltoall_tables(scheds, groups, r, rank);
      const std::vector<int32_t> host = plan::expand_row_of(t);
      if (host.empty()) continue;
      const DeviceBuffer tm_of = rt::to_device(t.tm_of), sbase = rt::to_device(t.sbase), dest = rt::to_device(t.dest),
                         rrank = rt::to_device(t.rrank), a_row0 = rt::to_device(t.a_row0),
                         rows_of = rt::to_device(t.rows_of), row_of(host.size() * 4);
      const bool g = !t.a_row0.empty();
      kernels::expand_row_of(tm_of.as<int32_t>(), sbase.as<int32_t>(), dest.as<int32_t>(), rrank.as<int32_t>(),
                             t.tiles(), t.bm, t.world, t.m, row_of.as<int32_t>(), st,
                             g ? a_row0.as<int32_t>() : nullptr, g ? rows_of.as<int32_t>() : nullptr);
      std::vector<int32_t> got(host.size());
      FO_CUDA_CHECK(cudaMemcpyAsync(got.data(), row_of.get(), got.size() * 4, cudaMemcpyDeviceToHost, st));
      FO_CUDA_CHECK(cudaStreamSynchronize(st));
      ASSERT_EQ(got, host);
      grouped += g;
      idle += g && std::count(host.begin(), host.end(), -1) > 0;
    }
  }
  EXPECT_GT(grouped, 0);
  EXPECT_GT(idle, 0);  // (ragged tile rows of several experts were expanded)
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(AllToAllOneGpu, EveryRoutingAndPlanMatchesOurGemm) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  test::on_each_rank(1, [&](int, ncclComm_t nccl) {
    cudaStream_t st;
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t max_t = 1500, max_n = 1000, max_k = 256, ld_max = max_n + 24, slack_max = 50;
    const int64_t cap = max_t + 40 + slack_max + 1;  // (output rows: received rows or tokens, and one past them)
    DeviceBuffer a(size_t(max_t) * max_k * 2), b(size_t(max_n) * max_k * 2), y(size_t(max_t) * max_n * 2),
        out(size_t(cap) * ld_max * 2), tokens(size_t(cap) * 4);
    int calls = 0, overlapped = 0, sequential = 0, combined = 0, mixed = 0, no_rows = 0, nvlinked = 0,
        by_cublas_calls = 0;
    rt::CublasGemm cublas;
    const int sms = rt::current_device_sms();  // the full grid: one CTA per SM
    for (int trial = 0; trial < 12; ++trial) {
      const int64_t n = kNs[rng() % 3], k = kKs[rng() % 2];
      const plan::TileShape tile = random_tile(rng);
      // The op's calls first: it is built once for their largest sizes.
      constexpr int kCalls = 4;
      std::vector<plan::MoeRouting> routings;
      std::vector<std::string> names;
      int64_t most_rows = 0, most_tokens = 0;
      for (int call = 0; call < kCalls; ++call) {
        const uint64_t pick = rng() % 8;
        const int64_t rows = pick == 0 ? 0 : pick == 1 ? 1 + int64_t(rng() % 4) : int64_t(rng() % uint64_t(max_t + 1));
        const bool mix = rng() % 2 == 0;
        std::string name;
        routings.push_back(one_rank_routing(rows, mix, rng, name));
        names.push_back(name);
        most_rows = std::max(most_rows, rows);
        most_tokens = std::max<int64_t>(most_tokens, routings.back().tokens[0]);
      }
      // The most rows first: the grid below gives that call two waves or more.
      for (int call = 1; call < kCalls; ++call)
        if (routings[size_t(call)].rows(0) > routings[0].rows(0))
          std::swap(routings[0], routings[size_t(call)]), std::swap(names[0], names[size_t(call)]);
      rt::OverlapAllToAllOptions base;
      base.n = n, base.k = int(k), base.tile = tile, base.comm = nccl;
      base.ctas = trial % 6 == 5 ? sms : ctas_for(most_rows, n, tile, 5, rng);
      base.sequential_ctas = trial % 3 == 0 ? sms : trial % 3 == 1 ? 0 : int32_t(1 + rng() % 64);
      base.nvlink = trial % 2 == 1;  // (its window mapped over the communicator of one rank)
      const int64_t slack = trial % 2 ? 0 : int64_t(rng() % uint64_t(slack_max + 1));  // (the sizes exactly, or more)
      base.max_rows = most_rows + slack, base.max_recv_rows = most_rows + slack;
      base.max_tokens = int32_t(most_tokens + slack);
      // Every third trial two ops on one core, as the public op holds them (one
      // per tile shape, sharing the stream and the scratch), taking turns.
      const bool shared = trial % 3 == 2;
      const std::unique_ptr<rt::OverlapCore> core = shared ? std::make_unique<rt::OverlapCore>() : nullptr;
      std::vector<rt::OverlapAllToAllOptions> opts{base};
      if (shared) {
        rt::OverlapAllToAllOptions other = base;
        other.tile = tile.bn == 256 ? plan::TileShape{128, 128} : plan::TileShape{128, 256};
        other.ctas = ctas_for(most_rows, n, other.tile, 5, rng);
        opts.push_back(other);
      }
      std::vector<std::unique_ptr<rt::OverlapAllToAll>> ops;
      for (rt::OverlapAllToAllOptions& x : opts) {
        x.core = core.get();
        ops.push_back(std::make_unique<rt::OverlapAllToAll>(x));
      }
      for (int call = 0; call < kCalls; ++call) {
        const size_t which = size_t(call) % ops.size();
        rt::OverlapAllToAll& op = *ops[which];
        const rt::OverlapAllToAllOptions& o = opts[which];
        const plan::MoeRouting& routing = routings[size_t(call)];
        const int64_t m = routing.rows(0);
        const int32_t waves = op.schedule_of(routing, 0, false).waves();
        rt::A2aCall c;
        c.routing = &routing;
        c.combine = (trial + call) % 2 == 0;
        // The last call one group (the sequential fallback), the others groups where there are two waves.
        if (call == kCalls - 1 || waves < 2) c.common = waves > 0 ? plan::Partition{waves} : plan::Partition{};
        else c.common = at_least_two(waves, rng);
        c.nvlink = o.nvlink && call % 2 == 1;  // (and the other calls of that op through the slots, in turns)
        // Sequential calls on rows by destination (direct) may take cuBLAS's GEMM: then it is the reference.
        c.cublas = !c.nvlink && c.common.size() <= 1 && rng() % 2 == 0;
        const bool by_cublas = c.cublas && n % 8 == 0 && std::is_sorted(routing.dest_rank[0].begin(),
                                                                         routing.dest_rank[0].end());
        const int64_t ld = call % 3 == 0 ? n : call % 3 == 1 ? n + 24 : n + 3;
        const bool with_tokens = rng() % 4 != 0;
        const std::string where = names[size_t(call)] + ", " + describe(o) +
                                  (shared ? ", op " + std::to_string(which) + " of 2 on one core" : "") + ", " +
                                  describe(c, ld) + ", trial " + std::to_string(trial) + " call " +
                                  std::to_string(call) + ", seed " + std::to_string(seed);
        const uint64_t sd = seed + 100 * uint64_t(trial) + uint64_t(call);
        if (m > 0) kernels::fill_random(kBf16, a.get(), m * k, sd, -1.f, 1.f, st);
        kernels::fill_random(kBf16, b.get(), n * k, sd + 1, -1.f, 1.f, st);
        if (m > 0 && by_cublas) {
          cublas.run(kBf16, a.get(), b.get(), y.get(), int(m), int(n), int(k), n, st);
        } else if (m > 0) {
          const plan::Schedule full = plan::make_schedule(m, n, {128, 256}, sms, plan::Raster::AlongN, 1);
          kernels::launch_gemm(kernels::plain_gemm(kBf16, a.get(), b.get(), full, int(k), y.get(), n), st);
        }
        kernels::poison(out.get(), cap * ld, st);
        FO_CUDA_CHECK(cudaMemsetAsync(tokens.get(), 0xff, tokens.bytes(), st));
        const std::vector<std::vector<uint16_t>> ys{m > 0 ? test::download(y.get(), m, n, n, st) : std::vector<uint16_t>{}};
        const Expected e = expected_on(routing, 0, ys, n);
        try {
          op.run(a.get(), b.get(), c, out.get(), ld, st, with_tokens ? tokens.as<int32_t>() : nullptr);
          FO_CUDA_CHECK(cudaStreamSynchronize(st));
          op.check();
        } catch (const std::exception& ex) {
          ADD_FAILURE() << where << ": " << ex.what();
          continue;
        }
        ++calls, combined += c.combine, nvlinked += c.nvlink;
        if (!c.nvlink) overlapped += !op.sequential(), sequential += op.sequential();
        mixed += names[size_t(call)].find("random") != std::string::npos, no_rows += m == 0;
        EXPECT_EQ(op.recv_rows(), m) << where;
        EXPECT_EQ(op.nvlink_call(), c.nvlink) << where;
        EXPECT_EQ(op.cublas_call(), by_cublas) << where;
        by_cublas_calls += by_cublas;
        if (c.nvlink) {
          EXPECT_EQ(op.groups(), 0u) << where;
        } else {
          EXPECT_EQ(op.sequential(), c.common.size() <= 1) << where;
          EXPECT_EQ(op.groups(), std::max<size_t>(c.common.size(), 1)) << where;
        }
        auto name = [&](int64_t i) { return row_from(e, i); };
        if (c.combine) {
          EXPECT_TRUE(same_rows(out.get(), ld, cap, e.combined, e.tokens, n, st,
                                [](int64_t t) { return "token " + std::to_string(t); }))
              << where;
        } else {
          if (m > 0)  // (our GEMM's C on the device, as the other ops' tests compare)
            EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), ld, y.get(), n, m, n, st))) << where;
          EXPECT_TRUE(same_rows(out.get(), ld, cap, e.rows, m, n, st, name)) << where;
        }
        if (with_tokens) EXPECT_TRUE(same_tokens(tokens.as<int32_t>(), cap, e.token, st)) << where;
      }
    }
    EXPECT_EQ(calls, 12 * 4) << "seed " << seed;
    EXPECT_GE(overlapped, 6) << "seed " << seed;
    EXPECT_GE(sequential, 6) << "seed " << seed;
    EXPECT_GE(nvlinked, 6) << "seed " << seed;
    std::fprintf(stderr,
                 "%d calls: %d overlapped, %d sequential (%d by cuBLAS), %d NVLink form, %d combines, %d of mixed "
                 "routings, %d without rows\n",
                 calls, overlapped, sequential, by_cublas_calls, nvlinked, combined, mixed, no_rows);
    FO_CUDA_CHECK(cudaStreamDestroy(st));
  });
}

namespace {

// Sets gates[0 .. count) to `value` once everything before it on its stream is done.
__global__ void set_gates_kernel(uint32_t* gates, int32_t count, uint32_t value) {
  __threadfence();
  for (int32_t i = 0; i < count; ++i) atomicExch(gates + i, value);
}

// W ranks' ops on one GPU, each with its own core and the hand transport.
// The ranks' calls are enqueued one after another, so rank r's transport
// cannot move rows of a rank that has not run yet. It collects the group's
// call instead, marks where the group stands on the rank's stream (an
// event: after the op's own wait for the group's tiles, or after the GEMM
// in the sequential call), and holds the stream there on a gate (a bounded
// wait on a counter of the harness's). Once every rank has run, the moves
// go on the harness's stream, group by group: after every rank's event of
// the group (and, overlapped, a wait on each source's counter with its
// target, recorded in the destination's record), each source's span for d
// of its send buffer into d's span for it of d's receive buffer, then d's
// gate of the group opens (its post step then reads what came).
class RanksOnOneGpu {
 public:
  static constexpr int kMaxGroups = 64;

  RanksOnOneGpu(int world, const rt::OverlapAllToAllOptions& base, int drop_rank = -1, int drop_group = -1,
                double gate_timeout_s = 20)
      : world_(world),
        gate_timeout_ns_(uint64_t(gate_timeout_s * 1e9)),
        gates_(size_t(world) * kMaxGroups * 4),
        pending_(size_t(world) * kMaxGroups),
        ready_(size_t(world) * kMaxGroups, nullptr) {
    cudaFuncAttributes fa{};  // (the harness's kernel loaded before any wait spins: lazy loading would stall them)
    FO_CUDA_CHECK(cudaFuncGetAttributes(&fa, set_gates_kernel));
    FO_CUDA_CHECK(cudaMemset(gates_.get(), 0, gates_.bytes()));
    FO_CUDA_CHECK(cudaStreamCreateWithFlags(&mover_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : ready_) FO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int r = 0; r < world; ++r) {
      rt::OverlapAllToAllOptions o = base;
      o.comm = nullptr, o.tail_comm = nullptr, o.core = nullptr, o.rank = r, o.world = world;
      if (r == drop_rank) o.testing.fault_drop_group = drop_group;
      o.transport = [this, r](const rt::A2aGroupCall& c) { collect(r, c); };
      ops_.push_back(std::make_unique<rt::OverlapAllToAll>(o));
      cudaStream_t st;
      FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      streams_.push_back(st);
    }
    FO_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~RanksOnOneGpu() {
    cudaStreamSynchronize(mover_);
    ops_.clear();  // (each waits for its last call)
    for (cudaStream_t st : streams_) cudaStreamDestroy(st);
    for (cudaEvent_t e : ready_)
      if (e) cudaEventDestroy(e);
    if (mover_) cudaStreamDestroy(mover_);
  }
  RanksOnOneGpu(const RanksOnOneGpu&) = delete;
  RanksOnOneGpu& operator=(const RanksOnOneGpu&) = delete;

  rt::OverlapAllToAll& op(int r) { return *ops_[size_t(r)]; }

  // Every rank's call (rank r: a[r], b[r] into out[r], its own stream), in
  // rank order, then the moves. Returns what the moves found wrong ("": nothing).
  std::string run(const std::vector<const void*>& a, const std::vector<const void*>& b, const rt::A2aCall& call,
                  const std::vector<void*>& out, int64_t ld_out, const std::vector<int32_t*>& tokens_out) {
    ++epoch_;
    for (Pending& p : pending_) p.called = false;
    try {
      for (int r = 0; r < world_; ++r)
        ops_[size_t(r)]->run(a[size_t(r)], b[size_t(r)], call, out[size_t(r)], ld_out, streams_[size_t(r)],
                             tokens_out[size_t(r)]);
    } catch (...) {
      release_all();  // (the ranks that ran go on, moving nothing)
      throw;
    }
    return move_all();
  }

 private:
  struct Pending {
    bool called = false;
    int32_t group = 0;
    const char* send = nullptr;
    char* recv = nullptr;
    std::vector<plan::Span> send_to, recv_from;
  };
  size_t index(int r, size_t g) const { return size_t(r) * kMaxGroups + g; }
  uint32_t* gate(int r, size_t g) const { return gates_.as<uint32_t>() + index(r, g); }

  void collect(int r, const rt::A2aGroupCall& c) {
    const size_t g = size_t(std::max(c.group, 0));
    if (g >= size_t(kMaxGroups))
      throw Error("the one-GPU harness moves at most " + std::to_string(kMaxGroups) + " groups (group " +
                  std::to_string(c.group) + ")");
    Pending& p = pending_[index(r, g)];
    p.called = true, p.group = c.group;
    p.send = static_cast<const char*>(c.send), p.recv = static_cast<char*>(c.recv);
    p.send_to = *c.send_to, p.recv_from = *c.recv_from;
    FO_CUDA_CHECK(cudaEventRecord(ready_[index(r, g)], c.stream));
    kernels::launch_wait_counter(gate(r, g), epoch_, gate_timeout_ns_, ops_[size_t(r)]->wait_error(), c.group,
                                 c.stream);
  }

  void release_all() {
    set_gates_kernel<<<1, 1, 0, mover_>>>(gates_.as<uint32_t>(), world_ * kMaxGroups, epoch_);
    FO_CUDA_CHECK(cudaGetLastError());
  }

  std::string move_all() {
    std::ostringstream bad;
    const size_t groups = ops_[0]->groups();
    for (int r = 0; r < world_; ++r)
      if (ops_[size_t(r)]->groups() != groups)
        bad << "rank " << r << " has " << ops_[size_t(r)]->groups() << " groups, rank 0 " << groups << "; ";
    if (groups > size_t(kMaxGroups)) {
      bad << groups << " groups, more than the harness moves; ";
      release_all();
      return bad.str();
    }
    for (size_t g = 0; g < groups; ++g) {
      for (int s = 0; s < world_; ++s) {
        const Pending& p = pending_[index(s, g)];
        if (!p.called) {
          bad << "rank " << s << " did not move group " << g << "; ";
          continue;
        }
        if (p.group != pending_[index(0, g)].group)
          bad << "rank " << s << " moved group " << g << " as " << p.group << ", rank 0 as "
              << pending_[index(0, g)].group << "; ";
        FO_CUDA_CHECK(cudaStreamWaitEvent(mover_, ready_[index(s, g)], 0));
      }
      for (int d = 0; d < world_; ++d) {
        const Pending& to = pending_[index(d, g)];
        for (int s = 0; s < world_; ++s) {
          const Pending& from = pending_[index(s, g)];
          if (!to.called || !from.called) continue;
          if (from.send_to.size() != size_t(world_) || to.recv_from.size() != size_t(world_)) {
            bad << "group " << g << ": " << from.send_to.size() << " send spans on rank " << s << ", "
                << to.recv_from.size() << " receive spans on rank " << d << "; ";
            continue;
          }
          const plan::Span& out = from.send_to[size_t(d)];
          const plan::Span& in = to.recv_from[size_t(s)];
          if (out.count != in.count)
            bad << "group " << g << ": rank " << s << " sends rank " << d << " " << out.count
                << " elements, which expects " << in.count << "; ";
          if (out.offset < 0 || out.count < 0 || out.end() > ops_[size_t(s)]->send_elements() ||
              in.offset < 0 || in.count < 0 || in.end() > ops_[size_t(d)]->recv_elements()) {
            bad << "group " << g << ": span [" << out.offset << ", " << out.end() << ") of rank " << s
                << "'s send buffer (" << ops_[size_t(s)]->send_elements() << " elements) or [" << in.offset
                << ", " << in.end() << ") of rank " << d << "'s receive buffer ("
                << ops_[size_t(d)]->recv_elements() << ") out of range; ";
            continue;
          }
          if (from.group >= 0)  // (the sequential call has no counters: its event follows the GEMM)
            kernels::launch_wait_counter(ops_[size_t(s)]->counter(g), ops_[size_t(s)]->counter_target(g),
                                         ops_[size_t(s)]->timeout_ns(), ops_[size_t(d)]->wait_error(), int32_t(g),
                                         mover_);
          const int64_t count = std::min(out.count, in.count);
          if (count > 0)
            FO_CUDA_CHECK(cudaMemcpyAsync(to.recv + in.offset * 2, from.send + out.offset * 2, size_t(count) * 2,
                                          cudaMemcpyDeviceToDevice, mover_));
        }
        set_gates_kernel<<<1, 1, 0, mover_>>>(gate(d, g), 1, epoch_);
        FO_CUDA_CHECK(cudaGetLastError());
      }
    }
    return bad.str();
  }

  int world_;
  uint64_t gate_timeout_ns_;
  DeviceBuffer gates_;                // [world][kMaxGroups]: each reaches the epoch once its rows are in
  std::vector<Pending> pending_;      // [world][kMaxGroups]: this epoch's calls
  std::vector<cudaEvent_t> ready_;    // [world][kMaxGroups]
  uint32_t epoch_ = 0;
  cudaStream_t mover_ = nullptr;
  std::vector<std::unique_ptr<rt::OverlapAllToAll>> ops_;
  std::vector<cudaStream_t> streams_;
};

// A test's calls of random routings on W ranks (random_routing), and the
// sizes an op must be built for (the most of any call and rank).
struct RandomCalls {
  std::vector<plan::MoeRouting> routings;
  std::vector<std::string> names;
  int64_t most_rows = 0, most_recv = 0, most_tokens = 0;
  RandomCalls(int world, int count, std::mt19937_64& rng, int32_t experts = 1) {
    for (int call = 0; call < count; ++call) {
      std::string name;
      routings.push_back(random_routing(world, rng, name, experts));
      names.push_back(name);
      const plan::MoeRouting& r = routings.back();
      for (int32_t d = 0; d < world; ++d) {
        int64_t recv = 0;
        for (int32_t s = 0; s < world; ++s) recv += r.send_count(s, d);
        most_rows = std::max(most_rows, r.rows(d)), most_recv = std::max(most_recv, recv);
        most_tokens = std::max<int64_t>(most_tokens, r.tokens[size_t(d)]);
      }
    }
  }
  // An op's options for these calls (the same on every rank): n, k, tile,
  // a grid for W GEMMs sharing one GPU's SMs, the sizes, a 20 s bound.
  rt::OverlapAllToAllOptions options(int64_t n, int64_t k, plan::TileShape tile, std::mt19937_64& rng) const {
    rt::OverlapAllToAllOptions o;
    o.n = n, o.k = int(k), o.tile = tile;
    o.ctas = ctas_for(most_rows, n, tile, 4, rng);
    o.max_rows = most_rows, o.max_recv_rows = most_recv, o.max_tokens = int32_t(most_tokens);
    o.wait_timeout_s = 20;
    return o;
  }
};

// Every rank's buffers in the side-by-side tests: per call its fresh inputs
// and its plain GEMM of each segment (one expert's rows: the reference of
// what it sends), poisoned outputs, and the check of its output against the
// definition.
struct RankData {
  int world;
  int32_t experts;
  int64_t n, k, cap;  // cap: output rows (received rows or tokens) and one past them
  std::vector<DeviceBuffer> a, b, y, out, tok;
  std::vector<const void*> pa, pb;
  std::vector<void*> pout;
  std::vector<int32_t*> ptok;
  std::vector<std::vector<uint16_t>> ys;
  RankData(int w, int64_t n_, int64_t k_, const RandomCalls& c)
      : world(w), experts(c.routings.empty() ? 1 : c.routings[0].experts), n(n_), k(k_),
        cap(std::max(c.most_recv, c.most_tokens) + 1) {
    const size_t rows = size_t(std::max<int64_t>(c.most_rows, 1));
    for (int r = 0; r < world; ++r) {
      a.emplace_back(rows * k * 2), b.emplace_back(size_t(experts) * n * k * 2), y.emplace_back(rows * n * 2);
      out.emplace_back(size_t(cap) * (n + 24) * 2), tok.emplace_back(size_t(cap) * 4);
    }
  }
  // Rank r's inputs from seed sd + r * 100003; tokens_out on ranks with (r + call) % 3 != 0.
  void prepare(const plan::MoeRouting& routing, int64_t ld, uint64_t sd, int call, cudaStream_t st) {
    pa.clear(), pb.clear(), pout.clear(), ptok.clear(), ys.clear();
    const int sms = rt::current_device_sms();  // the references' grid: one CTA per SM
    for (int r = 0; r < world; ++r) {
      const int64_t m = routing.rows(r);
      const uint64_t rs = sd + uint64_t(r) * 100003;
      if (m > 0) kernels::fill_random(kBf16, a[size_t(r)].get(), m * k, rs, -1.f, 1.f, st);
      kernels::fill_random(kBf16, b[size_t(r)].get(), experts * n * k, rs + 5, -1.f, 1.f, st);
      for (const plan::RowSegment& seg : plan::moe_segments(routing, r)) {  // (one expert: every row at once)
        const plan::Schedule full = plan::make_schedule(seg.rows, n, {128, 256}, sms, plan::Raster::AlongN, 1);
        kernels::launch_gemm(kernels::plain_gemm(kBf16, a[size_t(r)].as<char>() + seg.a_row0 * k * 2,
                                                 b[size_t(r)].as<char>() + int64_t{seg.expert} * n * k * 2, full,
                                                 int(k), y[size_t(r)].as<char>() + seg.a_row0 * n * 2, n),
                             st);
      }
      kernels::poison(out[size_t(r)].get(), cap * ld, st);
      FO_CUDA_CHECK(cudaMemsetAsync(tok[size_t(r)].get(), 0xff, tok[size_t(r)].bytes(), st));
      pa.push_back(a[size_t(r)].get()), pb.push_back(b[size_t(r)].get()), pout.push_back(out[size_t(r)].get());
      ptok.push_back((r + call) % 3 ? tok[size_t(r)].as<int32_t>() : nullptr);
    }
    for (int r = 0; r < world; ++r)
      ys.push_back(routing.rows(r) > 0 ? test::download(y[size_t(r)].get(), routing.rows(r), n, n, st)
                                       : std::vector<uint16_t>{});
    FO_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  // Rank r's output (and tokens) against the definition from the ranks' GEMMs.
  void check(const plan::MoeRouting& routing, int r, const rt::OverlapAllToAll& op, bool combine, int64_t ld,
             const std::string& at, cudaStream_t st) const {
    const Expected e = expected_on(routing, r, ys, n);
    EXPECT_EQ(op.recv_rows(), e.received()) << at;
    if (combine)
      EXPECT_TRUE(same_rows(pout[size_t(r)], ld, cap, e.combined, e.tokens, n, st,
                            [](int64_t t) { return "token " + std::to_string(t); }))
          << at;
    else
      EXPECT_TRUE(
          same_rows(pout[size_t(r)], ld, cap, e.rows, e.received(), n, st, [&](int64_t i) { return row_from(e, i); }))
          << at;
    if (ptok[size_t(r)]) EXPECT_TRUE(same_tokens(ptok[size_t(r)], cap, e.token, st)) << at;
  }
};

// `trials` trials of 3 calls of random routings on W ranks side by side (W
// = worlds[trial % size], `experts` per rank), the ops built once per trial
// for its calls; every rank's output and tokens checked against the
// definition from its plain GEMMs. Counts what ran.
struct SideBySide {
  int calls = 0, combined = 0, overlapped = 0, sequential = 0, direct = 0, idle = 0;
  void run(const std::vector<int>& worlds, int trials, const std::function<int32_t(std::mt19937_64&)>& experts_of,
           uint64_t seed, std::mt19937_64& rng, cudaStream_t st) {
    for (int trial = 0; trial < trials; ++trial) {
      const int world = worlds[size_t(trial) % worlds.size()];
      const int32_t experts = experts_of(rng);
      const int64_t n = kNs[rng() % 3], k = kKs[rng() % 2];
      const plan::TileShape tile = random_tile(rng);
      // The calls' routings first: the ops are built once for their largest sizes.
      constexpr int kCalls = 3;
      const RandomCalls calls_of(world, kCalls, rng, experts);
      rt::OverlapAllToAllOptions o = calls_of.options(n, k, tile, rng);
      o.experts = experts, o.sequential_ctas = rng() % 2 ? 0 : rt::current_device_sms();
      RanksOnOneGpu ranks(world, o);
      RankData data(world, n, k, calls_of);
      for (int call = 0; call < kCalls; ++call) {
        const plan::MoeRouting& routing = calls_of.routings[size_t(call)];
        int32_t most_waves = 0;
        for (int32_t r = 0; r < world; ++r)
          most_waves = std::max(most_waves, ranks.op(0).schedule_of(routing, r, false).waves());
        rt::A2aCall c;
        c.routing = &routing;
        c.combine = call != 1;
        if (most_waves < 2 || (call == 2 && trial % 2 == 0))  // (one group: the sequential fallback)
          c.common = most_waves > 0 ? plan::Partition{most_waves} : plan::Partition{};
        else
          c.common = at_least_two(most_waves, rng);
        const int64_t ld = call == 0 ? n : rng() % 2 ? n + 24 : n + 3;
        const std::string where = calls_of.names[size_t(call)] + ", " + describe(o) + ", " + describe(c, ld) +
                                  ", trial " + std::to_string(trial) + " call " + std::to_string(call) + ", seed " +
                                  std::to_string(seed);
        data.prepare(routing, ld, seed + 1000 * uint64_t(trial) + 10 * uint64_t(call), call, st);
        std::string moved;
        try {
          moved = ranks.run(data.pa, data.pb, c, data.pout, ld, data.ptok);
          FO_CUDA_CHECK(cudaDeviceSynchronize());
        } catch (const std::exception& ex) {
          ADD_FAILURE() << where << ": " << ex.what();
          FO_CUDA_CHECK(cudaDeviceSynchronize());
          continue;
        }
        EXPECT_EQ(moved, "") << where;
        ++calls, combined += c.combine;
        for (int r = 0; r < world; ++r) {
          const std::string at = where + ", rank " + std::to_string(r);
          rt::OverlapAllToAll& op = ranks.op(r);
          try {
            op.check();
          } catch (const std::exception& ex) {
            ADD_FAILURE() << at << ": " << ex.what();
            continue;
          }
          overlapped += !op.sequential(), sequential += op.sequential(), direct += op.direct();
          idle += routing.rows(r) == 0;
          EXPECT_EQ(op.sequential(), c.common.size() <= 1) << at;
          EXPECT_EQ(op.groups(), std::max<size_t>(c.common.size(), 1)) << at;
          data.check(routing, r, op, c.combine, ld, at, st);
        }
      }
    }
    std::fprintf(stderr, "%d calls (%d combines): %d rank calls overlapped, %d sequential (%d direct), %d of ranks "
                 "without rows\n", calls, combined, overlapped, sequential, direct, idle);
  }
};

}  // namespace

TEST(AllToAllRanksOnOneGpu, MatchesTheSumOfTheRanksPlainGemmsBitwise) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  SideBySide ran;
  ran.run({2, 3, 4, 8}, 16, [](std::mt19937_64&) { return 1; }, seed, rng, st);
  EXPECT_EQ(ran.calls, 16 * 3) << "seed " << seed;
  EXPECT_GT(ran.overlapped, 0) << "seed " << seed;
  EXPECT_GT(ran.sequential, 0) << "seed " << seed;
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

// Several experts per rank: each rank's rows by (source rank, expert), the
// grouped GEMM over the segments on every path but NVLink (sequential,
// direct and slotted, and groups beside the GEMM), each rank's output
// bitwise what our plain GEMM of each segment gives, moved by hand and
// combined; ragged cases (experts or ranks without rows, all to one rank,
// several rows of one token from one rank) among the random routings.
TEST(AllToAllRanksOnOneGpu, SeveralExpertsMatchEachSegmentsPlainGemmBitwise) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  SideBySide ran;
  ran.run({2, 3, 4}, 12, [](std::mt19937_64& g) { return 2 + int32_t(g() % 3); }, seed, rng, st);
  EXPECT_EQ(ran.calls, 12 * 3) << "seed " << seed;
  EXPECT_GT(ran.overlapped, 0) << "seed " << seed;
  EXPECT_GT(ran.direct, 0) << "seed " << seed;
  // A routing of another expert count is refused (the NVLink form's experts: AllToAllNvlinkOnOneGpu).
  rt::OverlapAllToAllOptions o;
  o.n = 256, o.k = 64, o.experts = 2, o.max_rows = 64, o.max_recv_rows = 64, o.max_tokens = 64;
  RanksOnOneGpu ranks(2, o);
  const plan::MoeRouting one = plan::make_moe_routing("uniform", 2, 8, 1, 3);
  rt::A2aCall c;
  c.routing = &one;
  EXPECT_THROW(ranks.op(0).run(nullptr, nullptr, c, nullptr, 256, st), InvalidArgument);
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

// A group whose signals never come (rank 1's group 1): the rank's wait for
// it times out (no hang: the harness's waits are bounded too), and check()
// names the group, on that rank and on the rank that waited for its rows.
TEST(AllToAllRanksOnOneGpu, AStuckGroupTimesOutAndSaysWhich) {
  REQUIRE_HOPPER();
  const int64_t n = 512, k = 64, rows = 1024;
  // Every token to both ranks: 1024 rows on each, 1024 received, 512 tokens.
  const plan::MoeRouting routing = plan::make_moe_routing("uniform", 2, rows / 2, 2, 7);
  ASSERT_EQ(routing.rows(0), rows);
  ASSERT_EQ(routing.rows(1), rows);
  rt::OverlapAllToAllOptions o;
  o.n = n, o.k = int(k), o.tile = {128, 128}, o.ctas = 8;
  o.max_rows = rows, o.max_recv_rows = rows, o.max_tokens = int32_t(rows / 2);
  o.wait_timeout_s = 0.5;
  RanksOnOneGpu ranks(2, o, /*drop_rank=*/1, /*drop_group=*/1, /*gate_timeout_s=*/10);
  const int32_t waves = ranks.op(0).schedule_of(rows, false).waves();  // 8 x 4 tiles on 8 CTAs: 4
  ASSERT_GE(waves, 3);
  rt::A2aCall call;
  call.routing = &routing, call.common = {1, 1, waves - 2}, call.combine = true;
  DeviceBuffer a(size_t(rows) * k * 2), b(size_t(n) * k * 2), out0(size_t(rows) * n * 2), out1(size_t(rows) * n * 2);
  kernels::fill_random(kBf16, a.get(), rows * k, 1, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 2, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < 2; ++r) EXPECT_NO_THROW(ranks.op(r).check());
  const std::string moved =
      ranks.run({a.get(), a.get()}, {b.get(), b.get()}, call, {out0.get(), out1.get()}, n, {nullptr, nullptr});
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(moved, "");
  EXPECT_EQ(ranks.op(1).groups(), 3u);
  EXPECT_FALSE(ranks.op(1).sequential());
  test::expect_every_check_reports(
      2, [&](int r) { ranks.op(r).check(); }, {"group 1 ", "did not complete within"}, "the stuck group");
}

namespace {

// W ranks' ops in the NVLink form side by side on one GPU (rank_harness.h),
// and their calls, one after another on their own streams.
using NvlinkRanks = test::NvlinkRanks<rt::OverlapAllToAll, rt::OverlapAllToAllOptions>;
void run_ranks(NvlinkRanks& ranks, const std::vector<const void*>& a, const std::vector<const void*>& b,
               const rt::A2aCall& call, const std::vector<void*>& out, int64_t ld_out,
               const std::vector<int32_t*>& tokens_out) {
  for (size_t r = 0; r < ranks.ops.size(); ++r)
    ranks.ops[r]->run(a[r], b[r], call, out[r], ld_out, ranks.streams[r], tokens_out[r]);
}

// The NVLink form at W = 2, 3, 4, 8 on one GPU, `experts_of` experts per
// rank in each trial: every kind of routing (rows in the dispatch's order
// or shuffled with one expert; by (source, expert) with several), ranks and
// experts without rows, several calls on one set of ops (the window's halves
// in turn, the counters' running totals), combined or not, strided outputs:
// bitwise the ranks' plain GEMMs of each segment routed and combined on the
// host.
void nvlink_forms_match(const std::function<int32_t(std::mt19937_64&)>& experts_of) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  static const int kWorlds[] = {2, 3, 4, 8};
  int calls = 0, idle = 0, combined = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int world = kWorlds[trial % 4];
    const int64_t n = kNs[rng() % 3], k = kKs[rng() % 2];
    const plan::TileShape tile = random_tile(rng);
    const int32_t experts = experts_of(rng);
    constexpr int kCalls = 5;
    const RandomCalls calls_of(world, kCalls, rng, experts);
    rt::OverlapAllToAllOptions o = calls_of.options(n, k, tile, rng);
    o.experts = experts;
    // (the NVLink form's grid, up to one CTA per SM; W of them share the GPU)
    o.sequential_ctas = int32_t(1 + rng() % uint64_t(rt::current_device_sms()));
    NvlinkRanks ranks(world, o);
    RankData data(world, n, k, calls_of);
    for (int call = 0; call < kCalls; ++call) {
      const plan::MoeRouting& routing = calls_of.routings[size_t(call)];
      rt::A2aCall c;
      c.routing = &routing, c.nvlink = true, c.combine = (call + trial) % 3 != 0;
      const int64_t ld = call == 0 ? n : rng() % 2 ? n + 24 : n + 3;
      const std::string where = calls_of.names[size_t(call)] + ", " + describe(o) + ", NVLink form, " +
                                std::to_string(experts) + " experts a rank, combine " +
                                std::to_string(c.combine) + ", ld " + std::to_string(ld) + ", trial " +
                                std::to_string(trial) + " call " + std::to_string(call) + ", seed " +
                                std::to_string(seed);
      data.prepare(routing, ld, seed + 1000 * uint64_t(trial) + 10 * uint64_t(call), call, st);
      try {
        run_ranks(ranks, data.pa, data.pb, c, data.pout, ld, data.ptok);
        FO_CUDA_CHECK(cudaDeviceSynchronize());
      } catch (const std::exception& ex) {
        ADD_FAILURE() << where << ": " << ex.what();
        FO_CUDA_CHECK(cudaDeviceSynchronize());
        break;  // (the ops' running totals are out of step after a refused call)
      }
      ++calls, combined += c.combine;
      for (int r = 0; r < world; ++r) {
        const std::string at = where + ", rank " + std::to_string(r);
        rt::OverlapAllToAll& op = *ranks.ops[size_t(r)];
        try {
          op.check();
        } catch (const std::exception& ex) {
          ADD_FAILURE() << at << ": " << ex.what();
          continue;
        }
        idle += routing.rows(r) == 0;
        EXPECT_TRUE(op.nvlink_call()) << at;
        EXPECT_EQ(op.groups(), 0u) << at;
        data.check(routing, r, op, c.combine, ld, at, st);
      }
    }
  }
  EXPECT_EQ(calls, 12 * 5) << "seed " << seed;
  std::fprintf(stderr, "NVLink form: %d calls (%d combines), %d rank calls without rows\n", calls, combined, idle);
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace

TEST(AllToAllNvlinkOnOneGpu, MatchesTheRanksPlainGemmsBitwise) {
  REQUIRE_HOPPER();
  nvlink_forms_match([](std::mt19937_64&) { return 1; });
}

// Several experts per rank: each rank's grouped GEMM, its tiles (and so the
// arrivals its receivers wait for) a tile row per (source, expert) segment.
TEST(AllToAllNvlinkOnOneGpu, SeveralExpertsMatchEachSegmentsPlainGemmBitwise) {
  REQUIRE_HOPPER();
  nvlink_forms_match([](std::mt19937_64& g) { return 2 + int32_t(g() % 3); });
}

// A rank whose counts never arrive (rank 1's, to every rank): every
// receiver's wait times out (no hang) and check() names rank 1.
TEST(AllToAllNvlinkOnOneGpu, LostArrivalsTimeOutAndSayWhose) {
  REQUIRE_HOPPER();
  const int64_t n = 512, k = 64, rows = 1024;
  const plan::MoeRouting routing = plan::make_moe_routing("uniform", 3, rows / 2, 2, 11);
  rt::OverlapAllToAllOptions o;
  o.n = n, o.k = int(k), o.tile = {128, 128}, o.ctas = 8, o.sequential_ctas = 16;
  o.max_rows = 2 * rows, o.max_recv_rows = 2 * rows, o.max_tokens = int32_t(rows);
  o.wait_timeout_s = 0.5;
  NvlinkRanks ranks(3, o, [](rt::OverlapAllToAllOptions& x, int r) { x.testing.fault_drop_arrivals = r == 1; });
  DeviceBuffer a(size_t(2 * rows) * k * 2), b(size_t(n) * k * 2);
  std::vector<DeviceBuffer> out;
  for (int r = 0; r < 3; ++r) out.emplace_back(size_t(rows) * n * 2);
  kernels::fill_random(kBf16, a.get(), 2 * rows * k, 1, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 2, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  rt::A2aCall call;
  call.routing = &routing, call.nvlink = true;
  run_ranks(ranks, {a.get(), a.get(), a.get()}, {b.get(), b.get(), b.get()}, call,
            {out[0].get(), out[1].get(), out[2].get()}, n, {nullptr, nullptr, nullptr});
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_every_check_reports(
      3, [&](int r) { ranks.ops[size_t(r)]->check(); }, {"rows from rank 1 ", "did not arrive within"},
      "the lost arrivals");
}

// Three ranks' NVLink calls side by side, rank 1 given `rank1`'s routing and
// the others `rest`'s (waits of 0.5 s), run to the end.
static std::unique_ptr<NvlinkRanks> run_with_rank1_routing(const plan::MoeRouting& rest, const plan::MoeRouting& rank1) {
  const int64_t n = 512, k = 64, rows = 1024;
  rt::OverlapAllToAllOptions o;
  o.n = n, o.k = int(k), o.tile = {128, 128}, o.ctas = 8, o.sequential_ctas = 16;
  o.max_rows = 2 * rows, o.max_recv_rows = 2 * rows, o.max_tokens = int32_t(rows);
  o.wait_timeout_s = 0.5;
  auto ranks = std::make_unique<NvlinkRanks>(3, o);
  DeviceBuffer a(size_t(2 * rows) * k * 2), b(size_t(n) * k * 2);
  std::vector<DeviceBuffer> out;
  for (int r = 0; r < 3; ++r) out.emplace_back(size_t(2 * rows) * n * 2);
  kernels::fill_random(kBf16, a.get(), 2 * rows * k, 1, -1.f, 1.f, nullptr);
  kernels::fill_random(kBf16, b.get(), n * k, 2, -1.f, 1.f, nullptr);
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < 3; ++r) {
    rt::A2aCall call;
    call.routing = r == 1 ? &rank1 : &rest, call.nvlink = true;
    ranks->ops[size_t(r)]->run(a.get(), b.get(), call, out[size_t(r)].get(), n, ranks->streams[size_t(r)], nullptr);
  }
  FO_CUDA_CHECK(cudaDeviceSynchronize());
  return ranks;
}

// Ranks whose routings of one call differ (rank 1 was given another one): the
// call check fails on every rank at once, naming the rows that differ.
TEST(AllToAllNvlinkOnOneGpu, RanksGivenDifferentRoutingsFailOnEveryRank) {
  REQUIRE_HOPPER();
  const plan::MoeRouting mine = plan::make_moe_routing("uniform", 3, 512, 2, 11);
  const plan::MoeRouting other = plan::make_moe_routing("zipf:1.2", 3, 512, 2, 12);
  for (int r = 0; r < 3; ++r) ASSERT_NE(mine.rows(r), other.rows(r)) << "rank " << r;  // (every check fails)
  const auto ranks = run_with_rank1_routing(mine, other);
  test::expect_every_check_reports(
      3, [&](int r) { ranks->ops[size_t(r)]->check(); }, {"'s call #1 has rows = ", "where this rank expects rows = "},
      "the ranks' different routings");
}

// Rank 1 alone sees rank 2 send one row elsewhere (rank 2's rows the same in
// number, one moved from rank 0 to rank 1): rank 1's check of rank 2 fails;
// ranks 0 and 2 pass theirs, and fail on rank 1's token, which never comes.
TEST(AllToAllNvlinkOnOneGpu, ARankWhoseCheckFailsAloneFailsTheOthersThroughItsToken) {
  REQUIRE_HOPPER();
  const plan::MoeRouting mine = plan::make_moe_routing("uniform", 3, 512, 2, 11);
  plan::MoeRouting other = mine;
  const auto& d2 = mine.dest_rank[2];
  const size_t moved = size_t(std::find(d2.begin(), d2.end(), 0) - d2.begin());
  ASSERT_LT(moved, d2.size());
  other.dest_rank[2][moved] = 1, other.dest_token[2][moved] = 0;
  other.send_counts = plan::moe_send_counts(other);
  plan::validate_moe_routing(other);
  const auto ranks = run_with_rank1_routing(mine, other);
  for (int r = 0; r < 3; ++r) {
    try {
      ranks->ops[size_t(r)]->check();
      ADD_FAILURE() << "rank " << r << ": the failed check was not reported";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("rank " + std::to_string(r) + ": "), std::string::npos) << msg;
      EXPECT_NE(msg.find(r == 1 ? "rank 2's call #1 has rows = " : "rank 1 did not confirm call #1 in time"),
                std::string::npos)
          << msg;
    }
  }
}

// What the op refuses, before it enqueues anything: then a call that works.
TEST(AllToAllOneGpu, BadInputThrowsInvalidArgument) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  const std::string where = "seed " + std::to_string(seed);
  const int64_t n = 256, k = 64, max_rows = 100;
  rt::OverlapAllToAllOptions o;
  o.n = n, o.k = int(k), o.tile = {128, 128}, o.ctas = 1;  // 100 rows: 2 tiles, 2 waves
  o.max_rows = max_rows, o.max_recv_rows = max_rows, o.max_tokens = int32_t(max_rows);
  o.rank = 0, o.world = 1;
  // World 1 by hand: this rank's rows to itself, after the op's own wait.
  o.transport = [](const rt::A2aGroupCall& c) {
    const plan::Span& to = (*c.send_to)[0];
    const plan::Span& from = (*c.recv_from)[0];
    if (to.count != from.count) throw Error("sends " + std::to_string(to.count) + ", receives " + std::to_string(from.count));
    if (to.count)
      FO_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(c.recv) + from.offset * 2,
                                    static_cast<const char*>(c.send) + to.offset * 2, size_t(to.count) * 2,
                                    cudaMemcpyDeviceToDevice, c.stream));
  };
  auto refused = [&](rt::OverlapAllToAllOptions bad, const char* what) {
    EXPECT_THROW({ rt::OverlapAllToAll x(bad); }, InvalidArgument) << what;
  };
  {
    rt::OverlapAllToAllOptions bad = o;
    bad.transport = nullptr;
    refused(bad, "no communicator and no transport");
    bad = o, bad.rank = 1;
    refused(bad, "rank 1 of 1");
    bad = o, bad.k = 12;
    refused(bad, "k not a multiple of 8");
    bad = o, bad.tile = {64, 128};
    refused(bad, "a tile the kernel lacks");
    bad = o, bad.ctas = 0;
    refused(bad, "no CTAs");
    bad = o, bad.max_rows = -1;
    refused(bad, "max_rows < 0");
    bad = o, bad.wait_timeout_s = 0;
    refused(bad, "no timeout");
    bad = o, bad.nvlink = true, bad.n = 252;
    refused(bad, "the NVLink form with n % 8 != 0");
  }
  rt::OverlapAllToAll op(o);
  ASSERT_EQ(op.schedule_of(max_rows, false).waves(), 2);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DeviceBuffer a(size_t(max_rows) * k * 2), b(size_t(n) * k * 2), out(size_t(max_rows + 1) * n * 2),
      ref(size_t(max_rows) * n * 2);
  kernels::fill_random(kBf16, a.get(), max_rows * k, seed, -1.f, 1.f, st);
  kernels::fill_random(kBf16, b.get(), n * k, seed + 1, -1.f, 1.f, st);
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
  const plan::MoeRouting ok = plan::make_moe_routing("uniform", 1, max_rows, 1, seed);
  auto run = [&](const plan::MoeRouting* r, plan::Partition common, bool combine, void* o_, int64_t ld,
                 const void* a_) {
    rt::A2aCall c;
    c.routing = r, c.common = std::move(common), c.combine = combine;
    op.run(a_, b.get(), c, o_, ld, st);
  };
  EXPECT_THROW(run(nullptr, {1, 1}, true, out.get(), n, a.get()), InvalidArgument) << "no routing, " << where;
  const plan::MoeRouting two = plan::make_moe_routing("uniform", 2, 10, 1, seed);
  EXPECT_THROW(run(&two, {1, 1}, true, out.get(), n, a.get()), InvalidArgument) << "a routing of 2 ranks, " << where;
  const plan::MoeRouting big = plan::make_moe_routing("uniform", 1, max_rows + 1, 1, seed);
  EXPECT_THROW(run(&big, {1, 1}, false, out.get(), n, a.get()), InvalidArgument) << "rows beyond max_rows, " << where;
  plan::MoeRouting many = ok;
  many.tokens[0] = int32_t(max_rows + 1);
  EXPECT_THROW(run(&many, {1, 1}, true, out.get(), n, a.get()), InvalidArgument) << "tokens beyond max_tokens, " << where;
  plan::MoeRouting wrong = ok;
  wrong.send_counts[0] += 1;
  EXPECT_THROW(run(&wrong, {1, 1}, true, out.get(), n, a.get()), InvalidArgument) << "send_counts off, " << where;
  plan::MoeRouting far = ok;
  far.dest_token[0][5] = far.tokens[0];
  EXPECT_THROW(run(&far, {1, 1}, true, out.get(), n, a.get()), InvalidArgument) << "a token out of range, " << where;
  EXPECT_THROW(run(&ok, {1, 1}, false, nullptr, n, a.get()), InvalidArgument) << "null output with rows, " << where;
  EXPECT_THROW(run(&ok, {1, 1}, true, nullptr, n, a.get()), InvalidArgument) << "null output with tokens, " << where;
  EXPECT_THROW(run(&ok, {1, 1}, true, out.get(), n, nullptr), InvalidArgument) << "null A with rows, " << where;
  EXPECT_THROW(run(&ok, {1, 1}, true, out.get(), n - 1, a.get()), InvalidArgument) << "ld_out < n, " << where;
  EXPECT_THROW(run(&ok, {1, 1, 1}, true, out.get(), n, a.get()), InvalidArgument)
      << "more groups than the waves of max_rows, " << where;
  EXPECT_THROW(run(&ok, {2, 0}, true, out.get(), n, a.get()), InvalidArgument) << "an empty group, " << where;
  {
    rt::A2aCall c;
    c.routing = &ok, c.nvlink = true;
    EXPECT_THROW(op.run(a.get(), b.get(), c, out.get(), n, st), InvalidArgument)
        << "the NVLink form on an op built without it, " << where;
  }
  // No tokens and no rows: nothing to write, no output needed.
  const plan::MoeRouting none = plan::make_moe_routing("uniform", 1, 0, 1, seed);
  EXPECT_NO_THROW(run(&none, {}, true, nullptr, n, nullptr)) << where;
  EXPECT_NO_THROW(run(&none, {}, false, nullptr, n, nullptr)) << where;
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
  EXPECT_NO_THROW(op.check()) << where;
  // After the refusals, a call goes through: overlapped, two groups, bitwise our GEMM.
  kernels::poison(out.get(), (max_rows + 1) * n, st);
  const plan::Schedule full =
      plan::make_schedule(max_rows, n, {128, 256}, rt::current_device_sms(), plan::Raster::AlongN, 1);
  kernels::launch_gemm(kernels::plain_gemm(kBf16, a.get(), b.get(), full, int(k), ref.get(), n), st);
  ASSERT_NO_THROW(run(&ok, {1, 1}, false, out.get(), n, a.get())) << where;
  FO_CUDA_CHECK(cudaStreamSynchronize(st));
  EXPECT_NO_THROW(op.check()) << where;
  EXPECT_FALSE(op.sequential()) << where;
  EXPECT_EQ(op.groups(), 2u) << where;
  EXPECT_EQ(op.recv_rows(), max_rows) << where;
  EXPECT_TRUE(test::bitwise(kernels::compare(kBf16, out.get(), n, ref.get(), n, max_rows, n, st))) << where;
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}
