// gemm_alltoall.cpp — flashoverlap::GemmAllToAll (flashoverlap.h): the MoE
// combine for any routing, planned per call. Built once: the communicator
// bounded to the SMs left to NCCL, one for the routing exchange, the GEMM's
// time per wave (max over ranks). Each call: this rank's routing checked
// and packed into a fixed-size record, every rank's gathered (the ranks then
// hold the same data and reach the same verdict: a bad routing throws on
// every rank, naming the rank), the plan made from the model for each tile
// shape (plan/moe_plan.h), and the runtime op of the faster tile run.
// With several experts per rank the routing carries each source's rows per
// expert, and the op's GEMM is the grouped one over those segments.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>

#include "api/communicator_impl.h"
#include "api/alltoall_planner.h"
#include "api/op_setup.h"
#include "runtime/core/checks.h"
#include "runtime/core/call_watch.h"
#include "runtime/core/exchange.h"
#include "runtime/ops/alltoall.h"
#include "runtime/ops/one_rank_alltoall.h"
#include "runtime/transport/peers.h"

namespace flashoverlap {
namespace {

// What each rank's record starts with (then its send and receive counts,
// world each, its expert counts, world * experts where experts > 1, and
// dest_rank, dest_token and gate, max_rows entries each).
struct RecordHeader {
  int64_t rows = 0, tokens = 0;
  int64_t problem = 0;  // nonzero: this rank's input failed its own checks (the text is on that rank); 2: an
                        // earlier call's wait timed out here
  int64_t combine = 0;  // the receivers weight the rows by the senders' gates: every rank must agree
  int64_t call = 0;     // this op's calls so far on this rank: the same on every rank, or they are out of step
};

// What a call passes besides the routing (checked with it, on every rank at once).
struct CallArgs {
  const void *a = nullptr, *b = nullptr;
  void* out = nullptr;
  int64_t ld_out = 0;
  bool combine = true;
  InputScales scales;  // FP8 inputs' (GemmAllToAllOptions::scales)
};

}  // namespace

struct GemmAllToAll::Impl {
  std::shared_ptr<Communicator::Impl> comm;
  rt::Communicator bounded, exchange_comm;
  std::unique_ptr<rt::CallWatch> watch;  // (after the communicators it may revoke: gone before them)
  int64_t max_rows = 0, max_tokens = 0, n = 0, k = 0;
  int topk = 1, experts = 1;
  DType dtype = DType::BF16;
  GemmAllToAllOptions opts;
  int rank = 0, world = 1, sms = 0;
  // Plans each call (its wave times and sequential GEMMs measured at construction).
  api::AllToAllPlanner planner;
  // The direct sequential calls' cuBLAS GEMM (where planner.seq says so).
  std::unique_ptr<rt::CublasGemm> cublas;
  rt::OverlapCore core;  // (before the ops)
  std::unique_ptr<rt::HostExchange> exchange;
  std::vector<std::unique_ptr<rt::OverlapAllToAll>> ops;  // one slot per op_tiles(opts.input) entry, made on first use
  rt::OverlapAllToAll* last = nullptr;
  // World 1 with the routing in device memory: the whole call on the GPU.
  std::unique_ptr<rt::OneRankAllToAll> one_rank;
  // There, with several experts: their GEMM (the faster of ours and cuBLAS's per expert, timed at construction).
  std::unique_ptr<GroupedGemm> grouped;
  // Elsewhere a routing in device memory lands here first (dest_rank,
  // dest_token and gate, max_rows entries each).
  rt::PinnedBuffer staging;
  std::vector<uint8_t> local_record;  // world 1: this rank's record, which no exchange holds
  plan::MoeRouting routing;  // the last call's, every rank's
  plan::MoeRowCounts counts;  // its rows per 128-row tile row and destination (the routing's one check)
  std::string last_plan = "no call yet";

  std::string who() const {
    return "GemmAllToAll (rank " + std::to_string(rank) + " of " + std::to_string(world) + ", max_rows " +
           std::to_string(max_rows) + ", max_tokens " + std::to_string(max_tokens) + ", top-" +
           std::to_string(topk) + (experts > 1 ? ", " + std::to_string(experts) + " experts per rank" : std::string()) +
           ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")";
  }
  // (expert counts: only where several experts)
  size_t expert_entries() const { return experts > 1 ? size_t(world) * size_t(experts) : 0; }
  size_t header_bytes() const { return sizeof(RecordHeader) + (size_t(world) * 2 + expert_entries()) * 8; }
  size_t record_bytes() const { return (header_bytes() + size_t(max_rows) * 12 + 7) / 8 * 8; }  // (int64s aligned)
  int64_t calls = 0;     // made on this rank (RecordHeader::call)
  bool out_of_step = false;  // an exchange found the ranks at different calls: every later call throws

  // This rank's own checks ("" if none fail): what it can see alone. The
  // sizes and pointers first (sizes_problem_of), then the routing's arrays
  // on the host, then what the received rows need (received_problem_of).
  std::string problem_of(const AllToAllRouting& r, const CallArgs& c) const {
    if (std::string p = sizes_problem_of(r, c); !p.empty()) return p;
    std::vector<int64_t> counted(size_t(world), 0);
    for (int64_t i = 0; i < r.rows; ++i) {
      if (r.dest_rank[i] < 0 || r.dest_rank[i] >= world)
        return "row " + std::to_string(i) + " goes to rank " + std::to_string(r.dest_rank[i]) + ", outside [0, " +
               std::to_string(world) + ")";
      ++counted[size_t(r.dest_rank[i])];
    }
    int64_t received = 0;
    for (int d = 0; d < world; ++d) {
      if (r.send_counts[d] != counted[size_t(d)])
        return "send_counts[" + std::to_string(d) + "] = " + std::to_string(r.send_counts[d]) + " but " +
               std::to_string(counted[size_t(d)]) + " rows go to rank " + std::to_string(d);
      if (r.recv_counts[d] < 0) return "recv_counts[" + std::to_string(d) + "] is negative";
      received += r.recv_counts[d];
    }
    if (std::string p = expert_counts_problem_of(r); !p.empty()) return p;
    return received_problem_of(r, c, received);
  }
  // Several experts: each source's rows per expert, summing to the rows that
  // go back to it (their dest_rank, the segments': count_moe_rows checks).
  std::string expert_counts_problem_of(const AllToAllRouting& r) const {
    if (experts == 1) return "";
    for (int s = 0; s < world; ++s) {
      int64_t sum = 0;
      for (int e = 0; e < experts; ++e) {
        const int64_t x = r.expert_counts[s * experts + e];
        if (x < 0 || x > max_rows)
          return "expert_counts[" + std::to_string(s * experts + e) + "] = " + std::to_string(x) +
                 " is outside [0, max_rows]";
        sum += x;
      }
      if (sum != r.send_counts[s])
        return "expert_counts of rank " + std::to_string(s) + "'s rows (entries " + std::to_string(s * experts) +
               " to " + std::to_string(s * experts + experts - 1) + ") sum to " + std::to_string(sum) +
               ", but send_counts[" + std::to_string(s) + "] = " + std::to_string(r.send_counts[s]) +
               " rows go back to it";
    }
    return "";
  }
  std::string sizes_problem_of(const AllToAllRouting& r, const CallArgs& c) const {
    if (c.ld_out != 0 && c.ld_out < n)
      return "ld_out = " + std::to_string(c.ld_out) + " is below n (0 means n)";
    if (r.rows < 0 || r.rows > max_rows)
      return "rows = " + std::to_string(r.rows) + " is outside [0, max_rows = " + std::to_string(max_rows) + "]";
    if (r.tokens < 0 || r.tokens > max_tokens)
      return "tokens = " + std::to_string(r.tokens) + " is outside [0, max_tokens = " + std::to_string(max_tokens) + "]";
    if (!r.send_counts || !r.recv_counts) return "send_counts and recv_counts must not be null";
    if (experts > 1 && !r.expert_counts)
      return "expert_counts must not be null with " + std::to_string(experts) + " experts per rank";
    if (experts == 1 && r.expert_counts) return "expert_counts is for several experts per rank (this op has one)";
    if (r.rows > 0 && (!r.dest_rank || !r.dest_token || (c.combine && !r.gate)))
      return "dest_rank, dest_token and (to combine) gate must not be null with rows";
    try {  // (the scales' rule is the other ops'; here its refusal goes into the exchanged record)
      if (r.rows > 0 || c.scales.a || c.scales.b)  // (a rank without rows reads none)
        api::check_input_scales("", opts.input, opts.scales, c.scales);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      return what.rfind(": ", 0) == 0 ? what.substr(2) : what;
    }
    return "";
  }
  std::string received_problem_of(const AllToAllRouting& r, const CallArgs& c, int64_t received) const {
    if (received > max_tokens * topk)
      return std::to_string(received) + " rows to receive, more than max_tokens * topk = " +
             std::to_string(max_tokens * topk);
    if (r.rows > 0 && (!c.a || !c.b)) return "a and b must not be null with rows";
    if (r.rows > 0 && ((reinterpret_cast<uintptr_t>(c.a) | reinterpret_cast<uintptr_t>(c.b)) % 16 != 0))
      return "a and b must be 16-byte aligned";
    if (!c.out && (c.combine ? r.tokens : received) > 0) return "null output";
    return "";
  }

  // Exchanges the routing; fills `routing` (every rank's) or throws on every rank.
  void gather_routing(const AllToAllRouting& r, const CallArgs& call) {
    if (out_of_step)
      throw Error(who() + ": an earlier call found the ranks out of step (a rank failed alone); build the op anew");
    // An earlier call's wait that timed out here goes into the record, so
    // that every rank stops at this call rather than this rank alone.
    const bool failed_here = last && core.wait_error()->failed;
    const std::string mine = failed_here ? "an earlier call's wait timed out" : problem_of(r, call);
    uint8_t* rec = nullptr;
    if (exchange) {
      rec = static_cast<uint8_t*>(exchange->mine());
    } else {
      if (local_record.size() != record_bytes()) local_record.resize(record_bytes());  // (once: kept)
      rec = local_record.data();
    }
    RecordHeader h{mine.empty() ? r.rows : 0, mine.empty() ? r.tokens : 0, mine.empty() ? 0 : failed_here ? 2 : 1,
                   call.combine, ++calls};
    std::memcpy(rec, &h, sizeof h);
    int64_t* counts = reinterpret_cast<int64_t*>(rec + sizeof h);
    for (int d = 0; d < world; ++d) {
      counts[d] = mine.empty() ? r.send_counts[d] : 0;
      counts[world + d] = mine.empty() ? r.recv_counts[d] : 0;
    }
    for (size_t i = 0; i < expert_entries(); ++i) counts[2 * size_t(world) + i] = mine.empty() ? r.expert_counts[i] : 0;
    uint8_t* body = rec + header_bytes();
    const size_t rows = size_t(h.rows);
    if (rows) {
      std::memcpy(body, r.dest_rank, rows * 4);
      std::memcpy(body + size_t(max_rows) * 4, r.dest_token, rows * 4);
      if (r.gate) std::memcpy(body + size_t(max_rows) * 8, r.gate, rows * 4);
      else std::memset(body + size_t(max_rows) * 8, 0, rows * 4);
    }
    const uint8_t* all =
        exchange ? exchange->gather(who() + ": the routing exchange",
                                    std::chrono::milliseconds(int64_t(opts.exchange_timeout_s * 1000)))
                 : rec;

    std::string bad;
    // (the vectors keep their memory across calls: resized, not rebuilt)
    routing.world = world, routing.experts = experts;
    routing.expert_rows.resize(expert_entries() ? size_t(world) : 0);
    routing.tokens.clear(), routing.send_counts.clear();
    routing.dest_rank.resize(size_t(world)), routing.dest_token.resize(size_t(world)), routing.gate.resize(size_t(world));
    for (int s = 0; s < world; ++s) {
      const uint8_t* x = all + size_t(s) * record_bytes();
      RecordHeader hs;
      std::memcpy(&hs, x, sizeof hs);
      if (hs.call != h.call) {
        out_of_step = true;
        throw Error(who() + ": rank " + std::to_string(s) + " is at its call " + std::to_string(hs.call) +
                    " of this op, this rank at " + std::to_string(h.call) +
                    " (a rank failed alone earlier); build the op anew");
      }
      if (hs.problem) bad += (bad.empty() ? "" : ", ") + std::to_string(s);
      if (hs.combine != int64_t(call.combine) && !hs.problem && mine.empty())
        throw InvalidArgument(who() + ": rank " + std::to_string(s) + " passed combine = " +
                              (hs.combine ? "true" : "false") + ", this rank the other: every rank must pass the "
                              "same (the receivers weight the rows by the senders' gates)");
      const size_t m = size_t(hs.rows);
      const uint8_t* b = x + header_bytes();
      routing.tokens.push_back(int32_t(hs.tokens));
      routing.dest_rank[size_t(s)].resize(m), routing.dest_token[size_t(s)].resize(m), routing.gate[size_t(s)].resize(m);
      std::memcpy(routing.dest_rank[size_t(s)].data(), b, m * 4);
      std::memcpy(routing.dest_token[size_t(s)].data(), b + size_t(max_rows) * 4, m * 4);
      std::memcpy(routing.gate[size_t(s)].data(), b + size_t(max_rows) * 8, m * 4);
      const int64_t* c = reinterpret_cast<const int64_t*>(x + sizeof hs);
      routing.send_counts.insert(routing.send_counts.end(), c, c + world);
      if (expert_entries()) routing.expert_rows[size_t(s)].assign(c + 2 * world, c + 2 * world + expert_entries());
    }
    if (failed_here) last->check();  // (throws this rank's timeout, with its group and counter)
    if (!bad.empty())
      throw InvalidArgument(who() + ": the call of rank(s) " + bad + " failed their checks" +
                            (mine.empty() ? std::string(" (their own errors say why)") : ": here " + mine));
    // What only the ranks together can check: each rank's recv_counts
    // against its sources' send_counts, and the tokens at the destinations.
    for (int d = 0; d < world; ++d) {
      const int64_t* c = reinterpret_cast<const int64_t*>(all + size_t(d) * record_bytes() + sizeof(RecordHeader));
      for (int s = 0; s < world; ++s)
        if (c[world + s] != routing.send_count(s, d))
          throw InvalidArgument(who() + ": rank " + std::to_string(d) + "'s recv_counts[" + std::to_string(s) +
                                "] = " + std::to_string(c[world + s]) + " but rank " + std::to_string(s) + " sends it " +
                                std::to_string(routing.send_count(s, d)) + " rows");
    }
    // (The rest, tokens in range and finite gates: the planner's and the runtime op's checks, alike on every rank.)
  }

  // Whether a call with its routing in device memory runs on the GPU alone.
  bool on_gpu_alone() const {
    using Path = GemmAllToAllOptions::Path;
    return world == 1 && (opts.path == Path::Auto || opts.path == Path::Sequential) && n % 8 == 0;
  }
  // What the host can check of a routing in device memory (its arrays
  // are the GPU's to check): "" or the problem.
  std::string device_problem_of(const AllToAllRouting& r, const CallArgs& c) const {
    if (std::string p = sizes_problem_of(r, c); !p.empty()) return p;
    if (r.send_counts[0] != r.rows)
      return "send_counts[0] = " + std::to_string(r.send_counts[0]) + " but " + std::to_string(r.rows) +
             " rows go to rank 0";
    if (r.recv_counts[0] != r.rows)
      return "recv_counts[0] = " + std::to_string(r.recv_counts[0]) + " but rank 0 sends it " +
             std::to_string(r.rows) + " rows";
    if (r.rows > 0 && r.tokens == 0)
      return std::to_string(r.rows) + " rows come back to this rank, which has no tokens (tokens = 0)";
    if (std::string p = expert_counts_problem_of(r); !p.empty()) return p;
    return received_problem_of(r, c, r.rows);  // (world 1: what it sends comes back)
  }
  void run_on_gpu(const AllToAllRouting& r, const CallArgs& c, cudaStream_t stream, int32_t* tokens_out) {
    if (const std::string p = device_problem_of(r, c); !p.empty())
      throw InvalidArgument(who() + ": the call of rank(s) 0 failed their checks: here " + p);
    if (!one_rank) {  // (made at the first such call: ops that never take one allocate nothing)
      rt::OneRankAllToAllOptions o;
      o.n = n, o.k = k, o.dtype = api::to_kernels(dtype), o.max_rows = max_rows, o.max_tokens = max_tokens;
      o.core = &core;
      one_rank = std::make_unique<rt::OneRankAllToAll>(o, stream);
    }
    rt::OneRankCall call;
    call.rows = r.rows, call.tokens = r.tokens;
    call.dest_rank = r.dest_rank, call.dest_token = r.dest_token, call.gate = r.gate, call.combine = c.combine;
    if (grouped) {  // (the experts' rows are one source's: the grouped GEMM of its counts)
      call.gemm = [&](void* y, cudaStream_t s) { grouped->run(c.a, c.b, r.expert_counts, y, s); };
      one_rank->run(c.a, c.b, call, c.out, c.ld_out == 0 ? n : c.ld_out, tokens_out, stream);
      ++calls;
      last_plan = "sequential on one rank, the routing checked and tabled on the GPU; the experts' " +
                  grouped->last_plan();
      return;
    }
    const api::SequentialGemms::Sample& at = planner.seq.at(std::max<int64_t>(r.rows, 1));
    call.fp8 = api::fp8_of(opts.input, opts.scales);
    call.fp8.scale_a = c.scales.a, call.fp8.scale_b = c.scales.b;
    if (at.cublas) {
      call.cublas = cublas.get();
    } else {
      const plan::TileShape t = api::op_tiles(opts.input)[at.ours_tile];
      const int32_t tiles_m = int32_t(std::max<int64_t>((r.rows + t.bm - 1) / t.bm, 1));
      call.sched = plan::make_expert_schedule(r.rows, n, t, sms, plan::Raster::AlongN,
                                              plan::default_swizzle(sms, t, tiles_m));
    }
    one_rank->run(c.a, c.b, call, c.out, c.ld_out == 0 ? n : c.ld_out, tokens_out, stream);
    ++calls;
    last_plan = "sequential on one rank, the routing checked and tabled on the GPU; " +
                std::string(at.cublas ? "cuBLAS's GEMM" : "our GEMM");
  }
  // A call with its routing in host memory: exchanged, planned, run.
  void run_planned(const void* a, const void* b, const AllToAllRouting& routing, void* out, cudaStream_t stream,
                   bool combine, int64_t ld_out, int32_t* tokens_out, const InputScales& scales);
  // A routing in device memory copied to the host (the host waits for
  // `stream`): the host-planned call's form.
  AllToAllRouting to_host(const AllToAllRouting& r, cudaStream_t stream) {
    AllToAllRouting h = r;
    h.on_device = false;
    if (r.rows < 0 || r.rows > max_rows) return h;  // (refused by the checks, on every rank; nothing read)
    if (!staging.get()) staging = rt::PinnedBuffer(size_t(std::max<int64_t>(max_rows, 1)) * 12);
    auto* base = staging.as<char>();
    const size_t bytes = size_t(r.rows) * 4;
    auto copy = [&](const void* src, size_t at) -> const void* {
      if (!src) return nullptr;
      if (bytes) FO_CUDA_CHECK(cudaMemcpyAsync(base + at, src, bytes, cudaMemcpyDeviceToHost, stream));
      return base + at;
    };
    h.dest_rank = static_cast<const int32_t*>(copy(r.dest_rank, 0));
    h.dest_token = static_cast<const int32_t*>(copy(r.dest_token, size_t(max_rows) * 4));
    h.gate = static_cast<const float*>(copy(r.gate, size_t(max_rows) * 8));
    FO_CUDA_CHECK(cudaStreamSynchronize(stream));
    return h;
  }
  rt::OverlapAllToAll& op_of(size_t tile) {
    if (!ops.at(tile)) {  // (the planner picks among op_tiles)
      rt::OverlapAllToAllOptions o;
      o.n = n, o.k = int(k), o.dtype = api::to_kernels(dtype), o.tile = api::op_tiles(opts.input)[tile];
      o.experts = int32_t(experts);
      o.fp8 = api::fp8_of(opts.input, opts.scales);
      o.ctas = sms - opts.nccl_sms, o.sequential_ctas = sms;
      o.max_rows = max_rows, o.max_recv_rows = max_tokens * topk, o.max_tokens = int32_t(max_tokens);
      o.comm = bounded.get(), o.tail_comm = comm->comm.get();
      o.wait_timeout_s = opts.wait_timeout_s;
      o.core = &core, o.cublas = cublas.get();
      o.nvlink = opts.path == GemmAllToAllOptions::Path::NVLink;  // (collective: every rank plans the same tile)
      ops[tile] = std::make_unique<rt::OverlapAllToAll>(o);
    }
    return *ops[tile];
  }
};

GemmAllToAll::GemmAllToAll(const Communicator& comm, int64_t max_rows, int64_t max_tokens, int topk, int64_t n,
                           int64_t k, DType dtype, const GemmAllToAllOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  if (!comm.impl_) throw InvalidArgument("GemmAllToAll: no communicator");
  d.comm = comm.impl_;
  d.max_rows = max_rows, d.max_tokens = max_tokens, d.topk = topk, d.n = n, d.k = k, d.dtype = dtype;
  d.opts = options;
  d.experts = options.experts;
  d.ops.resize(api::op_tiles(options.input).size());
  d.rank = comm.rank(), d.world = comm.world();
  api::check_shape(d.who(), std::max<int64_t>(max_rows, 1), n, k);
  if (max_rows < 1 || max_tokens < 1 || max_tokens >= (int64_t(1) << 30))
    throw InvalidArgument(d.who() + ": max_rows and max_tokens must be >= 1 (and max_tokens below 2^30)");
  if (options.experts < 1 || options.experts > 4096 || int64_t(options.experts) * n > INT32_MAX)
    throw InvalidArgument(d.who() + ": experts must be in [1, 4096], and experts x n (the weights' rows) below 2^31");
  if (topk < 1 || topk > int64_t(d.world) * d.experts)
    throw InvalidArgument(d.who() + ": topk must be in [1, world x experts = " +
                          std::to_string(int64_t(d.world) * d.experts) + "] (the distinct experts each token picks)");
  // (a token's rows come back one per expert it picked: max_tokens x topk of them at most)
  if (max_tokens * topk > (int64_t(1) << 31) - 1)
    throw InvalidArgument(d.who() + ": max_tokens x topk (the most rows a rank receives) must be below 2^31");
  d.sms = rt::current_device_sms();
  api::check_op_options(d.who(), d.sms, options.nccl_sms, options.wait_timeout_s);
  if (!(options.exchange_timeout_s > 0 && options.exchange_timeout_s <= 7 * 24 * 3600.0))
    throw InvalidArgument(d.who() + ": exchange_timeout_s must be > 0 and at most a week");
  api::check_alltoall_inputs(d.who(), options, k);
  // Every rank plans every call alike from the exchanged routing: also from the same SMs and options.
  struct Agreed {
    int32_t sms, nccl_sms, path, experts, input, scales;
    bool operator==(const Agreed&) const = default;
  };
  const Agreed here{d.sms, options.nccl_sms, int32_t(options.path), options.experts, int32_t(options.input),
                    int32_t(options.scales)};
  for (const Agreed& x : rt::gather_from_all(comm.get(), d.rank, here, d.who() + ": the ranks' options"))
    if (!(x == here))
      throw InvalidArgument(d.who() + ": the ranks differ in SMs (" + std::to_string(x.sms) + " against " +
                            std::to_string(here.sms) + "), nccl_sms, path, input, scales or experts (" +
                            std::to_string(x.experts) + " against " + std::to_string(here.experts) +
                            "): every rank needs the same to plan alike");
  if (options.path == GemmAllToAllOptions::Path::NVLink) {  // (every rank the same verdict: the options agreed)
    if (n % 8 != 0 || d.world > 8)
      throw InvalidArgument(d.who() + ": Path::NVLink needs n % 8 == 0 and at most 8 ranks");
    const int32_t mine = d.world == 1 || rt::all_ranks_reachable(comm.get()) ? 1 : 0;
    for (int32_t x : rt::gather_from_all(comm.get(), d.rank, mine, d.who() + ": the ranks' NVLink reach"))
      if (!x)
        throw InvalidArgument(d.who() + ": Path::NVLink needs every rank's GPU within load/store reach of every "
                                        "other's (NVLink, one host); some rank's is not (use Auto or Slots)");
  }
  d.bounded = comm.impl_->comm.split({0, options.nccl_sms, 1, -1});  // (docs/design.md §5.5)
  if (d.world > 1) {
    d.exchange_comm = comm.impl_->comm.split({0, 2, 1, -1});  // the routing's own: ordered after nothing of the op's
    d.exchange = std::make_unique<rt::HostExchange>(d.exchange_comm.get(), d.record_bytes());
  }
  d.watch = api::make_call_watch(d.who(), options.wait_timeout_s,
                                 {d.bounded.get(), d.exchange_comm.get(), comm.impl_->comm.owned() ? comm.get() : nullptr});
  api::AllToAllPlanner& p = d.planner;
  p.n = n, p.k = k, p.world = d.world, p.sms = d.sms, p.dtype = dtype, p.opts = options;
  p.wave_ms = api::gemm_wave_ms(comm.get(), d.rank, max_rows, n, k, dtype, d.sms, d.who(), options.input);
  using Path = GemmAllToAllOptions::Path;  // (the paths with sequential calls; the same on every rank: agreed above)
  if ((options.path == Path::Auto || options.path == Path::Sequential || options.path == Path::Slots) &&
      d.experts == 1) {  // (several experts: the grouped GEMM, ours)
    d.cublas = std::make_unique<rt::CublasGemm>();
    p.seq = api::measure_sequential_gemms(comm.get(), d.rank, max_rows, n, k, dtype, d.sms, *d.cublas, d.who(),
                                          options.input, options.scales);
  }
  if (d.experts > 1 && d.on_gpu_alone())  // (timed now: a first call must not take the calibration's time)
    d.grouped = std::make_unique<GroupedGemm>(max_rows, d.experts, n, k, dtype);
  // Scratch for the largest call (each op asks the core for what it needs).
  size_t cols = 0;  // slot row elements per row of C, the widest of the tile shapes (ragged n pads to bn)
  for (plan::TileShape t : api::op_tiles(options.input)) cols = std::max(cols, size_t((n + t.bn - 1) / t.bn) * size_t(t.bn));
  d.core.reserve(0, size_t(max_rows) * cols * 2);
  d.core.reserve(1, size_t(max_tokens * topk) * cols * 2);
}

GemmAllToAll::~GemmAllToAll() = default;
GemmAllToAll::GemmAllToAll(GemmAllToAll&&) noexcept = default;
GemmAllToAll& GemmAllToAll::operator=(GemmAllToAll&&) noexcept = default;

void GemmAllToAll::run(const void* a, const void* b, const AllToAllRouting& routing, void* out, cudaStream_t stream,
                       bool combine, int64_t ld_out, int32_t* tokens_out, const InputScales& scales) {
  Impl& d = *impl_;
  if (capturing(stream))
    throw InvalidArgument(d.who() + ": run cannot be captured into a CUDA graph (each call exchanges its routing "
                                    "and plans on the host)");
  d.watch->check();
  if (d.one_rank && d.one_rank->failed()) d.one_rank->check();  // (a GPU-checked call's bad row: reported first)
  const rt::CallWatch::Scope watched(*d.watch, stream);
  if (routing.on_device && d.on_gpu_alone()) {
    d.run_on_gpu(routing, CallArgs{a, b, out, ld_out, combine, scales}, stream, tokens_out);
    return;
  }
  const AllToAllRouting host = routing.on_device ? d.to_host(routing, stream) : routing;
  d.run_planned(a, b, host, out, stream, combine, ld_out, tokens_out, scales);
}

void GemmAllToAll::Impl::run_planned(const void* a, const void* b, const AllToAllRouting& routing, void* out,
                                     cudaStream_t stream, bool combine, int64_t ld_out, int32_t* tokens_out,
                                     const InputScales& scales) {
  Impl& d = *this;
  d.gather_routing(routing, CallArgs{a, b, out, ld_out, combine, scales});  // (throws on every rank alike)
  d.counts = plan::count_moe_rows(d.routing, api::kBm);  // (the routing's check, alike on every rank; the plans' counts)
  const api::AllToAllPlanner::Planned p = d.planner.plan_for(d.routing, d.counts, d.rank);
  rt::OverlapAllToAll& op = d.op_of(p.tile);
  op.set_input_scales(scales.a, scales.b);
  const bool nvlink = d.opts.path == GemmAllToAllOptions::Path::NVLink;
  rt::A2aCall call{&d.routing, p.plan.sequential ? plan::Partition{1} : p.plan.common, combine, nvlink, p.cublas,
                   &d.counts};
  op.run(a, b, call, out, ld_out == 0 ? d.n : ld_out, stream, tokens_out);
  d.last = &op;
  d.last_plan = d.planner.describe(p, d.rank);
}

std::string GemmAllToAll::last_plan() const { return impl_->last_plan; }

void GemmAllToAll::check() const {
  if (impl_->one_rank) impl_->one_rank->check();
  if (impl_->last) impl_->last->check();
  impl_->watch->check();
}

int64_t GemmAllToAll::max_rows() const { return impl_->max_rows; }
int64_t GemmAllToAll::max_tokens() const { return impl_->max_tokens; }
int GemmAllToAll::topk() const { return impl_->topk; }
int GemmAllToAll::experts() const { return impl_->experts; }
int64_t GemmAllToAll::n() const { return impl_->n; }
int64_t GemmAllToAll::k() const { return impl_->k; }
DType GemmAllToAll::dtype() const { return impl_->dtype; }
int GemmAllToAll::world() const { return impl_->world; }

}  // namespace flashoverlap
