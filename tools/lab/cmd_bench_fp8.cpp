// flashoverlap-lab bench-fp8 — our GEMM with e4m3 inputs (kernels::Fp8:
// 128x112, 128x128, 128x144, 128x160 and 128x192 tiles, the fastest per
// shape (the ops choose among them by their timed waves; 64x48 and 64x144
// on request, which the ops do not plan with), part sums promoted to fp32, the scales in the epilogue) against
// cuBLASLt's FP8 matmul, which torch._scaled_mm runs
// (FAST_ACCUM off, as use_fast_accum=False; and on, as use_fast_accum=True),
// per shape and scale kind, timed in turns on the full grid (a stream-K
// split on its in-step grid: fp8_launch.h; each run --calls launches back
// to back, its stream held until the host has queued them; the time per
// launch reported); bf16 output.
// Internal: the kernel alone. ratio: cuBLASLt's (FAST_ACCUM off) / ours;
// empty, and ours unchecked (the GPU tests check it against the host), where
// this cuBLASLt has no FP8 matmul with the scale kind. err_*: the
// accumulation's error, ||C - C32|| / ||C32|| of ours, cuBLASLt's and
// cuBLASLt's with FAST_ACCUM against C32 = the product of the exact e4m3
// values in fp32 (cuBLAS's SGEMM without TF32), scaled as the kind says: the
// bf16 output's rounding alone sets its floor, so only what stands above
// it is the accumulation's. bench/scaled_mm.py times torch._scaled_mm on
// the same shapes.
#include <cublas_v2.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_parse.h"
#include "commands.h"
#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "lab/fp8_launch.h"
#include "plan/tile_grid.h"
#include "lab/lab.h"
#include "runtime/core/buffer.h"
#include "runtime/core/checks.h"
#include "runtime/core/cublas.h"
#include "runtime/tune/timing.h"

namespace flashoverlap::cli {
namespace {

// FP8 deployments' GEMMs (N = out features per rank, K = in): Llama-3-70B at
// TP 8 (QKV 1280x8192, o_proj 8192x1024, gate+up 7168x8192, down 8192x3584),
// Llama-3-405B at TP 8 (o_proj 16384x2048, down 16384x6656), Qwen2.5-72B at
// TP 4 (down 8192x7392, gate+up 14784x8192), DeepSeek-V3's dense MLP (down
// 7168x18432 at TP 8: 7168x2304; gate+up 4608x7168), each at m 256, 2048
// and 16384.
std::string default_shapes() {
  const int nk[][2] = {{1280, 8192}, {8192, 1024},  {7168, 8192},  {8192, 3584}, {16384, 2048},
                       {16384, 6656}, {8192, 7392}, {14784, 8192}, {7168, 2304}, {4608, 7168}};
  std::ostringstream os;
  for (int m : {256, 2048, 16384})
    for (const auto& x : nk) os << (os.tellp() > 0 ? "," : "") << m << "x" << x[0] << "x" << x[1];
  return os.str();
}

struct Options {
  std::string shapes = default_shapes();
  std::string scales = "tensor,row";
  // A list of kernels::kernel_tiles(true)'s names (timed in turns; ours: the fastest), or all (the ops' tiles).
  std::string tile = "all";
  // Comma-separated, timed in turns: off, auto (the rule), force, pair, tail (fp8_launch.h's Split); both: off,auto.
  std::string stream_k = "auto";
  bool gate = true;  // the host gate (rt::HostGate); off under a profiler, which serialises launches
  bool phases = false;  // one traced launch per variant: when its CTAs started and ended (print_phases)
  // Launches per timed run, back to back (the time per launch reported):
  // as bench/scaled_mm.py times torch._scaled_mm, so that both sides'
  // launch gaps count alike. 1: each launch alone between its events.
  int calls = 20;
  int grid = 0;  // CTAs of our launches (0: one per SM)
  std::string pdl = "off";  // our launches as programmatic dependent launches: off, on, or both (timed in turns)
  int warmup = 5, iters = 20, device = 0;
  std::string csv;
};

// One launch of p with the phase trace (GemmParams::monitor_phases), timed
// by events: when its CTAs started, had their first k-block in shared
// memory (whole tiles), finished their last MMAs and their stores, in µs
// from the first CTA's start, against the launch's time. What the kernel's
// time holds beyond its CTAs' (launch, tail) is the difference.
// (p has just been timed: its kernel is loaded and warm.)
void print_phases(kernels::GemmParams p, const std::string& label, cudaStream_t stream) {
  const int ctas = p.sched.ctas;
  rt::DeviceBuffer buf(size_t(ctas) * kernels::kPhaseSlots * sizeof(uint64_t));
  FO_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, buf.bytes(), stream));
  p.monitor_phases = buf.as<uint64_t>();
  const double ms = rt::time_on_stream([&] { kernels::launch_gemm(p, stream); }, stream, 0, 1, false).median_ms;
  std::vector<uint64_t> v(size_t(ctas) * kernels::kPhaseSlots);
  FO_CUDA_CHECK(cudaMemcpy(v.data(), buf.get(), v.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  uint64_t t0 = ~uint64_t(0);
  for (int c = 0; c < ctas; ++c)
    if (v[size_t(c) * kernels::kPhaseSlots + 3]) t0 = std::min(t0, v[size_t(c) * kernels::kPhaseSlots + 3]);
  auto slot = [&](int ph) {  // min / median / max over the CTAs that recorded it, µs from t0
    std::vector<double> x;
    for (int c = 0; c < ctas; ++c)
      if (uint64_t t = v[size_t(c) * kernels::kPhaseSlots + ph]) x.push_back((double(t) - double(t0)) / 1e3);
    std::sort(x.begin(), x.end());
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    if (x.empty()) os << "-";
    else os << x.front() << "/" << x[x.size() / 2] << "/" << x.back() << " (" << x.size() << ")";
    return os.str();
  };
  const bool sk = p.stream_k.on();
  std::cout << "  phases " << label << ": launch " << std::fixed << std::setprecision(1) << ms * 1e3
            << " us; from the first CTA's start, min/median/max (CTAs): start " << slot(3)
            << (sk ? ", partial put " : ", first data in ") << slot(2)
            << (sk ? ", own k-blocks done " : ", first MMAs ") << slot(4) << ", last MMAs " << slot(5)
            << ", last staged " << slot(0) << ", stored " << slot(1) << std::defaultfloat << "\n";
}

// Random e4m3 bytes of magnitudes 2^-3 .. 2^2 (exponent fields 4..9, any
// sign and mantissa): no NaN, sums of k of them well inside bf16's range.
std::vector<uint8_t> random_e4m3(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = rng();
    v[i] = uint8_t(((r & 1) << 7) | ((4 + (r >> 1) % 6) << 3) | ((r >> 8) & 7));
  }
  return v;
}

int run(const Options& o) {
  const auto shapes = parse_shapes(o.shapes);
  std::vector<kernels::Scales> kinds;
  for (const std::string& s : split_list(o.scales)) {
    if (s == "none") kinds.push_back(kernels::Scales::None);
    else if (s == "tensor") kinds.push_back(kernels::Scales::PerTensor);
    else if (s == "row") kinds.push_back(kernels::Scales::RowWise);
    else throw InvalidArgument("--scales: unknown kind '" + s + "' (none, tensor, row)");
  }
  for (const auto& d : shapes)
    if (d[2] % 16 != 0 || d[1] % 16 != 0 || d[0] > INT32_MAX || d[1] > INT32_MAX || d[2] > INT32_MAX)
      throw InvalidArgument("--shapes: N and K must be multiples of 16 (FP8 rows for TMA and cuBLASLt)");
  // (the kernel's FP8 tiles by name; all: the ops', narrowest first)
  std::vector<plan::TileShape> tile_list;
  const std::vector<plan::TileShape>& fp8_tiles = kernels::kernel_tiles(true);
  const std::vector<plan::TileShape>& op_tiles = kernels::op_tiles(true);
  if (o.tile == "all")
    for (auto t = op_tiles.rbegin(); t != op_tiles.rend(); ++t) tile_list.push_back(*t);
  else
    for (const std::string& x : split_list(o.tile)) {
      const auto t = std::find_if(fp8_tiles.begin(), fp8_tiles.end(),
                                  [&](const plan::TileShape& s) { return plan::to_string(s) == x; });
      if (t == fp8_tiles.end())
        throw InvalidArgument("--tile: " + kernels::tile_names(fp8_tiles) + ", a list of them, or all (got '" + x +
                              "')");
      tile_list.push_back(*t);
    }
  std::vector<Split> modes;
  for (const std::string& x : split_list(o.stream_k == "both" ? "off,auto" : o.stream_k)) {
    if (x == "off") modes.push_back(Split::Off);
    else if (x == "auto") modes.push_back(Split::Rule);
    else if (x == "force") modes.push_back(Split::Force);
    else if (x == "pair") modes.push_back(Split::Pair);
    else if (x == "tail") modes.push_back(Split::Tail);
    else throw InvalidArgument("--stream-k: off, auto, force, pair, tail or a list of them, or both (got '" + x + "')");
  }
  if (o.pdl != "off" && o.pdl != "on" && o.pdl != "both")
    throw InvalidArgument("--pdl: off, on or both (got '" + o.pdl + "')");
  const std::vector<bool> pdls = o.pdl == "both" ? std::vector<bool>{false, true} : std::vector<bool>{o.pdl == "on"};
  const std::optional<rt::DeviceInfo> gpu = open_kernel_bench_gpu("bench-fp8", o.device);
  if (!gpu) return 1;
  const rt::DeviceInfo& info = *gpu;
  cudaStream_t stream;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  rt::CublasGemm lt;
  std::cout << "# cuBLASLt's FP8 matmul with row-wise scales: "
            << (lt.takes_fp8(kernels::Scales::RowWise) ? "yes" : "none here (those rows: ours alone)") << "\n";
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) throw Error("cannot write " + o.csv);
    csv << "M,N,K,scales,ours_ms,cublaslt_ms,cublaslt_fast_ms,ours_tflops,ratio,rel_err,err_ours,err_lt,err_lt_fast,"
           "ours_tile,ours_128_ms,ours_160_ms,ours_192_ms,ours_stream_k,ours_112_ms,ours_64x48_ms,ours_64x144_ms,"
           "ours_144_ms"
        << (modes.size() > 1 || o.pdl == "both" ? ",variants" : "") << "\n";
  }
  std::cout << std::left << std::setw(20) << "shape" << std::setw(8) << "scales" << std::right << std::setw(10)
            << "ours_ms" << std::setw(6) << "tile" << std::setw(12) << "cublasLt_ms" << std::setw(10) << "fast_ms"
            << std::setw(9) << "ours_TF"
            << std::setw(9) << "Lt_TF" << std::setw(8) << "ratio" << std::setw(10) << "rel_err"
            << "   err ours / Lt / Lt fast (vs the fp32 product)\n";
  bool wrong = false;
  cublasHandle_t sgemm = nullptr;  // (the fp32 reference's)
  FO_CUBLAS_CHECK(cublasCreate(&sgemm));
  FO_CUBLAS_CHECK(cublasSetStream(sgemm, stream));
  for (const auto& d : shapes) {
    const int m = int(d[0]), n = int(d[1]), k = int(d[2]);
    const rt::DeviceBuffer a = rt::to_device(random_e4m3(size_t(m) * k, 11 + uint64_t(m))),
                           b = rt::to_device(random_e4m3(size_t(n) * k, 13 + uint64_t(n)));
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<float> u(0.5f, 2.f);
    std::vector<float> sa(static_cast<size_t>(m)), sb(static_cast<size_t>(n));
    for (float& x : sa) x = u(rng);
    for (float& x : sb) x = u(rng);
    const rt::DeviceBuffer dsa = rt::to_device(sa), dsb = rt::to_device(sb);
    rt::DeviceBuffer theirs(size_t(m) * n * 2), fast(size_t(m) * n * 2);
    const rt::DeviceBuffer outs[2] = {rt::DeviceBuffer(size_t(m) * n * 2), rt::DeviceBuffer(size_t(m) * n * 2)};
    const int ctas = o.grid > 0 ? o.grid : info.sms;
    rt::DeviceBuffer work(kernels::stream_k_workspace_bytes(ctas, 192));  // (zero: each launch leaves it so)
    FO_CUDA_CHECK(cudaMemset(work.get(), 0, work.bytes()));
    // C32: the exact inputs' product in fp32 (row-major C = A B^T as column-major C^T = B^T-op * A)
    rt::DeviceBuffer c32(size_t(m) * n * 4), scaled(size_t(m) * n * 4);
    {
      rt::DeviceBuffer a32(size_t(m) * k * 4), b32(size_t(n) * k * 4);
      kernels::e4m3_to_float(a.get(), a32.as<float>(), int64_t(m) * k, stream);
      kernels::e4m3_to_float(b.get(), b32.as<float>(), int64_t(n) * k, stream);
      const float one = 1.f, zero = 0.f;
      FO_CUBLAS_CHECK(cublasGemmEx(sgemm, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b32.get(), CUDA_R_32F, k, a32.get(),
                                   CUDA_R_32F, k, &zero, c32.get(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F_PEDANTIC,
                                   CUBLAS_GEMM_DEFAULT));
      FO_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    const double flop = 2.0 * m * n * double(k);
    for (kernels::Scales kind : kinds) {
      kernels::Fp8 f;
      f.on = true, f.scales = kind;
      if (kind != kernels::Scales::None) f.scale_a = dsa.as<float>(), f.scale_b = dsb.as<float>();
      // Our tiles (--tile: one, or several timed in turns: ours is then the fastest)
      struct Tile {
        plan::TileShape tile;
        std::string sk;  // (the split: empty, or sk (the rule), force)
        kernels::GemmParams p;
        std::string label() const {
          return fp8_tile_label(tile) + (sk.empty() ? "" : "/" + sk) + (p.pdl ? "/pdl" : "");
        }
        double err = 0, ms = 0;
        std::optional<kernels::CompareResult> vs_lt;  // (where this cuBLASLt has the scale kind)
      };
      std::vector<Tile> tiles;
      for (const plan::TileShape& tile : tile_list) {
        for (Split mode : modes) {
          for (bool pdl : pdls) {
            Tile t{};
            t.tile = tile;
            t.p = fp8_gemm(m, n, k, tile, ctas, a.get(), b.get(), outs[tile.bn == 128 ? 0 : 1].get(), f, work.get(),
                           mode);
            if (t.p.stream_k.on()) t.sk = mode == Split::Force ? "force" : mode == Split::Tail ? "tail" : "sk";
            if (t.p.pair_k) t.sk = "pair";
            t.p.pdl = pdl;
            // (each launch timed once: every mode that does not split is off)
            if (std::none_of(tiles.begin(), tiles.end(), [&](const Tile& u) { return u.label() == t.label(); }))
              tiles.push_back(t);
          }
        }
      }
      const bool has_lt = lt.takes_fp8(kind);
      if (has_lt) lt.run_fp8(kernels::DType::BF16, f, a.get(), b.get(), theirs.get(), m, n, k, n, stream);
      FO_CUDA_CHECK(cudaMemcpyAsync(scaled.get(), c32.get(), c32.bytes(), cudaMemcpyDeviceToDevice, stream));
      kernels::apply_fp8_scales(scaled.as<float>(), m, n, f, stream);
      auto error_of = [&](const void* x) {
        return kernels::relative_error_to_fp32(kernels::DType::BF16, x, n, scaled.as<float>(), m, n, stream);
      };
      for (Tile& t : tiles) {
        kernels::launch_gemm(t.p, stream);
        t.err = error_of(t.p.c);
        if (!has_lt) continue;
        // (the bound for inputs within +-7.5 (random_e4m3's), times the scales (<= 2 each))
        t.vs_lt = kernels::compare(kernels::DType::BF16, t.p.c, n, theirs.get(), n, m, n, stream,
                                   kernels::gemm_tolerance(kernels::DType::BF16, k, 1, 7.5 * 2));
        if (!t.vs_lt->within())
          wrong = true, std::cerr << "WARNING: " << m << "x" << n << "x" << k << " " << t.label()
                                  << ": ours differs from cuBLASLt's: " << t.vs_lt->describe() << "\n";
      }
      double err_lt = 0, err_fast = 0;
      if (has_lt) {
        lt.run_fp8(kernels::DType::BF16, f, a.get(), b.get(), fast.get(), m, n, k, n, stream, true);
        err_lt = error_of(theirs.get()), err_fast = error_of(fast.get());
      }
      std::vector<std::function<void()>> fns;
      const int calls = o.calls;
      for (const Tile& t : tiles)
        fns.push_back([&t, &stream, calls] {
          for (int c = 0; c < calls; ++c) kernels::launch_gemm(t.p, stream);
        });
      if (has_lt)
        for (bool fast_accum : {false, true})
          fns.push_back([&, fast_accum, calls] {
            for (int c = 0; c < calls; ++c)
              lt.run_fp8(kernels::DType::BF16, f, a.get(), b.get(), theirs.get(), m, n, k, n, stream, fast_accum);
          });
      auto stats = rt::time_interleaved(fns, stream, o.warmup, o.iters, {}, o.gate ? &rt::thread_gate() : nullptr);
      for (rt::TimingStats& st : stats) st.median_ms /= calls;  // (per launch)
      for (size_t i = 0; i < tiles.size(); ++i) tiles[i].ms = stats[i].median_ms;
      if (o.phases)
        for (const Tile& t : tiles) print_phases(t.p, t.label(), stream);
      size_t best = 0;
      for (size_t i = 1; i < tiles.size(); ++i)
        if (tiles[i].ms < tiles[best].ms) best = i;
      const Tile& ours = tiles[best];
      const std::optional<kernels::CompareResult>& r = ours.vs_lt;
      const double lt_ms = has_lt ? stats[tiles.size()].median_ms : 0;
      const double fast_ms = has_lt ? stats[tiles.size() + 1].median_ms : 0;
      auto opt = [&](double v, int width) {
        std::ostringstream os;
        if (has_lt) os << std::fixed << std::setprecision(3) << v;
        return (std::ostringstream() << std::setw(width) << (has_lt ? os.str() : "-")).str();
      };
      const char* kname = kind == kernels::Scales::None ? "none" : kind == kernels::Scales::PerTensor ? "tensor" : "row";
      std::ostringstream shape;
      shape << m << "x" << n << "x" << k;
      std::cout << std::left << std::setw(20) << shape.str() << std::setw(8) << kname << std::right << std::fixed
                << std::setprecision(3) << std::setw(10) << ours.ms << std::setw(6) << fp8_tile_label(ours.tile)
                << opt(lt_ms, 12)
                << opt(fast_ms, 10) << std::setprecision(1) << std::setw(9) << flop / ours.ms / 1e9
                << opt(flop / lt_ms / 1e9, 9) << opt(lt_ms / ours.ms, 8) << std::setw(10);
      if (r) std::cout << std::setprecision(5) << r->rel_error();
      else std::cout << "-";
      std::cout << std::scientific << std::setprecision(2) << "   err " << ours.err;
      if (has_lt) std::cout << " / " << err_lt << " / " << err_fast;
      std::string variants;  // (each tile, stream-K and PDL: bn[/sk][/pdl]=ms)
      for (const Tile& t : tiles)
        variants += (variants.empty() ? "" : ";") + t.label() + "=" +
                    (std::ostringstream() << std::setprecision(4) << t.ms).str();
      if (tiles.size() > 1) std::cout << "   " << variants;
      else if (!ours.sk.empty()) std::cout << (ours.sk == "pair" ? "   pair split" : "   stream-K");
      std::cout << std::defaultfloat << "\n" << std::flush;
      if (csv) {
        auto ms_of = [&](int bm, int bn) {  // (the tile's fastest variant)
          double ms = 0;
          for (const Tile& t : tiles)
            if (t.tile == plan::TileShape{bm, bn} && (ms == 0 || t.ms < ms)) ms = t.ms;
          return ms > 0 ? (std::ostringstream() << ms).str() : std::string();
        };
        csv << m << "," << n << "," << k << "," << kname << "," << ours.ms << ",";
        if (has_lt) csv << lt_ms << "," << fast_ms;
        else csv << ",";
        csv << "," << flop / ours.ms / 1e9 << ",";
        if (has_lt) csv << lt_ms / ours.ms;
        csv << ",";
        if (r) csv << r->rel_error();
        csv << "," << ours.err << ",";
        if (has_lt) csv << err_lt << "," << err_fast;
        else csv << ",";
        csv << "," << fp8_tile_label(ours.tile);
        csv << "," << ms_of(128, 128) << "," << ms_of(128, 160) << "," << ms_of(128, 192);
        csv << "," << !ours.sk.empty() << "," << ms_of(128, 112) << "," << ms_of(64, 48) << "," << ms_of(64, 144) << ","
            << ms_of(128, 144);
        if (modes.size() > 1 || o.pdl == "both") csv << "," << variants;
        csv << "\n";
      }
    }
  }
  cublasDestroy(sgemm);
  cudaStreamDestroy(stream);
  if (wrong) {
    std::cerr << "bench-fp8: some results differ from cuBLASLt's beyond the bound (see the warnings)\n";
    return 1;
  }
  return 0;
}

}  // namespace

void add_bench_fp8_command(CLI::App& app, int& rc) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench-fp8", "Benchmark our GEMM with e4m3 inputs against cuBLASLt's FP8 matmul (torch._scaled_mm's; one GPU)");
  cmd->add_option("--shapes", opts->shapes, "Comma-separated MxNxK list (N and K multiples of 16)")
      ->capture_default_str();
  cmd->add_option("--scales", opts->scales, "Scale kinds: none, tensor (one fp32 each), row (m and n fp32)")
      ->capture_default_str();
  cmd->add_option("--tile", opts->tile,
                  "Our tiles, comma-separated: " + kernels::tile_names(kernels::kernel_tiles(true)) +
                      " (timed in turns; ours: the fastest), or all (the ops' tiles: " +
                      kernels::op_tile_names(true) + ")")
      ->capture_default_str();
  cmd->add_option("--stream-k", opts->stream_k,
                  "Stream-K where plan::stream_k_split puts it, on plan::stream_k_in_step_ctas' grid (auto), never "
                  "(off), or both timed in turns; or a comma-separated list of those, force (every grid of fewer "
                  "tiles than CTAs split, on all of its CTAs), pair (each tile's k-blocks split between the two "
                  "CTAs of a cluster, where two CTAs a tile fit the SMs) and tail (where the tiles fill more than a "
                  "wave and the last is partial: it and the whole wave before it split over all the CTAs), timed in "
                  "turns")
      ->capture_default_str();
  cmd->add_flag("!--no-gate", opts->gate,
                "Time without holding the stream until the host has queued a run (for profilers, which serialise "
                "launches: the hold would time out)");
  cmd->add_flag("--phases", opts->phases,
                "Also one traced launch per variant: when its CTAs started, did their last MMAs and stores, against "
                "the launch's time");
  cmd->add_option("--calls", opts->calls,
                  "Launches per timed run, back to back (the time per launch is reported; 1: each alone)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--pdl", opts->pdl,
                  "Our launches as programmatic dependent launches (the launch and set-up overlap the kernel "
                  "before): off, on, or both timed in turns")
      ->capture_default_str();
  cmd->add_option("--grid", opts->grid,
                  "CTAs of our launches (default: one per SM, at most one per SM with stream-K; auto splits over "
                  "their in-step grid, force over all of them)")
      ->check(CLI::Range(0, 1024));
  add_kernel_timing_options(cmd, opts->warmup, opts->iters, opts->device, opts->csv);
  cmd->callback([opts, &rc] { rc = run(*opts); });
}

}  // namespace flashoverlap::cli
