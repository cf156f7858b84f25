// make_plan: its choices, its guarantees (never predicted slower than
// sequential, consistent groups and bytes), its errors, and plan JSON.
#include <gtest/gtest.h>

#include <numeric>

#include "flashoverlap/error.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "test_plan_util.h"

namespace fo = flashoverlap::plan;
using fo_test::uniform;

namespace {

fo::PlanRequest request(fo::Collective op, int64_t m, int64_t n, int64_t k, int32_t world) {
  fo::PlanRequest r;
  r.op = op;
  r.m = m;
  r.n = n;
  r.k = k;
  r.world = world;
  return r;
}

std::string error_of(const fo::PlanRequest& r) {
  try {
    fo::make_plan(r);
  } catch (const flashoverlap::InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// What every plan must satisfy, whatever it chose.
void check_plan(const fo::Plan& p, const fo::PlanRequest& r) {
  const fo::Schedule& s = p.schedule;
  EXPECT_EQ(s.m, r.m);
  EXPECT_EQ(s.n, r.n);
  EXPECT_EQ(s.ctas, p.sms - p.reserve_sms);
  EXPECT_EQ(std::accumulate(p.partition.begin(), p.partition.end(), 0), s.waves());
  EXPECT_EQ(p.groups, fo::make_groups(s, p.partition));
  EXPECT_EQ(p.predicted.groups.size(), p.groups.size());
  EXPECT_EQ(p.group_bytes.size(), p.groups.size());
  EXPECT_LE(p.predicted.total_ms, p.baseline_ms() * (1 + 1e-12)) << "predicted slower than sequential";
  if (p.sequential) {
    EXPECT_EQ(p.partition.size(), 1u);
    EXPECT_EQ(p.reserve_sms, 0);
    EXPECT_DOUBLE_EQ(p.predicted.total_ms, p.baseline_ms());
  } else {
    EXPECT_GE(p.baseline_ms() / p.predicted.total_ms, 1 + r.min_gain - 1e-12);
    EXPECT_GT(p.reserve_sms, 0);
  }
  for (size_t g = 1; g < p.groups.size(); ++g) {
    EXPECT_GE(p.predicted.groups[g].comm_start, p.predicted.groups[g - 1].comm_end);
    EXPECT_GE(p.predicted.groups[g].comm_start, p.predicted.groups[g].compute_end);
  }
  // The slot maps of every rank agree with the plan's bytes.
  for (int32_t rank = 0; rank < p.world; ++rank) {
    const fo::SlotMap map = fo::make_slot_map(p, rank);
    ASSERT_EQ(map.groups.size(), p.groups.size());
    if (!p.sequential) {
      for (size_t g = 0; g < p.groups.size(); ++g) EXPECT_DOUBLE_EQ(map.groups[g].send.count * 2.0, p.group_bytes[g]);
    }
    if (p.op == fo::Collective::ReduceScatter && !p.sequential) {
      EXPECT_DOUBLE_EQ(p.padding_bytes, map.padding_rows * s.bn * 2.0);
    }
  }
  // JSON round trip.
  const nlohmann::json j = fo::to_json(p);
  EXPECT_EQ(fo::to_json(fo::plan_from_json(j, "test")), j);
}

}  // namespace

TEST(PlanPlanner, DefaultAllReduceOverlapsAndBeatsSequential) {
  const fo::PlanRequest r = request(fo::Collective::AllReduce, 4096, 8192, 8192, 2);
  const fo::Plan p = fo::make_plan(r);
  check_plan(p, r);
  EXPECT_FALSE(p.sequential);
  EXPECT_GT(p.speedup(), 1.01);
  EXPECT_GT(p.groups.size(), 1u);
  // The partition is the DP optimum for the chosen configuration: re-planning
  // that configuration with any other partition predicts no better.
  fo::PlanRequest fixed = r;
  fixed.tile = fo::TileShape{p.schedule.bm, p.schedule.bn};
  fixed.reserve_sms = p.reserve_sms;
  fixed.raster = p.schedule.raster;
  fixed.swizzle = p.schedule.swizzle;
  ASSERT_LE(p.schedule.waves(), 14);
  fo::for_each_partition(p.schedule.waves(), [&](const fo::Partition& part) {
    fixed.partition = part;
    EXPECT_GE(fo::make_plan(fixed).predicted.total_ms, p.predicted.total_ms * (1 - 1e-12)) << fo::to_string(part);
  });
}

TEST(PlanPlanner, RandomRequestsGiveConsistentPlansNeverSlowerThanSequential) {
  FO_SEEDED_RNG(rng);
  const fo::Collective ops[] = {fo::Collective::AllReduce, fo::Collective::ReduceScatter};
  int sequential = 0, overlapped = 0;
  for (int it = 0; it < 60; ++it) {
    const fo::Collective op = ops[it % 2];
    const int32_t world = int32_t(uniform(rng, 1, 8));
    int64_t m = uniform(rng, 0, 2) ? 128 * uniform(rng, 1, 64) : uniform(rng, 1, 9000);
    if (op == fo::Collective::ReduceScatter && 128 % world && m % world) m += world - m % world;
    fo::PlanRequest r = request(op, m, 256 * uniform(rng, 1, 40) + uniform(rng, 0, 1) * uniform(rng, 1, 255),
                                64 * uniform(rng, 1, 256), world);
    SCOPED_TRACE(std::string(fo::to_string(op)) + " M=" + std::to_string(r.m) + " N=" + std::to_string(r.n) +
                 " K=" + std::to_string(r.k) + " world=" + std::to_string(world));
    const fo::Plan p = fo::make_plan(r);
    check_plan(p, r);
    (p.sequential ? sequential : overlapped)++;
  }
  EXPECT_GT(sequential, 0);
  EXPECT_GT(overlapped, 0);
}

TEST(PlanPlanner, TinyShapesFallBackToSequential) {
  const fo::PlanRequest r = request(fo::Collective::AllReduce, 128, 1024, 1024, 2);
  const fo::Plan p = fo::make_plan(r);
  check_plan(p, r);
  EXPECT_TRUE(p.sequential);
  EXPECT_EQ(p.schedule.ctas, 132);
  // No SM to spare for NCCL: sequential, whatever the shape.
  fo::PlanRequest one_sm = request(fo::Collective::ReduceScatter, 4096, 8192, 8192, 2);
  one_sm.sms = 1;
  const fo::Plan q = fo::make_plan(one_sm);
  check_plan(q, one_sm);
  EXPECT_TRUE(q.sequential);
}

TEST(PlanPlanner, GivenPartitionIsEvaluatedNotSearched) {
  fo::PlanRequest r = request(fo::Collective::AllReduce, 4096, 8192, 8192, 2);
  r.tile = fo::TileShape{128, 256};
  r.reserve_sms = 16;  // 116 CTAs: 9 waves
  r.partition = fo::Partition{1, 2, 6};
  const fo::Plan p = fo::make_plan(r);
  EXPECT_EQ(p.partition, (fo::Partition{1, 2, 6}));
  EXPECT_FALSE(p.sequential);  // no fallback for an explicit partition
  r.partition = fo::Partition{1, 2, 2};
  const std::string e = error_of(r);
  EXPECT_NE(e.find("sums to 5"), std::string::npos) << e;
  EXPECT_NE(e.find("T = 9"), std::string::npos) << e;
  // Automatic tile and reserve: the partition picks the configurations with its T.
  r.tile.reset();
  r.reserve_sms = -1;
  r.partition = fo::Partition{9};
  EXPECT_EQ(fo::make_plan(r).schedule.waves(), 9);
  r.partition = fo::Partition{1, 0, 8};
  EXPECT_NE(error_of(r).find("group 1"), std::string::npos) << error_of(r);
}

TEST(PlanPlanner, ReduceScatterLayoutChoice) {
  // M % W == 0: the standard layout, with its column-major tile order when overlapped.
  const fo::PlanRequest std_req = request(fo::Collective::ReduceScatter, 8192, 8192, 8192, 2);
  const fo::Plan p = fo::make_plan(std_req);
  check_plan(p, std_req);
  EXPECT_EQ(p.rs_layout, fo::RsLayout::Standard);
  // M % W != 0 but bm % W == 0: sub-tile.
  const fo::PlanRequest odd = request(fo::Collective::ReduceScatter, 8191, 8192, 8192, 2);
  const fo::Plan q = fo::make_plan(odd);
  check_plan(q, odd);
  EXPECT_EQ(q.rs_layout, fo::RsLayout::SubTile);
  // Neither applies.
  const std::string e = error_of(request(fo::Collective::ReduceScatter, 4000, 8192, 8192, 3));
  EXPECT_NE(e.find("M % world == 0"), std::string::npos) << e;
  // Forced layouts.
  fo::PlanRequest forced = std_req;
  forced.rs_layout = fo::RsLayout::SubTile;
  EXPECT_EQ(fo::make_plan(forced).rs_layout, fo::RsLayout::SubTile);
  forced = odd;
  forced.rs_layout = fo::RsLayout::Standard;
  EXPECT_NE(error_of(forced).find("M % world == 0"), std::string::npos);
}

TEST(PlanPlanner, RejectsBadRequests) {
  const fo::PlanRequest good = request(fo::Collective::AllReduce, 4096, 8192, 8192, 2);
  auto with = [&](auto change) {
    fo::PlanRequest r = good;
    change(r);
    return error_of(r);
  };
  EXPECT_NE(with([](auto& r) { r.m = 0; }).find("M=0"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.k = -5; }).find("K=-5"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.world = 0; }).find("world size 0"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.reserve_sms = 132; }).find("reserved SMs 132"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.tile = fo::TileShape{64, 64}; }).find("64x64"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.curve = fo::BandwidthCurve::builtin_h200(fo::Collective::AllToAll); })
                .find("curve is for alltoall"),
            std::string::npos);
  // The All-to-All is the MoE planner's (every rank its own rows, per call).
  EXPECT_NE(with([](auto& r) { r.op = fo::Collective::AllToAll; }).find("plan::make_moe_plan"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.op = fo::Collective::AllGather; }).find("allgather"), std::string::npos);
  EXPECT_NE(with([](auto& r) { r.measured_wave_ms = {0.1}; }).find("set the tile"), std::string::npos);
  EXPECT_NE(with([](auto& r) {
              r.tile = fo::TileShape{128, 256};
              r.reserve_sms = 16;
              r.measured_wave_ms = {0.1, 0.1};
            }).find("2 given"),
            std::string::npos);
}

TEST(PlanPlanner, MeasuredWaveTimesDriveTheModel) {
  fo::PlanRequest r = request(fo::Collective::AllReduce, 4096, 8192, 8192, 2);
  r.tile = fo::TileShape{128, 256};
  r.reserve_sms = 16;  // 116 CTAs: 9 waves
  // Uneven waves, short enough against the 64 MiB AllReduce (~0.3 ms) that
  // overlap pays: the model must run on these times, not its own estimate.
  for (int w = 0; w < 9; ++w) r.measured_wave_ms.push_back(0.04 + 0.005 * w);
  const double sum = std::accumulate(r.measured_wave_ms.begin(), r.measured_wave_ms.end(), 0.0);
  const fo::Plan p = fo::make_plan(r);
  check_plan(p, r);
  ASSERT_FALSE(p.sequential) << "predicted " << p.predicted.total_ms << " ms vs sequential " << p.baseline_ms();
  EXPECT_NEAR(p.predicted.groups.back().compute_end, sum * r.gemm.slowdown, 1e-9);
  double at = 0;  // each group's GEMM ends after its own waves' measured times
  for (size_t g = 0; g < p.groups.size(); ++g) {
    for (int32_t w = p.groups[g].first_wave; w < p.groups[g].end_wave; ++w) at += r.measured_wave_ms[size_t(w)];
    EXPECT_NEAR(p.predicted.groups[g].compute_end, at * r.gemm.slowdown, 1e-9) << "group " << g;
  }
  EXPECT_NEAR(p.baseline_gemm_ms, 8 * sum / 9, 1e-9);  // the full grid has 8 waves of the mean time
}

TEST(PlanPlanner, HugeShapesSearchOverRunsOfWaves) {
  const fo::PlanRequest r = request(fo::Collective::AllReduce, 131072, 65536, 1024, 2);
  const fo::Plan p = fo::make_plan(r);
  EXPECT_GT(p.schedule.waves(), fo::kMaxSearchWaves);
  EXPECT_EQ(std::accumulate(p.partition.begin(), p.partition.end(), 0), p.schedule.waves());
  ASSERT_FALSE(p.sequential);  // (the search over runs is what the note is about)
  bool noted = false;
  for (const auto& n : p.notes) noted |= n.find("runs of") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(PlanPlanner, PlanJsonIsValidatedOnRead) {
  const fo::Plan p = fo::make_plan(request(fo::Collective::ReduceScatter, 4096, 8192, 8192, 2));
  const nlohmann::json good = fo::to_json(p);
  auto error = [&](auto change) {
    nlohmann::json j = good;
    change(j);
    try {
      fo::plan_from_json(j, "cache.json");
    } catch (const flashoverlap::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("plan cache.json: ", 0), 0u) << what;
      EXPECT_EQ(what.find("plan cache.json: plan"), std::string::npos) << what;
      return what;
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error([](auto& j) { j["format"] = "x"; }).find("not a plan"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["schema"] = 2; }).find("schema version 2"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["partition"].push_back(1); }).find("sums to"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["ctas"] = 7; }).find("ctas"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j.erase("tile"); }).find("missing or mistyped"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["m"] = "4096"; }).find("missing or mistyped"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["rs_layout"] = "diagonal"; }).find("diagonal"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["groups"][0]["tiles"][1] = 3; }).find("group 0"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j = nlohmann::json::array(); }).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error([](auto& j) { j["op"] = "alltoall"; }).find("make_moe_plan"), std::string::npos);
}

// make_plan refuses the All-to-All, so no Plan of it has a slot map either.
TEST(PlanPlanner, NoSlotMapForAnAllToAllPlan) {
  fo::Plan p = fo::make_plan(request(fo::Collective::AllReduce, 4096, 8192, 8192, 2));
  p.op = fo::Collective::AllToAll;
  EXPECT_THROW(fo::make_slot_map(p, 0), flashoverlap::InvalidArgument);
}
