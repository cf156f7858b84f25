// flashoverlap-lab bench-gemm — our signalling GEMM against cuBLAS in one run:
// TFLOP/s per shape, tile configuration, reserved SMs and epilogue mode.
#include <cuda_runtime_api.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_parse.h"
#include "commands.h"
#include "lab/lab.h"
#include "flashoverlap/error.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "runtime/core/buffer.h"
#include "runtime/core/cublas.h"
#include "runtime/tune/owner_stand_in.h"
#include "plan/slot_map_reducescatter.h"
#include "plan/tile_grid.h"
#include "runtime/tune/timing.h"

namespace flashoverlap::cli {
namespace {

// The GEMM shape set: LLM projections, and a ragged M.
const char* kDefaultShapes =
    "2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,"
    "1024x8192x8192,8192x4096x2048,4096x7168x5120,3001x8192x8192";

struct Options {
  std::string shapes = kDefaultShapes;
  std::string dtype = "bf16";
  std::string tiles = "256,128";
  std::string reserve = "0,8,16,32";
  std::string modes = "plain,signal";
  std::string four = "on";  // 4 stages for the plain 128x256 store: on, off, both
  int warmup = 5, iters = 20, device = 0;
  bool gate = true;  // each timed run queued whole before the GPU starts it (host_gate.h)
  std::string csv, meta;
};

int run(const Options& o) {
  const auto shapes = parse_shapes(o.shapes);
  const auto tiles = parse_ints(o.tiles, "tile width");
  const auto reserves = parse_ints(o.reserve, "reserve");
  std::vector<bool> fours;
  if (o.four == "on") fours = {true};
  else if (o.four == "off") fours = {false};
  else if (o.four == "both") fours = {false, true};
  else throw InvalidArgument("--four-stages must be on, off or both");
  for (int t : tiles)
    if (!kernels::tile_supported(128, t)) throw InvalidArgument("unsupported tile 128x" + std::to_string(t));
  std::vector<kernels::DType> dtypes;
  if (o.dtype == "bf16" || o.dtype == "both") dtypes.push_back(kernels::DType::BF16);
  if (o.dtype == "fp16" || o.dtype == "both") dtypes.push_back(kernels::DType::FP16);
  if (dtypes.empty()) throw InvalidArgument("--dtype must be bf16, fp16 or both");
  bool do_plain = false, do_signal = false, do_owners = false, do_rs = false, do_rs_sub = false, do_rs_rows = false,
       do_rs_nvlink = false;
  for (const std::string& m : cli::split_list(o.modes)) {
    if (m == "plain") do_plain = true;
    else if (m == "signal") do_signal = true;
    else if (m == "owners") do_owners = true;
    else if (m == "rs") do_rs = true;
    else if (m == "rs-subtile") do_rs_sub = true;
    else if (m == "rs-rows") do_rs_rows = true;
    else if (m == "rs-nvlink") do_rs_nvlink = true;
    else
      throw InvalidArgument("--modes: unknown mode '" + m +
                            "' (plain, signal, owners, rs, rs-subtile, rs-rows, rs-nvlink)");
  }

  const std::optional<rt::DeviceInfo> gpu = open_kernel_bench_gpu("bench-gemm", o.device);
  if (!gpu) return 1;
  const rt::DeviceInfo& info = *gpu;

  cudaStream_t stream;
  FO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool wrong = false;  // a GEMM outside the bound of cuBLAS: the run fails at its end
  rt::CublasGemm cublas;

  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) throw Error("cannot write " + o.csv);
    csv << "M,N,K,dtype,tile,reserve_sms,mode,ours_ms,cublas_ms,ours_tflops,cublas_tflops,ratio_vs_cublas,rel_err\n";
  }
  std::cout << std::left << std::setw(18) << "shape" << std::setw(6) << "dtype" << std::setw(14) << "tile"
            << std::setw(8) << "reserve" << std::setw(8) << "mode" << std::right << std::setw(10) << "ours_ms"
            << std::setw(10) << "cublas_ms" << std::setw(9) << "ours_TF" << std::setw(9) << "cublas_TF"
            << std::setw(8) << "ratio" << "\n";

  for (const auto& dims : shapes) {
    if (dims[0] > INT32_MAX || dims[1] > INT32_MAX || dims[2] > INT32_MAX)
      throw InvalidArgument("shape too large for this benchmark");
    const struct {
      int m, n, k;
    } sh{int(dims[0]), int(dims[1]), int(dims[2])};
    for (kernels::DType dt : dtypes) {
      const char* dname = dt == kernels::DType::BF16 ? "bf16" : "fp16";
      rt::DeviceBuffer a(size_t(sh.m) * sh.k * 2), b(size_t(sh.n) * sh.k * 2), c(size_t(sh.m) * sh.n * 2),
          ref(size_t(sh.m) * sh.n * 2);
      kernels::fill_random(dt, a.get(), int64_t(sh.m) * sh.k, 1234 + sh.m, -1.f, 1.f, stream);
      kernels::fill_random(dt, b.get(), int64_t(sh.n) * sh.k, 5678 + sh.n, -1.f, 1.f, stream);
      const double flop = 2.0 * sh.m * sh.n * double(sh.k);
      for (int reserve : reserves) {
        const int sms = info.sms - reserve;
        cublas.set_sm_target(reserve ? sms : 0);
        // Every configuration of this shape and grid, timed in turns with cuBLAS.
        struct Config {
          int bn;
          bool four;  // ran with 4 stages
          int mode;  // 0 plain, 1 signal, 2 owners on one GPU, 3 rs (standard), 4 rs-subtile, 5 rs-rows, 6 rs-nvlink
          kernels::GemmParams p;
          double rel = -1;
          const rt::OwnerStandIn* owners = nullptr;  // mode 2
        };
        std::vector<Config> configs;
        std::vector<rt::DeviceBuffer> keep;  // slot buffers, counters, group tables
        // Mode "owners": the owner layout's kernel of rank 0 (registered
        // outputs, each CTA's last tile by TMA) with its peer's buffers as
        // stand-ins here (owner_stand_in.h): against the plain GEMM, what
        // that layout costs the GEMM itself (not NVLink, nor waiting for the
        // peer). Its C is not the GEMM's, so it is not compared with cuBLAS.
        std::vector<std::unique_ptr<rt::OwnerStandIn>> stand_ins;
        for (int bn : tiles) {
          plan::Schedule s = plan::make_schedule(sh.m, sh.n, {128, bn}, sms, plan::Raster::AlongN,
                                                 plan::default_swizzle(sms, {128, bn}, (sh.m + 127) / 128));
          const int tiles_total = s.tiles(), waves = s.waves();
          keep.emplace_back(size_t(tiles_total) * 128 * bn * 2);
          void* slots = keep.back().get();
          keep.emplace_back(size_t(waves) * 4);
          uint32_t* counters = keep.back().as<uint32_t>();
          FO_CUDA_CHECK(cudaMemset(counters, 0, size_t(waves) * 4));
          keep.emplace_back(size_t(tiles_total) * 4);
          int32_t* got = keep.back().as<int32_t>();
          std::vector<int32_t> group_of_tile(tiles_total);
          for (int t = 0; t < tiles_total; ++t) group_of_tile[t] = s.round_of(t);  // a group per wave: most signals
          FO_CUDA_CHECK(cudaMemcpy(got, group_of_tile.data(), size_t(tiles_total) * 4, cudaMemcpyHostToDevice));
          FO_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // (its DMA landed: buffer.h, copy_to_device)
          for (bool four : fours) {
            for (int mode = 0; mode < 7; ++mode) {
              if ((mode == 0 && !do_plain) || (mode == 1 && !do_signal) || (mode == 2 && !do_owners) ||
                  (mode == 3 && !do_rs) || (mode == 4 && !do_rs_sub) || (mode == 5 && !do_rs_rows) ||
                  (mode == 6 && !do_rs_nvlink))
                continue;
              kernels::GemmParams p;
              p.dtype = dt, p.a = a.get(), p.b = b.get(), p.m = sh.m, p.n = sh.n, p.k = sh.k, p.sched = s;
              p.four_stages = four;
              if (mode == 6) {
                // The ReduceScatter's NVLink form, rank 0 of 2, both ranks' windows stand-ins
                // here (so local stores, not NVLink): each row stored into its owner's block,
                // a system fence and a count at both ranks per half tile (kernels::Scatter).
                if (!plan::rs_layout_applies(s, 2, plan::RsLayout::Standard) || sh.n % 8 != 0) continue;
                keep.push_back(rt::to_device(plan::rs_peer_row_of(s, 2, 0)));
                p.row_of = keep.back().as<int32_t>();
                std::vector<void*> windows;
                std::vector<uint32_t*> arrivals;
                for (int r = 0; r < 2; ++r) {
                  keep.emplace_back(size_t(sh.m) * sh.n * 2);
                  windows.push_back(keep.back().get());
                }
                keep.emplace_back(2 * 4);
                FO_CUDA_CHECK(cudaMemset(keep.back().get(), 0, 8));
                for (int r = 0; r < 2; ++r) arrivals.push_back(keep.back().as<uint32_t>() + r);
                keep.push_back(rt::to_device(windows));
                p.scatter.rows = keep.back().as<void*>();
                keep.push_back(rt::to_device(arrivals));
                p.scatter.arrivals = keep.back().as<uint32_t*>();
                p.scatter.world = 2, p.scatter.rows_per_rank = sh.m;
                p.store = kernels::Store::SlotRows;
              } else if (mode >= 3) {
                // The ReduceScatter epilogue of rank 0 of 2 (a group per wave): each tile row
                // stored to its send slot row (runtime/ops/reducescatter.h), what that store costs the GEMM.
                const plan::RsLayout layout = mode == 4 ? plan::RsLayout::SubTile : plan::RsLayout::Standard;
                const bool rows_only = mode == 5;  // (the rows store where whole tiles could go by TMA: A/B)
                if (!plan::rs_layout_applies(s, 2, layout)) continue;
                const plan::SlotMap map =
                    plan::make_reducescatter_map(s, plan::make_groups(s, plan::Partition(size_t(waves), 1)), 2, 0, layout);
                keep.push_back(rt::to_device(map.row_of));
                p.row_of = keep.back().as<int32_t>();
                if (const std::vector<int32_t> first = plan::half_rows_of(map); !first.empty() && !rows_only) {
                  keep.push_back(rt::to_device(first));  // (half tiles by TMA, as the op does)
                  p.half_row = keep.back().as<int32_t>();
                }
                keep.emplace_back(size_t(map.send_rows) * bn * 2);
                p.store = kernels::Store::SlotRows, p.slots = keep.back().get(), p.slot_rows = map.send_rows;
                p.counters = counters, p.group_of_tile = got;
              } else if (mode != 1) {
                p.store = kernels::Store::Plain, p.c = c.get(), p.ldc = sh.n;
              } else {
                p.store = kernels::Store::SlotTiles, p.slots = slots, p.slot_rows = int64_t(tiles_total) * 128;
                p.counters = counters, p.group_of_tile = got;
              }
              // (the owner layout takes 4 stages where the plain store does)
              const bool ran_four = kernels::gemm_four_stages(p);
              if (four && !ran_four && fours.size() > 1) continue;  // "both": the 3-stage row is there already
              if (mode == 2) stand_ins.push_back(std::make_unique<rt::OwnerStandIn>(p, 0, 0, 1, 42));
              configs.push_back({bn, ran_four, mode, p, -1, mode == 2 ? stand_ins.back().get() : nullptr});
            }
          }
        }
        // Correctness first: poisoned output vs cuBLAS.
        cublas.run(dt, a.get(), b.get(), ref.get(), sh.m, sh.n, sh.k, sh.n, stream);
        for (Config& cf : configs) {
          if (cf.mode != 0) continue;
          kernels::poison(c.get(), int64_t(sh.m) * sh.n, stream);
          kernels::launch_gemm(cf.p, stream);
          const auto r = kernels::compare(dt, c.get(), sh.n, ref.get(), sh.n, sh.m, sh.n, stream,
                                          kernels::gemm_tolerance(dt, sh.k));
          cf.rel = r.rel_error();
          if (!r.within())
            wrong = true, std::cerr << "WARNING: " << sh.m << "x" << sh.n << "x" << sh.k << " tile 128x" << cf.bn
                      << ": result differs from cuBLAS: " << r.describe() << "\n";
        }
        std::vector<std::function<void()>> fns = {
            [&] { cublas.run(dt, a.get(), b.get(), ref.get(), sh.m, sh.n, sh.k, sh.n, stream); }};
        for (const Config& cf : configs)
          fns.push_back([&cf, stream, call = uint32_t(0)]() mutable {
            if (!cf.owners) return kernels::launch_gemm(cf.p, stream);
            kernels::GemmParams p = cf.p;
            cf.owners->prepare_call(p, ++call);
            kernels::launch_gemm(p, stream);
          });
        const auto stats =
            rt::time_interleaved(fns, stream, o.warmup, o.iters, {}, o.gate ? &rt::thread_gate() : nullptr);
        const double cub_ms = stats[0].median_ms, cub_tf = flop / cub_ms / 1e9;
        for (const Config& cf : configs) {  // (a wait or call check of the owners' stand-in that failed: its times wait)
          if (!cf.owners) continue;
          kernels::WaitError e{};
          FO_CUDA_CHECK(cudaMemcpy(&e, cf.owners->error().get(), sizeof(e), cudaMemcpyDeviceToHost));
          if (e.failed)
            wrong = true, std::cerr << "WARNING: " << sh.m << "x" << sh.n << "x" << sh.k << " tile 128x" << cf.bn
                                    << ": the owners stand-in's wait or call check failed (code " << e.failed
                                    << "): its time includes that wait\n";
        }
        for (size_t i = 0; i < configs.size(); ++i) {
          const Config& cf = configs[i];
          const double ours_ms = stats[i + 1].median_ms, ours_tf = flop / ours_ms / 1e9;
          std::ostringstream shape;
          shape << sh.m << "x" << sh.n << "x" << sh.k;
          const char* mname = cf.mode == 0   ? "plain"
                              : cf.mode == 1 ? "signal"
                              : cf.mode == 2 ? "owners"
                              : cf.mode == 3 ? "rs"
                              : cf.mode == 4 ? "rs-sub"
                              : cf.mode == 5 ? "rs-rows"
                                             : "rs-nv";
          const std::string tname = "128x" + std::to_string(cf.bn) + (cf.four ? "/4st" : "");
          std::cout << std::left << std::setw(18) << shape.str() << std::setw(6) << dname
                    << std::setw(14) << tname << std::setw(8) << reserve << std::setw(8) << mname
                    << std::right << std::fixed << std::setprecision(3) << std::setw(10) << ours_ms << std::setw(10)
                    << cub_ms << std::setprecision(1) << std::setw(9) << ours_tf << std::setw(9) << cub_tf
                    << std::setprecision(3) << std::setw(8) << ours_tf / cub_tf << "\n"
                    << std::flush;
          if (csv)
            csv << sh.m << "," << sh.n << "," << sh.k << "," << dname << "," << tname << "," << reserve << ","
                << mname << "," << ours_ms << "," << cub_ms << "," << ours_tf << "," << cub_tf << ","
                << ours_tf / cub_tf << "," << cf.rel << "\n";
        }
      }
    }
  }
  cublas.set_sm_target(0);
  if (!o.meta.empty()) {
    std::ofstream meta(o.meta);
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    meta << "{\n  \"gpu\": \"" << info.name << "\",\n  \"sms\": " << info.sms << ",\n  \"world\": 1,\n"
         << "  \"cuda_driver\": " << info.driver << ",\n  \"cuda_runtime\": " << info.runtime
         << ",\n  \"cublas\": " << info.cublas << ",\n  \"nccl\": " << info.nccl << ",\n  \"date\": \""
         << std::put_time(std::gmtime(&now), "%Y-%m-%dT%H:%M:%SZ") << "\",\n  \"warmup\": " << o.warmup
         << ",\n  \"iters\": " << o.iters << ",\n  \"statistic\": \"median of per-run CUDA event times, "
         << (o.gate ? "each run queued whole before the GPU starts it (device time only)"
                    : "the host's launch included (--no-gate)")
         << "\"\n}\n";
  }
  cudaStreamDestroy(stream);
  if (wrong) {
    std::cerr << "bench-gemm: some results differ from cuBLAS beyond the bound (see the warnings)\n";
    return 1;
  }
  return 0;
}

}  // namespace

std::optional<rt::DeviceInfo> open_kernel_bench_gpu(const char* command, int device) {
  if (const rt::GpuProbe probe = rt::probe_gpus(); probe.hopper < 1) {
    std::cerr << command << ": no Hopper (sm_90) GPU found (" << probe.reason << "); nothing to measure.\n";
    return std::nullopt;
  }
  FO_CUDA_CHECK(cudaSetDevice(device));
  const rt::DeviceInfo info = rt::device_info(device);
  kernels::preload_kernels();
  std::cout << "# " << info.summary() << "\n";
  return info;
}

void add_kernel_timing_options(CLI::App* cmd, int& warmup, int& iters, int& device, std::string& csv) {
  cmd->add_option("--warmup", warmup, "Warm-up runs")->capture_default_str()->check(integer_at_least(0));
  cmd->add_option("--iters", iters, "Timed runs (median reported)")->capture_default_str()->check(integer_at_least(1));
  cmd->add_option("--device", device, "CUDA device")->capture_default_str();
  cmd->add_option("--csv", csv, "Write the table as CSV");
}

void add_bench_gemm_command(CLI::App& app, int& rc) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench-gemm", "Benchmark our signalling GEMM against cuBLAS (one GPU)");
  cmd->add_option("--shapes", opts->shapes, "Comma-separated MxNxK list")->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "bf16, fp16 or both")->capture_default_str();
  cmd->add_option("--tiles", opts->tiles, "Tile widths (128xN) to run: 256,128")->capture_default_str();
  cmd->add_option("--reserve-sms", opts->reserve, "SMs left free (GEMM grid = SMs - reserve), list")
      ->capture_default_str();
  cmd->add_option("--modes", opts->modes,
                  "Comma-separated: plain, signal, owners (the owner layout's kernel of rank 0 on this one GPU, its "
                  "peer's buffers local stand-ins: what that layout costs the GEMM itself), rs, rs-subtile (the "
                  "GEMM + ReduceScatter epilogue of rank 0 of 2, standard or sub-tile layout: each tile row stored "
                  "to its send slot row, whole tiles by TMA where the map keeps each tile's rows together, a "
                  "signal per wave), rs-rows (the standard map stored row by row: A/B), rs-nvlink (the ReduceScatter's "
                  "NVLink form: rows into the owners' windows, both ranks' windows local stand-ins)")
      ->capture_default_str();
  cmd->add_option("--four-stages", opts->four,
                  "The plain 128x256 store with 4 stages (its output staged in two pieces): on, off or both "
                  "(each timed in turns; '/4st' in the tile column)")
      ->capture_default_str();
  add_kernel_timing_options(cmd, opts->warmup, opts->iters, opts->device, opts->csv);
  cmd->add_flag("!--no-gate", opts->gate,
                "Time the host's launch too: by default the stream is held before each timed run until the host has "
                "queued it, so that only device time is timed (cuBLAS's host work per call is several times ours)");
  cmd->add_option("--meta", opts->meta, "Write GPU/versions/date as JSON");
  cmd->callback([opts, &rc] { rc = run(*opts); });
}

}  // namespace flashoverlap::cli
