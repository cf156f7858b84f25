// The MoE combine kernel (kernels::combine_slot_rows) against the host's
// definition (plan::combine_reference), bitwise, on the maps and combine
// tables of random routings (plan/slot_map_alltoall.h): every rank's
// receive buffer of random rows, W = 1-8, top-K, skewed routings, experts
// that receive nothing, ragged n.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/reorder.h"
#include "plan/slot_map_alltoall.h"
#include "runtime/core/buffer.h"

using namespace flashoverlap;

namespace {

// bf16 on the host, for the reference: float in, round to nearest even.
struct HostBf16 {
  uint16_t bits = 0;
  HostBf16() = default;
  explicit HostBf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40);  // NaN stays NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = uint16_t(u >> 16);
    }
  }
  explicit operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

}  // namespace

TEST(AllToAllCombine, KernelMatchesTheHostDefinitionBitwise) {
  REQUIRE_HOPPER();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  cudaStream_t st;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  static const char* kinds[] = {"uniform", "zipf:1.2", "zipf:3", "empty:0", "one:0"};
  int tokens_without_rows = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int32_t world = 1 + int32_t(rng() % 8), topk = 1 + int32_t(rng() % uint64_t(std::min(world, 4)));
    const int64_t tokens = int64_t(rng() % 300), n = trial % 3 == 0 ? 1000 : 768;
    std::string kind = kinds[rng() % 5];
    if (kind == "empty:0" && topk >= world) kind = "uniform";  // (K distinct of W leave no rank out)
    const plan::MoeRouting routing = plan::make_moe_routing(kind, world, tokens, topk, rng());
    const plan::TileShape tile = rng() % 2 ? plan::TileShape{128, 256} : plan::TileShape{128, 128};
    std::vector<plan::Schedule> scheds;
    int32_t most = 0;
    for (int32_t r = 0; r < world; ++r) {
      scheds.push_back(plan::make_expert_schedule(routing.rows(r), n, tile, 16, plan::Raster::AlongN, 1));
      most = std::max(most, scheds.back().waves());
    }
    plan::Partition common;
    for (int32_t left = std::max(most, 1); left > 0;) {
      const int32_t g = 1 + int32_t(rng() % uint64_t(std::min(left, 3)));
      common.push_back(g);
      left -= g;
    }
    std::vector<std::vector<plan::Group>> groups;
    for (const plan::Schedule& s : scheds) groups.push_back(plan::make_clipped_groups(s, common));
    const int32_t rank = int32_t(rng() % uint64_t(world));
    const plan::SlotMap map = plan::make_alltoall_map(scheds, groups, routing, rank);
    const plan::CombineTable table = plan::make_combine_table(routing, rank);
    const std::string where = kind + ", world " + std::to_string(world) + ", top-" + std::to_string(topk) + ", " +
                              std::to_string(tokens) + " tokens a rank, rank " + std::to_string(rank) + ", n " +
                              std::to_string(n) + ", seed " + std::to_string(seed);
    for (int32_t t = 0; t < table.tokens; ++t) tokens_without_rows += table.token_begin[t] == table.token_begin[t + 1];
    // A random receive buffer (every slot row, padding or not).
    std::vector<HostBf16> recv(size_t(std::max<int64_t>(map.recv_rows, 1)) * size_t(map.bn));
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (HostBf16& x : recv) x = HostBf16(u(rng));
    std::vector<HostBf16> expect(size_t(std::max(table.tokens, 1)) * size_t(n));
    plan::combine_reference(map, table, recv.data(), expect.data());
    rt::DeviceBuffer d_recv(recv.size() * 2), d_out(expect.size() * 2);
    FO_CUDA_CHECK(cudaMemcpy(d_recv.get(), recv.data(), recv.size() * 2, cudaMemcpyHostToDevice));
    FO_CUDA_CHECK(cudaMemset(d_out.get(), 0xff, d_out.bytes()));
    std::vector<int32_t> slot_of_out = map.slot_of_out, rows = table.token_rows, begin = table.token_begin;
    std::vector<float> gate = table.gate;
    for (auto* v : {&slot_of_out, &rows}) v->push_back(0);  // (never empty buffers)
    gate.push_back(0.f);
    const rt::DeviceBuffer d_slot = rt::to_device(slot_of_out), d_rows = rt::to_device(rows),
                           d_begin = rt::to_device(begin), d_gate = rt::to_device(gate);
    kernels::combine_slot_rows(kernels::DType::BF16, d_recv.get(), map.bn, d_slot.as<int32_t>(), map.tiles_n,
                               d_begin.as<int32_t>(), d_rows.as<int32_t>(), d_gate.as<float>(), table.tokens,
                               int32_t(n), d_out.get(), n, st);
    FO_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<uint16_t> got(expect.size());
    FO_CUDA_CHECK(cudaMemcpy(got.data(), d_out.get(), got.size() * 2, cudaMemcpyDeviceToHost));
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < size_t(table.tokens) * size_t(n); ++i)
      if (got[i] != expect[i].bits) {
        if (first < 0) first = int64_t(i);
        ++bad;
      }
    EXPECT_EQ(bad, 0) << where << ": first difference at token " << first / n << ", column " << first % n;
  }
  std::fprintf(stderr, "%d tokens without rows (zeros) among the cases\n", tokens_without_rows);
  FO_CUDA_CHECK(cudaStreamDestroy(st));
}
