// gemm_sm90.cu — host side of the signalling GEMM: validation, TMA tensor
// maps, kernel selection and launch.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "flashoverlap/error.h"
#include "kernels/cuda_check.h"
#include "kernels/gemm.h"
#include "kernels/gemm_sm90.cuh"

namespace flashoverlap::kernels {
namespace {

// Stages per tile configuration: as many as fit next to the epilogue buffer
// (and, 16-bit, the owner layout's staging) in the 227 KB a CTA may use.
constexpr int kStages256 = 3;      // 3 x 48 KB + 64 KB
constexpr int kStages128 = 5;      // 5 x 32 KB + 32 KB
constexpr int kStages128Fp8 = 6;   // 6 x 32 KB + 32 KB (no owner staging)
constexpr int kStages192 = 4;      // 4 x 40 KB + 48 KB (FP8)
constexpr int kStages160 = 5;      // 5 x 36 KB + 40 KB (FP8)
constexpr int kStages144 = 5;      // 5 x 34 KB + 36 KB (FP8)
constexpr int kStages112 = 6;      // 6 x 30 KB + 28 KB (FP8)
constexpr int kStages64x48 = 15;   // 15 x 14 KB + 6 KB (FP8, 64-row tiles: 8 KB of A a stage)
constexpr int kStages64x144 = 7;   // 7 x 26 KB + 18 KB (FP8)
template <int BN, typename TIn, int BM = 128>
constexpr int kStagesOf = BM == 64                                 ? (BN == 48 ? kStages64x48 : kStages64x144)
                          : BN == 256                              ? kStages256
                          : BN == 192                              ? kStages192
                          : BN == 160                              ? kStages160
                          : BN == 144                              ? kStages144
                          : BN == 112                              ? kStages112
                          : std::is_same_v<TIn, __nv_fp8_e4m3> ? kStages128Fp8
                                                                   : kStages128;

template <int BN, typename T, typename TIn = T, bool kSplit = false, bool kPairK = false, int BM = 128>
auto kernel_for() {
  return &gemm_sm90_kernel<BN, kStagesOf<BN, TIn, BM>, T, false, false, TIn, kSplit, kPairK, BM>;
}
// The FP8 kernel of a tile and output type: whole tiles, stream-K or the
// pair split (BM 64: whole tiles only; the host refuses the others).
template <int BN, typename T, int BM = 128>
auto fp8_kernel_for(bool split, bool pair) {
  if constexpr (BM == 64)
    return kernel_for<BN, T, __nv_fp8_e4m3, false, false, 64>();
  else
    return pair    ? kernel_for<BN, T, __nv_fp8_e4m3, false, true>()
           : split ? kernel_for<BN, T, __nv_fp8_e4m3, true>()
                   : kernel_for<BN, T, __nv_fp8_e4m3, false>();
}
// The kernel of a tile, output and input type, with or without stream-K.
template <int BN, typename T, typename TIn = T>
auto kernel_for(bool split) {
  return split ? kernel_for<BN, T, TIn, true>() : kernel_for<BN, T, TIn, false>();
}
// kernel<<<grid, block, smem, stream>>>(args...), or with pdl the same as a
// programmatic dependent launch (GemmParams::pdl).
// cluster > 1: in clusters of that many CTAs along x.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, int smem, cudaStream_t stream, bool pdl, int cluster,
            const Args&... args) {
  if (!pdl && cluster <= 1) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return;
  }
  cudaLaunchAttribute attrs[2]{};
  unsigned count = 0;
  if (pdl) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count++].val.clusterDim = {unsigned(cluster), 1, 1};
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = size_t(smem), cfg.stream = stream;
  cfg.attrs = attrs, cfg.numAttrs = count;
  (void)cudaLaunchKernelEx(&cfg, kernel, args...);  // (its error: the caller's cudaGetLastError)
}
template <int BN, typename TIn = __half, int BM = 128>
constexpr int smem_for() {
  constexpr bool fp8 = std::is_same_v<TIn, __nv_fp8_e4m3>;
  return GemmSmem<BN, kStagesOf<BN, TIn, BM>, false, !fp8, BM>::kDynamicBytes;
}
// An FP8 tile's kernel in the output type (bf: bf16, else fp16) and its
// dynamic shared memory.
template <int BN, int BM = 128>
std::pair<decltype(fp8_kernel_for<128, __half>(false, false)), int> fp8_launch_of(bool bf, bool split, bool pair) {
  return {bf ? fp8_kernel_for<BN, __nv_bfloat16, BM>(split, pair) : fp8_kernel_for<BN, __half, BM>(split, pair),
          smem_for<BN, __nv_fp8_e4m3, BM>()};
}
// The plain store with 4 stages (GemmParams::four_stages): 4 x 48 KB + 2 x 16 KB.
template <typename T, bool kWide = false>
auto pieces_kernel() {
  return &gemm_sm90_kernel<256, 4, T, true, kWide>;
}
constexpr int kPiecesSmem = GemmSmem<256, 4, true>::kDynamicBytes;
static_assert(kPiecesSmem <= 227 * 1024, "four stages do not fit");

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const auto fn = driver_entry_point<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

// A 2D row-major tensor [rows x cols] of 2-byte elements (1-byte: e4m3, as
// UINT8), `ld` elements per row, read or written in boxes of box_rows rows x
// 128 bytes with 128-byte swizzle (box_bytes 64: 64 bytes, 64-byte swizzle,
// 32 columns past a tile's 64-column chunks (128x160, 128x112, 64x48); 32:
// 32 bytes, 32-byte swizzle, a tile's last 16 columns (128x112, 64x48, 64x144)).
CUtensorMap make_map(const void* base, uint64_t rows, uint64_t cols, uint64_t ld, uint32_t box_rows,
                     CUtensorMapDataType dt, const char* what, uint32_t box_bytes = 128) {
  CUtensorMap map;
  const uint32_t bytes = dt == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {ld * bytes};
  const cuuint32_t box[2] = {box_bytes / bytes, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = encode_fn()(&map, dt, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE,
                           box_bytes == 64   ? CU_TENSOR_MAP_SWIZZLE_64B
                           : box_bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                             : CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream os;
    os << "cuTensorMapEncodeTiled failed (CUresult " << int(r) << ") for " << what << " [" << rows << " x " << cols
       << ", ld " << ld << ", box " << box_rows << " x " << box_bytes / bytes << "]";
    throw Error(os.str());
  }
  return map;
}

// k-blocks along K: 128 bytes of each row of A and B (64 16-bit or 128 e4m3 elements).
int32_t k_blocks_of(const GemmParams& p) {
  const int32_t per_block = p.fp8.on ? 128 : 64;
  return (p.k + per_block - 1) / per_block;
}

// A device attribute, asked once per device.
std::atomic<int> g_sms[64], g_l2_bytes[64];
int device_attribute(int dev, cudaDeviceAttr attr, std::atomic<int> (&cache)[64]) {
  int v = cache[dev % 64].load(std::memory_order_relaxed);
  if (v == 0) {
    FO_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    cache[dev % 64].store(v, std::memory_order_relaxed);
  }
  return v;
}

std::string shape_str(const GemmParams& p) {
  std::ostringstream os;
  os << "GEMM m=" << p.m << " n=" << p.n << " k=" << p.k << " tile " << p.sched.bm << "x" << p.sched.bn << " ctas "
     << p.sched.ctas;
  return os.str();
}

}  // namespace

const std::vector<plan::TileShape>& op_tiles(bool fp8) {
  static const std::vector<plan::TileShape> same = {{128, 256}, {128, 128}},
                                            e4m3 = {{128, 192}, {128, 160}, {128, 144}, {128, 128}, {128, 112}};
  return fp8 ? e4m3 : same;
}

namespace {
bool has_tile(const std::vector<plan::TileShape>& tiles, int bm, int bn) {
  return std::find(tiles.begin(), tiles.end(), plan::TileShape{bm, bn}) != tiles.end();
}
}  // namespace

bool op_tile_supported(int bm, int bn, bool fp8) { return has_tile(op_tiles(fp8), bm, bn); }

std::string tile_names(const std::vector<plan::TileShape>& tiles) {
  std::string out;
  for (const plan::TileShape& t : tiles)  // (plan::to_string's form; fo_kernels links no fo_plan)
    out += (out.empty() ? "" : ", ") + std::to_string(t.bm) + "x" + std::to_string(t.bn);
  return out;
}

std::string op_tile_names(bool fp8) { return tile_names(op_tiles(fp8)); }

const std::vector<plan::TileShape>& kernel_tiles(bool fp8) {
  static const std::vector<plan::TileShape> e4m3 = [] {
    std::vector<plan::TileShape> v = op_tiles(true);
    v.insert(v.end(), {{64, 48}, {64, 144}});  // (the lab's only: no slots or signals)
    return v;
  }();
  return fp8 ? e4m3 : op_tiles(false);
}

bool tile_supported(int bm, int bn, bool fp8) { return has_tile(kernel_tiles(fp8), bm, bn); }

namespace {
// The FP8 tiles only the lab launches (the 64-row ones).
bool lab_fp8_tile(int bm, int bn) { return tile_supported(bm, bn, true) && !op_tile_supported(bm, bn, true); }
}  // namespace

void check_gemm_params(const GemmParams& p) {
  auto fail = [&](const std::string& why) { throw InvalidArgument(shape_str(p) + ": " + why); };
  if (p.m < 1 || p.n < 1 || p.k < 1) fail("m, n and k must be >= 1");
  if (p.k % 8 != 0) fail("k must be a multiple of 8 (rows of A and B must be 16-byte multiples for TMA)");
  const Grouped& g = p.grouped;
  if (!tile_supported(p.sched.bm, p.sched.bn, p.fp8.on)) {
    const std::string fp8 = tile_names(kernel_tiles(true));
    fail(p.fp8.on ? "fp8: tiles " + fp8 + " (a sum and its parts in the consumers' registers)"
                  : "unsupported tile shape (supported: " + op_tile_names(false) + "; FP8: " + fp8 + ")");
  }
  if (p.sched.m != p.m || p.sched.n != p.n) fail("schedule shape does not match the GEMM shape");
  if (p.sched.ctas < 1) fail("ctas must be >= 1");
  if (p.sched.swizzle < 1) fail("swizzle must be >= 1");
  if (!p.a || !p.b) fail("A and B must be non-null");
  if (!aligned16(p.a) || !aligned16(p.b)) fail("A and B must be 16-byte aligned");
  switch (p.store) {
    case Store::Plain:
      if (!p.c) fail("C must be non-null");
      if (p.ldc < p.n) fail("ldc must be >= n");
      break;
    case Store::SlotTiles:
      if (!p.slots || !aligned16(p.slots)) fail("slot buffer must be non-null and 16-byte aligned");
      if (p.slot_rows < int64_t(p.sched.tiles()) * p.sched.bm) fail("slot buffer has fewer than tiles*bm rows");
      break;
    case Store::SlotRows:
      if (p.scatter.world == 0 && (!p.slots || !aligned16(p.slots)))
        fail("slot buffer must be non-null and 16-byte aligned");
      if (!p.row_of && !p.half_row) fail("SlotRows needs the row_of or the half_row table");
      break;
    default:
      fail("unknown store mode");
  }
  if (p.counters && !p.group_of_tile) fail("signalling needs group_of_tile");
  const bool tma_c = p.store == Store::Plain && aligned16(p.c) && p.ldc % 8 == 0 && p.n % 8 == 0;
  if (p.monitor_ns && !p.monitor_sm) fail("monitor needs both monitor_ns and monitor_sm");
  if (g.a_row0 || g.b_row0 || g.rows) {
    if (!g.a_row0 || !g.b_row0 || !g.rows) fail("grouped: needs its three tables (a_row0, b_row0, rows)");
    if (g.a_rows < 1 || g.a_rows > INT32_MAX || g.b_rows < p.n || g.b_rows > INT32_MAX)
      fail("grouped: a_rows in [1, 2^31) and b_rows in [n, 2^31)");
    if (!(p.store == Store::Plain || (p.store == Store::SlotRows && p.row_of && !p.half_row)))
      fail("grouped: Plain C or SlotRows by row_of");
    if (p.owner.rank >= 0) fail("grouped: not with the owner layout");
    if (p.monitor_phases) fail("grouped: no phase monitor (a ragged tile row's tiles are stored by the consumers)");
  }
  const plan::StreamK& sk = p.stream_k;
  if (sk.on()) {
    if (sk.tiles != p.sched.tiles() || sk.ctas != p.sched.ctas || sk.k_blocks != k_blocks_of(p) || sk.whole < 0)
      fail("stream-K: its tiles, CTAs and k-blocks must be this launch's");
    if (!p.stream_k_work || !aligned16(p.stream_k_work)) fail("stream-K: needs its workspace (16-byte aligned)");
    if (sk.ctas > kStreamKMaxCtas) fail("stream-K: at most " + std::to_string(kStreamKMaxCtas) + " CTAs");
    if (!(p.store == Store::Plain || p.store == Store::SlotTiles) || p.owner.rank >= 0 || p.scatter.world > 0 ||
        g.a_row0 || p.monitor_ns || p.monitor_mma)  // (the tile monitors are per tile; the phase monitor per CTA)
      fail("stream-K: Plain or SlotTiles stores only, without the owner layout, scatter, grouped GEMM or tile "
           "monitors");
  }
  const Fp8& f8 = p.fp8;
  if (f8.on) {
    if (p.k % 16 != 0) fail("fp8: k must be a multiple of 16 (rows of A and B 16-byte multiples for TMA)");
    if (p.sched.bn != 128 && p.scatter.world > 0) fail("fp8: the scatter epilogue takes 128x128 tiles");
    if (p.owner.rank >= 0 || g.a_row0) fail("fp8: not with the owner layout or the grouped GEMM yet");
    if (p.sched.bm == 64 && (p.store != Store::Plain || p.stream_k.on() || p.pair_k || p.counters ||
                             p.monitor_ns || p.monitor_mma || p.scatter.world > 0))
      fail("fp8: 64-row tiles store a plain C, whole, without signals or tile monitors");
  }
  if (f8.scales != Scales::None && f8.scales != Scales::PerTensor && f8.scales != Scales::RowWise)
    fail("fp8: unknown scale kind");
  if (!f8.on && (f8.scales != Scales::None || f8.scale_a || f8.scale_b))
    fail("scales are for FP8 inputs (Fp8::on)");
  if (p.pair_k) {
    if (!f8.on) fail("pair_k: FP8 inputs only");
    if (p.stream_k.on() || p.pdl) fail("pair_k: not with stream-K or PDL");
    if (int64_t(p.sched.ctas) != 2 * int64_t(p.sched.tiles()))
      fail("pair_k: two CTAs a tile (ctas = 2 x tiles = " + std::to_string(2 * int64_t(p.sched.tiles())) + ")");
    if (k_blocks_of(p) < 2) fail("pair_k: k of two k-blocks (128 each) at least");
    if (!(p.store == Store::Plain || p.store == Store::SlotTiles) || p.counters || p.monitor_ns || p.monitor_mma ||
        p.scatter.world > 0)
      fail("pair_k: Plain or SlotTiles stores, without signals, tile monitors or the scatter");
  }
  if (f8.on && f8.scales != Scales::None &&
      (!f8.scale_a || !f8.scale_b || reinterpret_cast<uintptr_t>(f8.scale_a) % 4 != 0 ||
       reinterpret_cast<uintptr_t>(f8.scale_b) % 4 != 0))
    fail("fp8: scales need both scale_a and scale_b, 4-byte aligned fp32 in device memory");
  if (f8.on && f8.scales == Scales::None && (f8.scale_a || f8.scale_b))
    fail("fp8: scale pointers given with Scales::None");
  const Scatter& sc = p.scatter;
  if (sc.world < 0 || sc.world > 8) fail("scatter: world must be in [0, 8]");
  if (sc.world > 0 && (p.store != Store::SlotRows || !p.row_of || p.half_row || p.n % 8 != 0 || !sc.rows ||
                       !sc.arrivals || sc.rows_per_rank < 1 || p.owner.rank >= 0 || p.counters))
    fail("scatter: needs SlotRows by row_of (no half_row), n % 8 == 0, the ranks' receive rows and arrival "
         "counters, rows_per_rank >= 1, and no counters or owner layout besides");
  const Owner& o = p.owner;
  if (o.rank >= 0) {
    if (o.world < 2 || o.world > 8 || o.rank >= o.world) fail("owner layout: world must be in [2, 8], rank below it");
    if (o.walk != OwnerWalk::Pair && o.walk != OwnerWalk::Ranges) fail("owner layout: unknown walk");
    if (o.walk == OwnerWalk::Pair && o.world != 2) fail("owner layout: the pair walk is for 2 ranks (more: Ranges)");
    if (!tma_c) fail("owner layout: needs Plain C stored by TMA (16-byte aligned, ldc % 8 == 0, n % 8 == 0)");
    if (!o.peer_window || !aligned16(o.peer_window)) fail("owner layout: needs the peer's 16-byte aligned window");
    if (o.claims_reset && o.claims_reset == o.claims)
      fail("owner layout: the claims reset are the next call's, not this call's");
    if (!o.window || !aligned16(o.window) || !o.flags || !o.peer_flags || !o.claims || !o.err || !p.group_of_tile)
      fail("owner layout: needs its 16-byte aligned window, both ranks' flags, claims, an error slot and "
           "group_of_tile");
    if (o.split < 0 || o.split > p.sched.tiles()) fail("owner layout: split outside [0, tiles]");
    if (o.row0 < 0 || o.row0 + int64_t(p.sched.tiles_m()) * p.sched.bm > o.window_rows)
      fail("owner layout: this call's rows lie outside the window");
    if (o.in_place && (p.c != static_cast<const char*>(o.window) + o.row0 * int64_t(p.n) * 2 || p.ldc != p.n))
      fail("owner layout in place: C must be the window at row0, n elements per row");
    if (p.counters || p.monitor_ns)
      fail("owner layout: its tiles are counted in the owner flags only (no counters or monitor_ns)");
    if (o.push_tma < 0 || o.push_tma > 2) fail("owner layout: push_tma must be 0, 1 or 2");
    if ((o.publish.slots != nullptr) != (o.check.slots != nullptr) || o.check.tokens || o.check.parity < 0 ||
        o.check.parity > 1)
      fail("owner layout: the call check publishes and checks, both or neither, without tokens, parity 0 or 1");
    if (o.push_tma > 0 && (!o.push_window || !aligned16(o.push_window) || !gemm_four_stages(p)))
      fail("owner layout: TMA pushes need the peer's 16-byte aligned window and the 4-stage pipeline");
    if (o.walk == OwnerWalk::Ranges) {
      const int32_t tiles = p.sched.tiles();
      if (!gemm_four_stages(p) || !o.pushers || o.push_tma != 0)
        fail("owner layout, walk of any world: needs the 4-stage pipeline and the pusher warps, no TMA pushes");
      if (!o.flags_of || !o.windows_of || (o.finals_in_c && (!o.outs_of || !o.lds_of)))
        fail("owner layout, walk of any world: needs every rank's flags and window (and C, finals_in_c)");
      if (o.own_begin != owned_begin(o.rank, tiles, o.world) || o.own_end != owned_end(o.rank, tiles, o.world))
        fail("owner layout, walk of any world: own_begin, own_end must be this rank's range (owner_ranges.h)");
      if (int64_t(tiles) * o.world >= INT32_MAX) fail("owner layout, walk of any world: too many tiles");
      if (o.in_place && o.finals_in_c) fail("owner layout: in place or finals into the peers' C, not both");
    } else if ((o.peer_out != nullptr) != o.finals_in_c)
      fail("owner layout: finals into the peer's C (peer_out) go with the peer's finals into this C (finals_in_c)");
    if (o.walk == OwnerWalk::Pair && o.finals_in_c &&  // (more ranks: the runtime checks each rank's C when it registers it)
        (o.in_place || !aligned16(o.peer_out) || o.peer_ld < p.n || o.peer_ld % 8 != 0 || !gemm_four_stages(p)))
      fail("owner layout: finals into the peers' C need the 4-stage pipeline, not in place, and a 16-byte aligned "
           "peer C with ld >= n, ld % 8 == 0");
  } else if (p.owner.push_tma != 0 || p.owner.finals_in_c || p.owner.publish.slots || p.owner.check.slots ||
             p.owner.claims_reset || p.owner.peer_window) {
    fail("push_tma, finals_in_c, the peer's window, the claims and the owner call check are for the owner layout");
  }
}

void preload_gemm_kernels();
namespace {
void preload_lab_gemm_kernels();
}  // namespace

bool gemm_four_stages(const GemmParams& p) {
  // The plain store, signalling or not (piece_storer); or the owner layout
  // (the peer's finals are copied through registers, no shared memory to
  // spare). Not: the tile-end monitor.
  const bool owner_ok = p.owner.rank < 0 || !p.counters;  // (owner: n % 8 == 0 checked already)
  return p.four_stages && p.sched.bn == 256 && p.store == Store::Plain && aligned16(p.c) && p.ldc % 8 == 0 &&
         !p.monitor_ns && owner_ok && !p.grouped.a_row0 && !p.fp8.on && !p.stream_k.on();
}

bool gemm_l2_hints(const GemmParams& p, int64_t l2_bytes) {
  if (!p.fp8.on) return false;  // (measured on the FP8 kernels only)
  if (l2_bytes < 0) {
    int dev = 0;
    FO_CUDA_CHECK(cudaGetDevice(&dev));
    l2_bytes = device_attribute(dev, cudaDevAttrL2CacheSize, g_l2_bytes);
  }
  const int64_t b_rows = p.grouped.a_row0 ? p.grouped.b_rows : p.n;
  return b_rows * p.k > l2_bytes;  // (e4m3: a byte each)
}

void launch_gemm(const GemmParams& p, cudaStream_t stream) {
  check_gemm_params(p);
  int dev = 0;
  FO_CUDA_CHECK(cudaGetDevice(&dev));
  static std::once_flag once[64], lab_once[64];  // (shared-memory limits are per device: set them once on each)
  std::call_once(once[dev % 64], preload_gemm_kernels);
  if (p.pair_k || (p.fp8.on && lab_fp8_tile(p.sched.bm, p.sched.bn)))  // (the lab's kernels: not in every process)
    std::call_once(lab_once[dev % 64], preload_lab_gemm_kernels);
  if (p.stream_k.on()) {  // (a finisher waits for CTAs of lower index: all must be resident at once)
    const int sms = device_attribute(dev, cudaDevAttrMultiProcessorCount, g_sms);
    if (p.sched.ctas > sms)
      throw InvalidArgument(shape_str(p) + ": stream-K: at most one CTA per SM (" + std::to_string(sms) + "), got " +
                            std::to_string(p.sched.ctas));
  }
  const CUtensorMapDataType dt =
      p.dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUtensorMapDataType dt_in = p.fp8.on ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : dt;  // (e4m3: TMA moves bytes)
  const int bn = p.sched.bn;
  const bool grouped = p.grouped.a_row0 != nullptr;  // (A's and B's rows: the experts', all of them)
  const CUtensorMap ma = make_map(p.a, grouped ? p.grouped.a_rows : p.m, p.k, p.k, uint32_t(p.sched.bm), dt_in, "A");
  const CUtensorMap mb = make_map(p.b, grouped ? p.grouped.b_rows : p.n, p.k, p.k, bn, dt_in, "B");

  GemmKernelParams kp{};
  kp.sched = p.sched;
  kp.k_blocks = k_blocks_of(p);
  kp.fp8 = p.fp8;
  if (p.stream_k.on()) {  // (read by the stream-K kernels only)
    kp.sk = p.stream_k;
    kp.sk_work.flags = static_cast<uint32_t*>(p.stream_k_work);
    kp.sk_work.partials = reinterpret_cast<float*>(static_cast<char*>(p.stream_k_work) + kStreamKFlagBytes);
  }
  kp.store = static_cast<int32_t>(p.store);
  kp.counters = p.counters;
  kp.group_of_tile = p.group_of_tile;
  kp.scatter = p.scatter;
  kp.monitor_ns = p.monitor_ns;
  kp.monitor_sm = p.monitor_sm;
  kp.monitor_mma = p.monitor_mma;
  kp.monitor_phases = p.monitor_phases;
  kp.owner = p.owner;
  kp.grouped = p.grouped;
  kp.l2_hints = gemm_l2_hints(p, device_attribute(dev, cudaDevAttrL2CacheSize, g_l2_bytes));
  // (tail: 32 columns past a tile's 64-column chunks, 32-column boxes; tail16: its last 16 columns)
  CUtensorMap mc{}, tail{}, tail16{};
  const bool tail32 = bn % 64 >= 32, tail16_on = bn % 32 == 16;  // (160, 112, 48; 112, 48, 144)
  if (p.store == Store::Plain && aligned16(p.c) && p.ldc % 8 == 0) {
    kp.tma_store = true;
    kp.ld_out = p.ldc;
    kp.out = p.c;  // (grouped: the ragged tile rows' rows, which the consumers store)
    mc = make_map(p.c, grouped ? p.grouped.a_rows : p.m, p.n, p.ldc, 64, dt, "C");
    if (tail32) tail = make_map(p.c, p.m, p.n, p.ldc, 64, dt, "C (32 columns of a tile)", 64);
    if (tail16_on) tail16 = make_map(p.c, p.m, p.n, p.ldc, 64, dt, "C (a tile's last 16 columns)", 32);
  } else if (p.store == Store::SlotTiles || (p.store == Store::SlotRows && p.half_row)) {
    kp.tma_store = true;
    kp.ld_out = bn;
    kp.half_row = p.store == Store::SlotRows ? p.half_row : nullptr;
    mc = make_map(p.slots, p.slot_rows, bn, bn, 64, dt, "slot buffer");
    if (tail32) tail = make_map(p.slots, p.slot_rows, bn, bn, 64, dt, "slot buffer (32 columns of a tile)", 64);
    if (tail16_on)
      tail16 = make_map(p.slots, p.slot_rows, bn, bn, 64, dt, "slot buffer (a tile's last 16 columns)", 32);
  } else if (p.scatter.world > 0) {  // (the storer warp stores the rows: no TMA map for C)
    kp.tma_store = true;
    kp.ld_out = p.n;
    kp.row_of = p.row_of;
  } else {
    kp.tma_store = false;
    kp.out = p.store == Store::Plain ? p.c : p.slots;
    kp.ld_out = p.store == Store::Plain ? p.ldc : bn;
    kp.row_of = p.store == Store::SlotRows ? p.row_of : nullptr;
  }
  // The owner layout: the peer's partials are loaded from the window read
  // from (Owner::window: this GPU's) into the
  // staging buffer (the same box and swizzle as C's stores), and its copy of
  // the peer's tiles writes C directly.
  // (The tail maps go in the owner window's and push's places, which FP8 never takes.)
  CUtensorMap mw = tail32 ? tail : mc, mp = tail16_on ? tail16 : mc, mq = mc;
  if (p.owner.rank >= 0) {
    mw = make_map(p.owner.window, p.owner.window_rows, p.n, p.n, 64, dt, "owner window");
    kp.out = p.c;
    if (p.owner.push_tma > 0)  // this call's rows of the peer's window, written by TMA (Owner::push_tma):
      // m rows, so that a ragged last tile row sends its rows of C only
      mp = make_map(static_cast<const char*>(p.owner.push_window) + int64_t(p.owner.row0) * p.n * 2, p.m, p.n, p.n,
                    64, dt, "the peer's owner window");
    if (p.owner.push_tma > 0 && p.owner.finals_in_c)  // the peer's C, where the finals go (Owner::peer_out)
      mq = make_map(p.owner.peer_out, p.m, p.n, p.owner.peer_ld, 64, dt, "the peer's C");
  }

  const dim3 grid(p.sched.ctas), block(kGemmThreads);
  if (p.fp8.on) {  // (128x112, 128x128, 128x144, 128x160, 128x192, 64x48 or 64x144 tiles, checked)
    const bool bf = p.dtype == DType::BF16, rows64 = p.sched.bm == 64;
    const bool split = p.stream_k.on(), pair = p.pair_k;
    const auto [kernel, smem] = rows64 && bn == 48 ? fp8_launch_of<48, 64>(bf, split, pair)
                                : rows64            ? fp8_launch_of<144, 64>(bf, split, pair)
                                : bn == 192         ? fp8_launch_of<192>(bf, split, pair)
                                : bn == 160         ? fp8_launch_of<160>(bf, split, pair)
                                : bn == 144         ? fp8_launch_of<144>(bf, split, pair)
                                : bn == 112         ? fp8_launch_of<112>(bf, split, pair)
                                                    : fp8_launch_of<128>(bf, split, pair);
    launch(kernel, grid, block, smem, stream, p.pdl, pair ? 2 : 1, ma, mb, mc, mw, mp, mq, kp);
    FO_CUDA_CHECK_CTX(cudaGetLastError(), shape_str(p));
    return;
  }
  if (gemm_four_stages(p) && p.owner.rank >= 0 && p.owner.walk == OwnerWalk::Ranges) {
    if (p.dtype == DType::BF16)
      launch(pieces_kernel<__nv_bfloat16, true>(), grid, block, kPiecesSmem, stream, p.pdl, 1, ma, mb, mc, mw, mp, mq, kp);
    else
      launch(pieces_kernel<__half, true>(), grid, block, kPiecesSmem, stream, p.pdl, 1, ma, mb, mc, mw, mp, mq, kp);
    FO_CUDA_CHECK_CTX(cudaGetLastError(), shape_str(p));
    return;
  }
  if (gemm_four_stages(p)) {
    if (p.dtype == DType::BF16)
      launch(pieces_kernel<__nv_bfloat16>(), grid, block, kPiecesSmem, stream, p.pdl, 1, ma, mb, mc, mw, mp, mq, kp);
    else
      launch(pieces_kernel<__half>(), grid, block, kPiecesSmem, stream, p.pdl, 1, ma, mb, mc, mw, mp, mq, kp);
    FO_CUDA_CHECK_CTX(cudaGetLastError(), shape_str(p));
    return;
  }
  const bool split = p.stream_k.on();
  const auto kernel = p.dtype == DType::BF16
                          ? (bn == 256 ? kernel_for<256, __nv_bfloat16>(split) : kernel_for<128, __nv_bfloat16>(split))
                          : (bn == 256 ? kernel_for<256, __half>(split) : kernel_for<128, __half>(split));
  launch(kernel, grid, block, bn == 256 ? smem_for<256>() : smem_for<128>(), stream, p.pdl, 1, ma, mb, mc, mw, mp, mq, kp);
  FO_CUDA_CHECK_CTX(cudaGetLastError(), shape_str(p));
}

namespace {
template <typename K>
void prepare(K kernel, int smem) {
  FO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes attr{};
  FO_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));  // forces the module to load
}
// An FP8 tile's kernel in both output types.
template <int BN, int BM = 128>
void prepare_fp8(bool split, bool pair) {
  for (bool bf : {true, false}) {
    const auto [kernel, smem] = fp8_launch_of<BN, BM>(bf, split, pair);
    prepare(kernel, smem);
  }
}
}  // namespace

void preload_gemm_kernels() {
  for (bool split : {false, true}) {
    prepare(kernel_for<256, __nv_bfloat16>(split), smem_for<256>());
    prepare(kernel_for<128, __nv_bfloat16>(split), smem_for<128>());
    prepare(kernel_for<256, __half>(split), smem_for<256>());
    prepare(kernel_for<128, __half>(split), smem_for<128>());
  }
  for (bool split : {false, true}) {  // (FP8: whole tiles and stream-K, on the ops' tiles)
    prepare_fp8<128>(split, false);
    prepare_fp8<192>(split, false);
    prepare_fp8<160>(split, false);
    prepare_fp8<144>(split, false);
    prepare_fp8<112>(split, false);
  }
  prepare(pieces_kernel<__nv_bfloat16>(), kPiecesSmem);
  prepare(pieces_kernel<__half>(), kPiecesSmem);
  prepare(pieces_kernel<__nv_bfloat16, true>(), kPiecesSmem);
  prepare(pieces_kernel<__half, true>(), kPiecesSmem);
  encode_fn();
}

namespace {
// The lab's kernels (the pair split, the 64-row tiles), which no op
// launches: prepared at their first launch.
void preload_lab_gemm_kernels() {
  prepare_fp8<128>(false, true);
  prepare_fp8<192>(false, true);
  prepare_fp8<160>(false, true);
  prepare_fp8<112>(false, true);
  prepare_fp8<144>(false, true);
  prepare_fp8<48, 64>(false, false);
  prepare_fp8<144, 64>(false, false);
}
}  // namespace

}  // namespace flashoverlap::kernels
