// c_api.cpp — the C ABI of flashoverlap_c.h over the C++ API of
// flashoverlap.h (and nothing else of the library: no internal headers).
//
// Every entry point runs its body in guard(): a success clears this
// thread's message, an exception becomes a status and "<function>: <what>".
// A failure that is not the caller's (not InvalidArgument) is FO_NO_GPU
// when this process has no usable GPU (no_gpu_reason: no driver, no device,
// the current device not Hopper), FO_ERROR otherwise.
#include "flashoverlap/flashoverlap_c.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "flashoverlap/error.h"
#include "flashoverlap/flashoverlap.h"

struct fo_comm {
  flashoverlap::Communicator comm;
};
struct fo_gemm_allreduce {
  flashoverlap::GemmAllReduce op;
};
struct fo_gemm_reducescatter {
  flashoverlap::GemmReduceScatter op;
};
struct fo_gemm_alltoall {
  flashoverlap::GemmAllToAll op;
};
struct fo_gemm_grouped {
  flashoverlap::GroupedGemm op;
};

// The layout the header promises (ctypes mirrors it field by field).
static_assert(sizeof(fo_status) == 4 && sizeof(fo_dtype) == 4 && sizeof(fo_path) == 4 && sizeof(fo_rs_layout) == 4);
static_assert(FO_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES && sizeof(ncclUniqueId) == FO_UNIQUE_ID_BYTES);
static_assert(sizeof(void*) == 8, "the C ABI's options layout is written for 64-bit targets");
static_assert(offsetof(fo_gemm_allreduce_options, struct_size) == 0 &&
              offsetof(fo_gemm_allreduce_options, path) == 8 && offsetof(fo_gemm_allreduce_options, nccl_sms) == 12 &&
              offsetof(fo_gemm_allreduce_options, wait_timeout_s) == 16 &&
              offsetof(fo_gemm_allreduce_options, check_m) == 24 && offsetof(fo_gemm_allreduce_options, curves) == 32 &&
              offsetof(fo_gemm_allreduce_options, tuning_cache) == 40 && offsetof(fo_gemm_allreduce_options, input) == 48 &&
              offsetof(fo_gemm_allreduce_options, scales) == 52 && sizeof(fo_gemm_allreduce_options) == 56);
static_assert(int(flashoverlap::InputType::Same) == FO_INPUT_SAME && int(flashoverlap::InputType::E4M3) == FO_INPUT_E4M3 &&
              int(flashoverlap::ScaleKind::None) == FO_SCALES_NONE &&
              int(flashoverlap::ScaleKind::PerTensor) == FO_SCALES_PER_TENSOR &&
              int(flashoverlap::ScaleKind::RowWise) == FO_SCALES_ROW_WISE);
// (the fields it shares with fo_gemm_allreduce_options at the same offsets)
static_assert(offsetof(fo_gemm_reducescatter_options, struct_size) == 0 &&
              offsetof(fo_gemm_reducescatter_options, path) == 8 &&
              offsetof(fo_gemm_reducescatter_options, nccl_sms) == 12 &&
              offsetof(fo_gemm_reducescatter_options, wait_timeout_s) == 16 &&
              offsetof(fo_gemm_reducescatter_options, check_m) == 24 &&
              offsetof(fo_gemm_reducescatter_options, layout) == 28 &&
              offsetof(fo_gemm_reducescatter_options, tuning_cache) == 32 &&
              offsetof(fo_gemm_reducescatter_options, input) == 40 &&
              offsetof(fo_gemm_reducescatter_options, scales) == 44 && sizeof(fo_gemm_reducescatter_options) == 48);
static_assert(offsetof(fo_gemm_alltoall_options, struct_size) == 0 && offsetof(fo_gemm_alltoall_options, path) == 8 &&
              offsetof(fo_gemm_alltoall_options, nccl_sms) == 12 &&
              offsetof(fo_gemm_alltoall_options, wait_timeout_s) == 16 &&
              offsetof(fo_gemm_alltoall_options, exchange_timeout_s) == 24 &&
              offsetof(fo_gemm_alltoall_options, experts) == 32 && offsetof(fo_gemm_alltoall_options, input) == 36 &&
              offsetof(fo_gemm_alltoall_options, scales) == 40 && sizeof(fo_gemm_alltoall_options) == 48);
static_assert(offsetof(fo_alltoall_routing, struct_size) == 0 && offsetof(fo_alltoall_routing, rows) == 8 &&
              offsetof(fo_alltoall_routing, dest_rank) == 16 && offsetof(fo_alltoall_routing, dest_token) == 24 &&
              offsetof(fo_alltoall_routing, gate) == 32 && offsetof(fo_alltoall_routing, tokens) == 40 &&
              offsetof(fo_alltoall_routing, send_counts) == 48 && offsetof(fo_alltoall_routing, recv_counts) == 56 &&
              offsetof(fo_alltoall_routing, on_device) == 64 &&
              offsetof(fo_alltoall_routing, expert_counts) == 72 && sizeof(fo_alltoall_routing) == 80);
static_assert(int(flashoverlap::DType::BF16) == FO_DTYPE_BF16 && int(flashoverlap::DType::FP16) == FO_DTYPE_FP16);

namespace {

using flashoverlap::InvalidArgument;
using Path = flashoverlap::GemmAllReduceOptions::Path;
using RsPath = flashoverlap::GemmReduceScatterOptions::Path;
using RsLayout = flashoverlap::GemmReduceScatterOptions::Layout;
using A2aPath = flashoverlap::GemmAllToAllOptions::Path;

// The size of the first version of fo_gemm_allreduce_options: the smallest
// struct_size a caller may pass (fields are only ever added at the end).
constexpr size_t kOptionsV1Size = offsetof(fo_gemm_allreduce_options, curves) + sizeof(const char*);
// The same for fo_gemm_reducescatter_options (its first version is this one).
constexpr size_t kRsOptionsV1Size = offsetof(fo_gemm_reducescatter_options, tuning_cache);
// ... for fo_gemm_alltoall_options (this one) and fo_alltoall_routing (up to recv_counts).
constexpr size_t kA2aOptionsV1Size = offsetof(fo_gemm_alltoall_options, experts);
constexpr size_t kGroupedOptionsV1Size = sizeof(fo_gemm_grouped_options);
static_assert(offsetof(fo_gemm_grouped_options, path) == 8 && sizeof(fo_gemm_grouped_options) == 16,
              "fo_gemm_grouped_options layout");
constexpr size_t kRoutingV1Size = offsetof(fo_alltoall_routing, on_device);

// This thread's last message: t_static when set (a literal, for when even
// the message could not be allocated), t_message otherwise.
thread_local std::string t_message;
thread_local const char* t_static = nullptr;

void clear_error() noexcept {
  t_message.clear();  // (keeps its capacity: no allocation, no throw)
  t_static = nullptr;
}

void set_error(const char* fn, std::string_view what) noexcept {
  try {
    t_message.assign(fn).append(": ").append(what.empty() ? std::string_view("unknown error") : what);
    t_static = nullptr;
  } catch (...) {
    t_static = "flashoverlap: out of host memory (recording an error's message)";
  }
}

// Why this process has no usable GPU, or "" when it has one (or when CUDA is
// installed but fails to start: a broken machine, not a missing GPU).
std::string no_gpu_reason() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();  // (clears the runtime's error state)
    if (e == cudaErrorNoDevice) {
      std::string r = "no CUDA device";
      if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) r += std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")";
      return r;
    }
    // Without the driver's library CUDA says "insufficient driver": that is
    // a machine without a GPU, not a GPU machine whose CUDA is broken.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!driver) return "no NVIDIA driver (libcuda.so.1 not found)";
    dlclose(driver);
    return "";
  }
  if (count == 0) return "no CUDA device";
  int device = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  if (p.major != 9)
    return "the current device " + std::to_string(device) + " (" + p.name + ") is sm_" + std::to_string(p.major) +
           std::to_string(p.minor) + ", not a Hopper (sm_90) GPU";
  return "";
}

fo_status failed(const char* fn, std::string_view what) noexcept {
  try {
    const std::string why = no_gpu_reason();
    if (!why.empty()) {
      // (the C++ API's message may say why already: then it is enough)
      if (what.find(why) != std::string_view::npos) set_error(fn, what);
      else set_error(fn, "no usable GPU (" + why + "): " + std::string(what));
      return FO_NO_GPU;
    }
  } catch (...) {  // (the probe's strings: out of memory; report the failure as it is)
  }
  set_error(fn, what);
  return FO_ERROR;
}

// Runs body (which throws on failure) and turns its outcome into a status
// and this thread's message. Nothing escapes.
template <class Body>
fo_status guard(const char* fn, Body&& body) noexcept {
  try {
    body();
    clear_error();
    return FO_OK;
  } catch (const InvalidArgument& e) {
    set_error(fn, e.what());
    return FO_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    set_error(fn, "out of host memory (std::bad_alloc)");
    return FO_ERROR;
  } catch (const std::exception& e) {
    return failed(fn, e.what());
  } catch (...) {
    return failed(fn, "unknown exception (not a std::exception)");
  }
}

// InvalidArgument "<name> is NULL" unless p is set.
void require(const void* p, const char* name) {
  if (!p) throw InvalidArgument(std::string(name) + " is NULL");
}

// A handle's object; InvalidArgument when the handle is NULL.
template <class T>
T& deref(T* handle, const char* name) {
  require(handle, name);
  return *handle;
}

flashoverlap::DType to_dtype(fo_dtype d) {
  switch (d) {
    case FO_DTYPE_BF16: return flashoverlap::DType::BF16;
    case FO_DTYPE_FP16: return flashoverlap::DType::FP16;
    default: break;
  }
  throw InvalidArgument("dtype = " + std::to_string(int(d)) + " is not an fo_dtype (FO_DTYPE_BF16 = 0, FO_DTYPE_FP16 = 1)");
}

Path to_path(int32_t p) {
  switch (p) {
    case FO_PATH_AUTO: return Path::Auto;
    case FO_PATH_SEQUENTIAL: return Path::Sequential;
    case FO_PATH_ROW_BANDS: return Path::RowBands;
    case FO_PATH_SLOTS: return Path::Slots;
    case FO_PATH_NVLINK:
    case FO_PATH_OWNERS: return Path::NVLink;  // (its former name)
    default: break;
  }
  throw InvalidArgument("options->path = " + std::to_string(p) +
                        " is not an fo_path (FO_PATH_AUTO 0, _SEQUENTIAL 1, _ROW_BANDS 2, _SLOTS 3, _NVLINK 5)");
}

int32_t from_path(Path p) {
  switch (p) {
    case Path::Auto: return FO_PATH_AUTO;
    case Path::Sequential: return FO_PATH_SEQUENTIAL;
    case Path::RowBands: return FO_PATH_ROW_BANDS;
    case Path::Slots: return FO_PATH_SLOTS;
    case Path::NVLink: return FO_PATH_NVLINK;
  }
  return FO_PATH_AUTO;
}

// Refuses a caller's struct (its argument's name: "options", "routing")
// whose size this library cannot read: below its first version, or set
// bytes beyond what this library knows (a caller built against a later
// header: what it adds must be unset). fill says how to fill it.
void check_struct_size(const void* o, size_t struct_size, size_t v1_size, size_t ours, const char* name,
                       const std::string& fill) {
  const std::string field = std::string(name) + "->struct_size = " + std::to_string(struct_size);
  if (struct_size < v1_size)
    throw InvalidArgument(field + " is below " + std::to_string(v1_size) + " (" + fill + ")");
  if (struct_size > ours) {
    const auto* extra = static_cast<const unsigned char*>(o) + ours;
    for (size_t i = 0; i < struct_size - ours; ++i)
      if (extra[i] != 0)
        throw InvalidArgument(field + ": the " + name + " set fields that this library (flashoverlap " +
                              flashoverlap::version() + ", " + name + " of " + std::to_string(ours) +
                              " bytes) does not know");
  }
}
// The options' form: filled by their _default function.
void check_options_size(const void* o, size_t struct_size, size_t v1_size, size_t ours, const char* fill_with) {
  check_struct_size(o, struct_size, v1_size, ours, "options",
                    std::string("fill the options with ") + fill_with + "(&o, sizeof o) first");
}
// What an options _default function refuses: a struct_size below the first version.
void check_default_size(size_t struct_size, size_t v1_size) {
  if (struct_size < v1_size)
    throw InvalidArgument("struct_size = " + std::to_string(struct_size) + " is below " + std::to_string(v1_size) +
                          " (pass sizeof *options)");
}

// The FP8 fields (input, scales) of a caller's options O into R, where its
// struct_size has them (an earlier version: 16-bit inputs).
template <class O, class R>
void read_input_fields(const O* o, R& r) {
  if (o->struct_size < offsetof(O, scales) + sizeof(int32_t)) return;
  if (o->input != FO_INPUT_SAME && o->input != FO_INPUT_E4M3)
    throw InvalidArgument("options->input = " + std::to_string(o->input) +
                          " is not an fo_input_type (FO_INPUT_SAME 0, FO_INPUT_E4M3 1)");
  if (o->scales != FO_SCALES_NONE && o->scales != FO_SCALES_PER_TENSOR && o->scales != FO_SCALES_ROW_WISE)
    throw InvalidArgument("options->scales = " + std::to_string(o->scales) +
                          " is not an fo_scale_kind (FO_SCALES_NONE 0, FO_SCALES_PER_TENSOR 1, FO_SCALES_ROW_WISE 2)");
  r.input = flashoverlap::InputType(o->input), r.scales = flashoverlap::ScaleKind(o->scales);
}

// The C++ options a caller's struct says; InvalidArgument for a size this
// library cannot read, or fields it does not know set to nonzero.
flashoverlap::GemmAllReduceOptions to_options(const fo_gemm_allreduce_options* o) {
  flashoverlap::GemmAllReduceOptions r;
  if (!o) return r;
  check_options_size(o, o->struct_size, kOptionsV1Size, sizeof(fo_gemm_allreduce_options),
                     "fo_gemm_allreduce_options_default");
  r.path = to_path(o->path);
  r.nccl_sms = o->nccl_sms;
  r.wait_timeout_s = o->wait_timeout_s;
  r.check_m = o->check_m != 0;
  if (o->curves) r.curves = o->curves;
  if (o->struct_size >= offsetof(fo_gemm_allreduce_options, tuning_cache) + sizeof(const char*) && o->tuning_cache)
    r.tuning_cache = o->tuning_cache;
  read_input_fields(o, r);
  return r;
}

// The paths of the ops that have Auto, Sequential, Slots and NVLink
// (GemmReduceScatter's, GemmAllToAll's: P), from an fo_path other than
// FO_PATH_NVLINK; `op` names the op in the refusal.
template <class P>
P to_slots_path(int32_t p, const char* op) {
  switch (p) {
    case FO_PATH_AUTO: return P::Auto;
    case FO_PATH_SEQUENTIAL: return P::Sequential;
    case FO_PATH_SLOTS: return P::Slots;
    default: break;
  }
  // (the AllReduce's other paths are fo_path values, but not this op's)
  const std::string what = p == FO_PATH_ROW_BANDS ? std::string(" (FO_PATH_ROW_BANDS) is not a ") + op + " path"
                           : p == FO_PATH_OWNERS  ? std::string(" (FO_PATH_OWNERS) is not a ") + op + " path"
                                                  : std::string(" is not an fo_path of ") + op;
  throw InvalidArgument("options->path = " + std::to_string(p) + what +
                        " (FO_PATH_AUTO 0, FO_PATH_SEQUENTIAL 1, FO_PATH_SLOTS 3, FO_PATH_NVLINK 5)");
}

template <class P>
int32_t from_slots_path(P p) {
  if (p == P::Sequential) return FO_PATH_SEQUENTIAL;
  if (p == P::Slots) return FO_PATH_SLOTS;
  if (p == P::NVLink) return FO_PATH_NVLINK;
  return FO_PATH_AUTO;
}

RsLayout to_rs_layout(int32_t l) {
  switch (l) {
    case FO_RS_LAYOUT_STANDARD: return RsLayout::Standard;
    case FO_RS_LAYOUT_SUBTILE: return RsLayout::SubTile;
    default: break;
  }
  throw InvalidArgument("options->layout = " + std::to_string(l) +
                        " is not an fo_rs_layout (FO_RS_LAYOUT_STANDARD 0, FO_RS_LAYOUT_SUBTILE 1)");
}

int32_t from_rs_layout(RsLayout l) { return l == RsLayout::SubTile ? FO_RS_LAYOUT_SUBTILE : FO_RS_LAYOUT_STANDARD; }

flashoverlap::GemmReduceScatterOptions to_rs_options(const fo_gemm_reducescatter_options* o) {
  flashoverlap::GemmReduceScatterOptions r;
  if (!o) return r;
  check_options_size(o, o->struct_size, kRsOptionsV1Size, sizeof(fo_gemm_reducescatter_options),
                     "fo_gemm_reducescatter_options_default");
  r.path = o->path == FO_PATH_NVLINK ? RsPath::NVLink : to_slots_path<RsPath>(o->path, "GemmReduceScatter");
  r.layout = to_rs_layout(o->layout);
  r.nccl_sms = o->nccl_sms;
  r.wait_timeout_s = o->wait_timeout_s;
  r.check_m = o->check_m != 0;
  if (o->struct_size >= offsetof(fo_gemm_reducescatter_options, tuning_cache) + sizeof(const char*) &&
      o->tuning_cache)
    r.tuning_cache = o->tuning_cache;
  read_input_fields(o, r);
  return r;
}

flashoverlap::GemmAllToAllOptions to_a2a_options(const fo_gemm_alltoall_options* o) {
  flashoverlap::GemmAllToAllOptions r;
  if (!o) return r;
  check_options_size(o, o->struct_size, kA2aOptionsV1Size, sizeof(fo_gemm_alltoall_options),
                     "fo_gemm_alltoall_options_default");
  r.path = o->path == FO_PATH_NVLINK ? A2aPath::NVLink : to_slots_path<A2aPath>(o->path, "GemmAllToAll");
  r.nccl_sms = o->nccl_sms;
  r.wait_timeout_s = o->wait_timeout_s;
  r.exchange_timeout_s = o->exchange_timeout_s;
  if (o->struct_size >= offsetof(fo_gemm_alltoall_options, experts) + sizeof(int32_t)) r.experts = o->experts;
  read_input_fields(o, r);
  return r;
}

flashoverlap::GroupedGemmOptions to_grouped_options(const fo_gemm_grouped_options* o) {
  flashoverlap::GroupedGemmOptions r;
  if (!o) return r;
  check_options_size(o, o->struct_size, kGroupedOptionsV1Size, sizeof(fo_gemm_grouped_options),
                     "fo_gemm_grouped_options_default");
  using P = flashoverlap::GroupedGemmOptions::Path;
  switch (o->path) {
    case FO_GROUPED_AUTO: r.path = P::Auto; break;
    case FO_GROUPED_OURS: r.path = P::Ours; break;
    case FO_GROUPED_CUBLAS: r.path = P::Cublas; break;
    default:
      throw InvalidArgument("options->path = " + std::to_string(o->path) +
                            " is not a grouped GEMM path (FO_GROUPED_AUTO 0, FO_GROUPED_OURS 1, FO_GROUPED_CUBLAS 2)");
  }
  return r;
}

// The C++ routing a caller's struct says (its arrays are the caller's: read
// by the call). Only the struct's size is checked here: what its fields
// say, the C++ API checks on every rank together.
flashoverlap::AllToAllRouting to_routing(const fo_alltoall_routing* r) {
  require(r, "routing");
  check_struct_size(r, r->struct_size, kRoutingV1Size, sizeof(fo_alltoall_routing), "routing",
                    "set routing->struct_size = sizeof(fo_alltoall_routing)");
  flashoverlap::AllToAllRouting x;
  x.rows = r->rows;
  x.dest_rank = r->dest_rank;
  x.dest_token = r->dest_token;
  x.gate = r->gate;
  x.tokens = r->tokens;
  x.send_counts = r->send_counts;
  x.recv_counts = r->recv_counts;
  x.on_device = r->struct_size >= offsetof(fo_alltoall_routing, on_device) + sizeof(int64_t) && r->on_device != 0;
  if (r->struct_size >= offsetof(fo_alltoall_routing, expert_counts) + sizeof(const int64_t*))
    x.expert_counts = r->expert_counts;
  return x;
}

fo_dtype from_dtype(flashoverlap::DType d) { return d == flashoverlap::DType::BF16 ? FO_DTYPE_BF16 : FO_DTYPE_FP16; }

// The plan's text into the caller's buffer, as snprintf does.
void copy_text(const std::string& text, char* buf, size_t size, size_t* needed) {
  if (needed) *needed = text.size() + 1;
  if (size > 0) {
    const size_t n = text.size() < size - 1 ? text.size() : size - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
}

// What the ops' functions share (Op: fo_gemm_allreduce, fo_gemm_reducescatter
// or fo_gemm_alltoall; those that take m only the first two, whose calls
// have m rows).
// The defaults `d` into the caller's options of struct_size bytes: a caller
// with a later header gets its fields beyond ours zero (unset); one of an
// earlier version what it knows.
template <class Options>
void write_options(Options* options, const Options& d, size_t struct_size) {
  if (struct_size > sizeof d)
    std::memset(reinterpret_cast<unsigned char*>(options) + sizeof d, 0, struct_size - sizeof d);
  std::memcpy(options, &d, std::min(sizeof d, struct_size));
}
template <class Op, class... Scales>  // (Scales: the AllReduce's InputScales, where given)
void op_run(Op* op, const void* a, const void* b, void* out, int64_t m, void* stream, int64_t ld_out,
            const Scales&... scales) {
  Op& o = deref(op, "op");
  require(a, "a");
  require(b, "b");
  require(out, "out");
  o.op.run(a, b, out, m, static_cast<cudaStream_t>(stream), ld_out, scales...);
}
void op_run_registered(fo_gemm_allreduce_t op, const void* a, const void* b, int slot, int64_t m, void* stream,
                       const flashoverlap::InputScales& scales = {}) {
  auto& o = deref(op, "op");
  require(a, "a");
  require(b, "b");
  o.op.run_registered(a, b, slot, m, static_cast<cudaStream_t>(stream), scales);
}
void a2a_run(fo_gemm_alltoall_t op, const void* a, const void* b, const fo_alltoall_routing* routing, void* out,
             int64_t ld_out, int combine, int32_t* tokens_out, void* stream,
             const flashoverlap::InputScales& scales = {}) {
  fo_gemm_alltoall& o = deref(op, "op");
  const flashoverlap::AllToAllRouting r = to_routing(routing);
  // (null pointers and the routing's fields: checked by every rank together, in the exchange)
  o.op.run(a, b, r, out, static_cast<cudaStream_t>(stream), combine != 0, ld_out, tokens_out, scales);
}
template <class Op, class... Scales>
void op_run_rmsnorm(Op* op, const void* a, const void* b, const void* residual, const void* norm_weight, float eps,
                    void* out, void* residual_out, int64_t m, void* stream, const Scales&... scales) {
  Op& o = deref(op, "op");
  require(a, "a");
  require(b, "b");
  require(residual, "residual");
  require(norm_weight, "norm_weight");
  require(out, "out");
  o.op.run_rmsnorm(a, b, residual, norm_weight, eps, out, residual_out, m, static_cast<cudaStream_t>(stream),
                   scales...);
}
// text(op) into the caller's buffer (the plan functions).
template <class Op, class Text>
void op_text(Op* op, char* buf, size_t size, size_t* needed, Text&& text) {
  Op& o = deref(op, "op");
  if (!buf && size > 0) throw InvalidArgument("buf is NULL with size = " + std::to_string(size) + " (not 0)");
  copy_text(text(o.op), buf, size, needed);
}
template <class Op>
void op_plan(Op* op, int64_t m, char* buf, size_t size, size_t* needed) {
  op_text(op, buf, size, needed, [m](auto& x) { return x.plan(m); });
}
// n, k and dtype of any op (those with max_m: that too).
template <class Op>
void op_shape(Op* op, int64_t* n, int64_t* k, fo_dtype* dtype) {
  const Op& o = deref(op, "op");
  if (n) *n = o.op.n();
  if (k) *k = o.op.k();
  if (dtype) *dtype = from_dtype(o.op.dtype());
}
template <class Op>
void op_shape(Op* op, int64_t* max_m, int64_t* n, int64_t* k, fo_dtype* dtype) {
  op_shape(op, n, k, dtype);
  if (max_m) *max_m = op->op.max_m();
}

}  // namespace

extern "C" {

const char* fo_version(void) {
  try {
    return flashoverlap::version();
  } catch (...) {
    return "";
  }
}

uint32_t fo_c_abi_version(void) { return FO_C_ABI_VERSION; }

const char* fo_status_string(fo_status status) {
  switch (status) {
    case FO_OK: return "FO_OK";
    case FO_INVALID_ARGUMENT: return "FO_INVALID_ARGUMENT";
    case FO_NO_GPU: return "FO_NO_GPU";
    case FO_ERROR: return "FO_ERROR";
    default: return "unknown fo_status";
  }
}

const char* fo_last_error(void) { return t_static ? t_static : t_message.c_str(); }

// ---- communicators ----

fo_status fo_local_gpus(int* hopper, int* cuda_failed, char* reason, size_t size, size_t* needed) {
  return guard("fo_local_gpus", [&] {
    require(hopper, "hopper");
    if (size > 0) require(reason, "reason");
    const flashoverlap::LocalGpus g = flashoverlap::local_gpus();
    *hopper = g.hopper;
    if (cuda_failed) *cuda_failed = g.cuda_failed ? 1 : 0;
    copy_text(g.reason, reason, size, needed);
  });
}

fo_status fo_measure_allreduce_curve(fo_comm_t comm, fo_dtype dtype, int nccl_ctas, double max_mib, int iters,
                                     const char* path) {
  return guard("fo_measure_allreduce_curve", [&] {
    require(path, "path");
    const flashoverlap::DType d = to_dtype(dtype);
    (void)flashoverlap::measure_allreduce_curve(deref(comm, "comm").comm, d, nccl_ctas, max_mib, iters, path);
  });
}

fo_status fo_allreduce_curve_path(const char* dir, int nccl_ctas, int world, fo_dtype dtype, char* buf, size_t size,
                                  size_t* needed) {
  return guard("fo_allreduce_curve_path", [&] {
    require(dir, "dir");
    if (size > 0) require(buf, "buf");
    copy_text(flashoverlap::allreduce_curve_path(dir, nccl_ctas, world, to_dtype(dtype)), buf, size, needed);
  });
}

// ---- planning without a GPU ----

fo_status fo_plan_gemm_allreduce(int64_t m, int64_t n, int64_t k, int world, fo_dtype dtype,
                                 const fo_gemm_allreduce_options* options, int sms, const char* gpu, char* buf,
                                 size_t size, size_t* needed) {
  return guard("fo_plan_gemm_allreduce", [&] {
    if (size > 0) require(buf, "buf");
    copy_text(flashoverlap::plan_gemm_allreduce(m, n, k, world, to_dtype(dtype), to_options(options), sms,
                                                gpu ? gpu : "NVIDIA H200"),
              buf, size, needed);
  });
}

fo_status fo_plan_gemm_reducescatter(int64_t m, int64_t n, int64_t k, int world, fo_dtype dtype,
                                     const fo_gemm_reducescatter_options* options, int sms, const char* gpu, int rank,
                                     char* buf, size_t size, size_t* needed) {
  return guard("fo_plan_gemm_reducescatter", [&] {
    if (size > 0) require(buf, "buf");
    copy_text(flashoverlap::plan_gemm_reducescatter(m, n, k, world, to_dtype(dtype), to_rs_options(options), sms,
                                                    gpu ? gpu : "NVIDIA H200", rank),
              buf, size, needed);
  });
}

fo_status fo_plan_gemm_alltoall(const fo_alltoall_routing* routings, int world, int64_t n, int64_t k, fo_dtype dtype,
                                const fo_gemm_alltoall_options* options, int sms, int rank, char* buf, size_t size,
                                size_t* needed) {
  return guard("fo_plan_gemm_alltoall", [&] {
    if (size > 0) require(buf, "buf");
    if (world < 1 || world > 1024) throw InvalidArgument("world = " + std::to_string(world) + " is outside [1, 1024]");
    require(routings, "routings");
    // (an array of the caller's structs: its stride is their struct_size, which the first's check admits)
    std::vector<flashoverlap::AllToAllRouting> all{to_routing(routings)};
    const auto* base = reinterpret_cast<const unsigned char*>(routings);
    for (int r = 1; r < world; ++r)
      all.push_back(to_routing(reinterpret_cast<const fo_alltoall_routing*>(base + size_t(r) * routings->struct_size)));
    copy_text(flashoverlap::plan_gemm_alltoall(all, n, k, to_dtype(dtype), to_a2a_options(options), sms, rank), buf,
              size, needed);
  });
}

fo_status fo_comm_adopt(void* nccl_comm, fo_comm_t* out) {
  return guard("fo_comm_adopt", [&] {
    require(out, "out");
    *out = nullptr;
    require(nccl_comm, "nccl_comm");
    *out = new fo_comm{flashoverlap::Communicator::adopt(static_cast<ncclComm_t>(nccl_comm))};
  });
}

fo_status fo_comm_from_env(fo_comm_t* out) {
  return guard("fo_comm_from_env", [&] {
    require(out, "out");
    *out = nullptr;
    *out = new fo_comm{flashoverlap::Communicator::from_env()};
  });
}

fo_status fo_comm_from_unique_id(const void* id, size_t id_size, int rank, int world, fo_comm_t* out) {
  return guard("fo_comm_from_unique_id", [&] {
    require(out, "out");
    *out = nullptr;
    require(id, "id");
    if (id_size != FO_UNIQUE_ID_BYTES)
      throw InvalidArgument("id_size = " + std::to_string(id_size) + ", not FO_UNIQUE_ID_BYTES (" +
                            std::to_string(FO_UNIQUE_ID_BYTES) + ")");
    if (world < 1 || rank < 0 || rank >= world)
      throw InvalidArgument("rank = " + std::to_string(rank) + ", world = " + std::to_string(world) +
                            ": needs world >= 1 and 0 <= rank < world");
    ncclUniqueId u;
    std::memcpy(u.internal, id, FO_UNIQUE_ID_BYTES);
    *out = new fo_comm{flashoverlap::Communicator::from_unique_id(u, rank, world)};
  });
}

fo_status fo_unique_id(void* id, size_t id_size) {
  return guard("fo_unique_id", [&] {
    require(id, "id");
    if (id_size < FO_UNIQUE_ID_BYTES)
      throw InvalidArgument("id_size = " + std::to_string(id_size) + ", below FO_UNIQUE_ID_BYTES (" +
                            std::to_string(FO_UNIQUE_ID_BYTES) + ")");
    const ncclUniqueId u = flashoverlap::Communicator::unique_id();
    std::memcpy(id, u.internal, FO_UNIQUE_ID_BYTES);
  });
}

fo_status fo_comm_rank(fo_comm_t comm, int* rank) {
  return guard("fo_comm_rank", [&] {
    const fo_comm& c = deref(comm, "comm");
    require(rank, "rank");
    *rank = c.comm.rank();
  });
}

fo_status fo_comm_world(fo_comm_t comm, int* world) {
  return guard("fo_comm_world", [&] {
    const fo_comm& c = deref(comm, "comm");
    require(world, "world");
    *world = c.comm.world();
  });
}

fo_status fo_comm_nccl(fo_comm_t comm, void** nccl_comm) {
  return guard("fo_comm_nccl", [&] {
    const fo_comm& c = deref(comm, "comm");
    require(nccl_comm, "nccl_comm");
    *nccl_comm = static_cast<void*>(c.comm.get());
  });
}

fo_status fo_comm_destroy(fo_comm_t comm) {
  return guard("fo_comm_destroy", [&] { delete comm; });
}

// ---- GemmAllReduce ----

fo_status fo_gemm_allreduce_options_default(fo_gemm_allreduce_options* options, size_t struct_size) {
  return guard("fo_gemm_allreduce_options_default", [&] {
    require(options, "options");
    check_default_size(struct_size, kOptionsV1Size);
    // The defaults are GemmAllReduceOptions{}'s, by construction. (A
    // non-empty default curves directory would live in this static.)
    static const flashoverlap::GemmAllReduceOptions defaults{};
    fo_gemm_allreduce_options d{};
    d.struct_size = struct_size;
    d.path = from_path(defaults.path);
    d.nccl_sms = defaults.nccl_sms;
    d.wait_timeout_s = defaults.wait_timeout_s;
    d.check_m = defaults.check_m ? 1 : 0;
    d.reserved_ = 0;
    d.curves = defaults.curves.empty() ? nullptr : defaults.curves.c_str();
    d.tuning_cache = nullptr;
    d.input = int32_t(defaults.input), d.scales = int32_t(defaults.scales);
    write_options(options, d, struct_size);
  });
}

fo_status fo_gemm_allreduce_create(fo_comm_t comm, int64_t max_m, int64_t n, int64_t k, fo_dtype dtype,
                                   const fo_gemm_allreduce_options* options, fo_gemm_allreduce_t* out) {
  return guard("fo_gemm_allreduce_create", [&] {
    require(out, "out");
    *out = nullptr;
    // (the values first, then the handle: what needs no GPU is checked
    // before what does)
    const flashoverlap::DType d = to_dtype(dtype);
    const flashoverlap::GemmAllReduceOptions o = to_options(options);
    const fo_comm& c = deref(comm, "comm");
    *out = new fo_gemm_allreduce{flashoverlap::GemmAllReduce(c.comm, max_m, n, k, d, o)};
  });
}

fo_status fo_gemm_allreduce_run(fo_gemm_allreduce_t op, const void* a, const void* b, void* out, int64_t m,
                                void* stream, int64_t ld_out) {
  return guard("fo_gemm_allreduce_run", [&] {
    op_run(op, a, b, out, m, stream, ld_out);
  });
}

fo_status fo_gemm_allreduce_run_scaled(fo_gemm_allreduce_t op, const void* a, const void* b, void* out, int64_t m,
                                       void* stream, int64_t ld_out, const float* scale_a, const float* scale_b) {
  return guard("fo_gemm_allreduce_run_scaled", [&] {
    op_run(op, a, b, out, m, stream, ld_out, flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_allreduce_run_rmsnorm(fo_gemm_allreduce_t op, const void* a, const void* b, const void* residual,
                                        const void* norm_weight, float eps, void* out, void* residual_out, int64_t m,
                                        void* stream) {
  return guard("fo_gemm_allreduce_run_rmsnorm", [&] {
    op_run_rmsnorm(op, a, b, residual, norm_weight, eps, out, residual_out, m, stream);
  });
}

fo_status fo_gemm_allreduce_run_rmsnorm_scaled(fo_gemm_allreduce_t op, const void* a, const void* b,
                                               const void* residual, const void* norm_weight, float eps, void* out,
                                               void* residual_out, int64_t m, void* stream, const float* scale_a,
                                               const float* scale_b) {
  return guard("fo_gemm_allreduce_run_rmsnorm_scaled", [&] {
    op_run_rmsnorm(op, a, b, residual, norm_weight, eps, out, residual_out, m, stream,
                   flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_allreduce_register_output(fo_gemm_allreduce_t op, void* out, int64_t ld_out, int* slot) {
  return guard("fo_gemm_allreduce_register_output", [&] {
    auto& o = deref(op, "op");
    require(out, "out");
    require(slot, "slot");
    *slot = o.op.register_output(out, ld_out);
  });
}

fo_status fo_gemm_allreduce_run_registered(fo_gemm_allreduce_t op, const void* a, const void* b, int slot, int64_t m,
                                           void* stream) {
  return guard("fo_gemm_allreduce_run_registered", [&] { op_run_registered(op, a, b, slot, m, stream); });
}

fo_status fo_gemm_allreduce_run_registered_scaled(fo_gemm_allreduce_t op, const void* a, const void* b, int slot,
                                                  int64_t m, void* stream, const float* scale_a,
                                                  const float* scale_b) {
  return guard("fo_gemm_allreduce_run_registered_scaled", [&] {
    op_run_registered(op, a, b, slot, m, stream, flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_allreduce_prepare(fo_gemm_allreduce_t op, int64_t m) {
  return guard("fo_gemm_allreduce_prepare", [&] { deref(op, "op").op.prepare(m); });
}

fo_status fo_gemm_allreduce_plan(fo_gemm_allreduce_t op, int64_t m, char* buf, size_t size, size_t* needed) {
  return guard("fo_gemm_allreduce_plan", [&] {
    op_plan(op, m, buf, size, needed);
  });
}

fo_status fo_gemm_allreduce_check(fo_gemm_allreduce_t op) {
  return guard("fo_gemm_allreduce_check", [&] { deref(op, "op").op.check(); });
}

fo_status fo_gemm_allreduce_shape(fo_gemm_allreduce_t op, int64_t* max_m, int64_t* n, int64_t* k, fo_dtype* dtype) {
  return guard("fo_gemm_allreduce_shape", [&] { op_shape(op, max_m, n, k, dtype); });
}

fo_status fo_gemm_allreduce_destroy(fo_gemm_allreduce_t op) {
  return guard("fo_gemm_allreduce_destroy", [&] { delete op; });
}

// ---- GemmReduceScatter ----

fo_status fo_gemm_reducescatter_options_default(fo_gemm_reducescatter_options* options, size_t struct_size) {
  return guard("fo_gemm_reducescatter_options_default", [&] {
    require(options, "options");
    check_default_size(struct_size, kRsOptionsV1Size);
    // The defaults are GemmReduceScatterOptions{}'s, by construction.
    static const flashoverlap::GemmReduceScatterOptions defaults{};
    fo_gemm_reducescatter_options d{};
    d.struct_size = struct_size;
    d.path = from_slots_path(defaults.path);
    d.nccl_sms = defaults.nccl_sms;
    d.wait_timeout_s = defaults.wait_timeout_s;
    d.check_m = defaults.check_m ? 1 : 0;
    d.layout = from_rs_layout(defaults.layout);
    d.input = int32_t(defaults.input), d.scales = int32_t(defaults.scales);
    write_options(options, d, struct_size);
  });
}

fo_status fo_gemm_reducescatter_create(fo_comm_t comm, int64_t max_m, int64_t n, int64_t k, fo_dtype dtype,
                                       const fo_gemm_reducescatter_options* options, fo_gemm_reducescatter_t* out) {
  return guard("fo_gemm_reducescatter_create", [&] {
    require(out, "out");
    *out = nullptr;
    // (the values first, then the handle: what needs no GPU is checked
    // before what does)
    const flashoverlap::DType d = to_dtype(dtype);
    const flashoverlap::GemmReduceScatterOptions o = to_rs_options(options);
    const fo_comm& c = deref(comm, "comm");
    *out = new fo_gemm_reducescatter{flashoverlap::GemmReduceScatter(c.comm, max_m, n, k, d, o)};
  });
}

fo_status fo_gemm_reducescatter_run(fo_gemm_reducescatter_t op, const void* a, const void* b, void* out, int64_t m,
                                    void* stream, int64_t ld_out) {
  return guard("fo_gemm_reducescatter_run", [&] {
    op_run(op, a, b, out, m, stream, ld_out);
  });
}

fo_status fo_gemm_reducescatter_run_scaled(fo_gemm_reducescatter_t op, const void* a, const void* b, void* out,
                                           int64_t m, void* stream, int64_t ld_out, const float* scale_a,
                                           const float* scale_b) {
  return guard("fo_gemm_reducescatter_run_scaled", [&] {
    op_run(op, a, b, out, m, stream, ld_out, flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_reducescatter_run_rmsnorm(fo_gemm_reducescatter_t op, const void* a, const void* b,
                                            const void* residual, const void* norm_weight, float eps, void* out,
                                            void* residual_out, int64_t m, void* stream) {
  return guard("fo_gemm_reducescatter_run_rmsnorm", [&] {
    op_run_rmsnorm(op, a, b, residual, norm_weight, eps, out, residual_out, m, stream);
  });
}

fo_status fo_gemm_reducescatter_run_rmsnorm_scaled(fo_gemm_reducescatter_t op, const void* a, const void* b,
                                                   const void* residual, const void* norm_weight, float eps, void* out,
                                                   void* residual_out, int64_t m, void* stream, const float* scale_a,
                                                   const float* scale_b) {
  return guard("fo_gemm_reducescatter_run_rmsnorm_scaled", [&] {
    op_run_rmsnorm(op, a, b, residual, norm_weight, eps, out, residual_out, m, stream,
                   flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_reducescatter_rows_out(fo_gemm_reducescatter_t op, int64_t m, int64_t* rows) {
  return guard("fo_gemm_reducescatter_rows_out", [&] {
    const fo_gemm_reducescatter& o = deref(op, "op");
    require(rows, "rows");
    *rows = o.op.rows_out(m);
  });
}

fo_status fo_gemm_reducescatter_rows(fo_gemm_reducescatter_t op, int64_t m, int64_t* rows, size_t count,
                                     size_t* needed) {
  return guard("fo_gemm_reducescatter_rows", [&] {
    const fo_gemm_reducescatter& o = deref(op, "op");
    if (!rows && count > 0) throw InvalidArgument("rows is NULL with count = " + std::to_string(count) + " (not 0)");
    const std::vector<int64_t> r = o.op.rows(m);
    if (needed) *needed = r.size();
    std::copy_n(r.begin(), std::min(count, r.size()), rows);
  });
}

fo_status fo_gemm_reducescatter_all_gather_rows(fo_gemm_reducescatter_t op, const void* local, void* full, int64_t m,
                                                void* stream) {
  return guard("fo_gemm_reducescatter_all_gather_rows", [&] {
    fo_gemm_reducescatter& o = deref(op, "op");
    require(local, "local");
    require(full, "full");
    o.op.all_gather_rows(local, full, m, static_cast<cudaStream_t>(stream));
  });
}

fo_status fo_gemm_reducescatter_prepare(fo_gemm_reducescatter_t op, int64_t m) {
  return guard("fo_gemm_reducescatter_prepare", [&] { deref(op, "op").op.prepare(m); });
}

fo_status fo_gemm_reducescatter_plan(fo_gemm_reducescatter_t op, int64_t m, char* buf, size_t size, size_t* needed) {
  return guard("fo_gemm_reducescatter_plan", [&] {
    op_plan(op, m, buf, size, needed);
  });
}

fo_status fo_gemm_reducescatter_check(fo_gemm_reducescatter_t op) {
  return guard("fo_gemm_reducescatter_check", [&] { deref(op, "op").op.check(); });
}

fo_status fo_gemm_reducescatter_shape(fo_gemm_reducescatter_t op, int64_t* max_m, int64_t* n, int64_t* k,
                                      fo_dtype* dtype, int* world) {
  return guard("fo_gemm_reducescatter_shape", [&] {
    op_shape(op, max_m, n, k, dtype);
    if (world) *world = op->op.world();
  });
}

fo_status fo_gemm_reducescatter_destroy(fo_gemm_reducescatter_t op) {
  return guard("fo_gemm_reducescatter_destroy", [&] { delete op; });
}

// ---- GemmAllToAll ----

fo_status fo_gemm_alltoall_options_default(fo_gemm_alltoall_options* options, size_t struct_size) {
  return guard("fo_gemm_alltoall_options_default", [&] {
    require(options, "options");
    check_default_size(struct_size, kA2aOptionsV1Size);
    // The defaults are GemmAllToAllOptions{}'s, by construction.
    static const flashoverlap::GemmAllToAllOptions defaults{};
    fo_gemm_alltoall_options d{};
    d.struct_size = struct_size;
    d.path = from_slots_path(defaults.path);
    d.nccl_sms = defaults.nccl_sms;
    d.wait_timeout_s = defaults.wait_timeout_s;
    d.exchange_timeout_s = defaults.exchange_timeout_s;
    d.experts = defaults.experts;
    d.input = int32_t(defaults.input), d.scales = int32_t(defaults.scales);
    write_options(options, d, struct_size);
  });
}

fo_status fo_gemm_alltoall_create(fo_comm_t comm, int64_t max_rows, int64_t max_tokens, int topk, int64_t n, int64_t k,
                                  fo_dtype dtype, const fo_gemm_alltoall_options* options, fo_gemm_alltoall_t* out) {
  return guard("fo_gemm_alltoall_create", [&] {
    require(out, "out");
    *out = nullptr;
    // (the values first, then the handle: what needs no GPU is checked
    // before what does)
    const flashoverlap::DType d = to_dtype(dtype);
    const flashoverlap::GemmAllToAllOptions o = to_a2a_options(options);
    const fo_comm& c = deref(comm, "comm");
    *out = new fo_gemm_alltoall{flashoverlap::GemmAllToAll(c.comm, max_rows, max_tokens, topk, n, k, d, o)};
  });
}

fo_status fo_gemm_alltoall_run(fo_gemm_alltoall_t op, const void* a, const void* b, const fo_alltoall_routing* routing,
                               void* out, int64_t ld_out, int combine, int32_t* tokens_out, void* stream) {
  return guard("fo_gemm_alltoall_run",
               [&] { a2a_run(op, a, b, routing, out, ld_out, combine, tokens_out, stream); });
}

fo_status fo_gemm_alltoall_run_scaled(fo_gemm_alltoall_t op, const void* a, const void* b,
                                      const fo_alltoall_routing* routing, void* out, int64_t ld_out, int combine,
                                      int32_t* tokens_out, void* stream, const float* scale_a, const float* scale_b) {
  return guard("fo_gemm_alltoall_run_scaled", [&] {
    a2a_run(op, a, b, routing, out, ld_out, combine, tokens_out, stream, flashoverlap::InputScales{scale_a, scale_b});
  });
}

fo_status fo_gemm_alltoall_last_plan(fo_gemm_alltoall_t op, char* buf, size_t size, size_t* needed) {
  return guard("fo_gemm_alltoall_last_plan", [&] {
    op_text(op, buf, size, needed, [](const auto& x) { return x.last_plan(); });
  });
}

fo_status fo_gemm_alltoall_check(fo_gemm_alltoall_t op) {
  return guard("fo_gemm_alltoall_check", [&] { deref(op, "op").op.check(); });
}

fo_status fo_gemm_alltoall_shape(fo_gemm_alltoall_t op, int64_t* max_rows, int64_t* max_tokens, int* topk, int64_t* n,
                                 int64_t* k, fo_dtype* dtype, int* world) {
  return guard("fo_gemm_alltoall_shape", [&] {
    op_shape(op, n, k, dtype);
    if (max_rows) *max_rows = op->op.max_rows();
    if (max_tokens) *max_tokens = op->op.max_tokens();
    if (topk) *topk = op->op.topk();
    if (world) *world = op->op.world();
  });
}

fo_status fo_gemm_alltoall_destroy(fo_gemm_alltoall_t op) {
  return guard("fo_gemm_alltoall_destroy", [&] { delete op; });
}

// ---- GroupedGemm ----

fo_status fo_gemm_grouped_options_default(fo_gemm_grouped_options* options, size_t struct_size) {
  return guard("fo_gemm_grouped_options_default", [&] {
    require(options, "options");
    check_default_size(struct_size, kGroupedOptionsV1Size);
    fo_gemm_grouped_options d{};
    d.struct_size = struct_size;
    d.path = FO_GROUPED_AUTO;  // (GroupedGemmOptions{}'s)
    write_options(options, d, struct_size);
  });
}

fo_status fo_gemm_grouped_create(int64_t max_rows, int experts, int64_t n, int64_t k, fo_dtype dtype,
                                 const fo_gemm_grouped_options* options, fo_gemm_grouped_t* out) {
  return guard("fo_gemm_grouped_create", [&] {
    require(out, "out");
    *out = nullptr;
    const flashoverlap::DType d = to_dtype(dtype);
    const flashoverlap::GroupedGemmOptions o = to_grouped_options(options);
    *out = new fo_gemm_grouped{flashoverlap::GroupedGemm(max_rows, experts, n, k, d, o)};
  });
}

fo_status fo_gemm_grouped_run(fo_gemm_grouped_t op, const void* a, const void* b, const int64_t* counts, void* out,
                              int64_t ld_out, void* stream) {
  return guard("fo_gemm_grouped_run", [&] {
    require(counts, "counts");
    deref(op, "op").op.run(a, b, counts, out, static_cast<cudaStream_t>(stream), ld_out);
  });
}

fo_status fo_gemm_grouped_run_offsets(fo_gemm_grouped_t op, const void* a, const void* b, const int32_t* offsets,
                                      int64_t rows, void* out, int64_t ld_out, void* stream) {
  return guard("fo_gemm_grouped_run_offsets", [&] {
    require(offsets, "offsets");
    deref(op, "op").op.run_offsets(a, b, offsets, rows, out, static_cast<cudaStream_t>(stream), ld_out);
  });
}

fo_status fo_gemm_grouped_check(fo_gemm_grouped_t op) {
  return guard("fo_gemm_grouped_check", [&] { deref(op, "op").op.check(); });
}

fo_status fo_gemm_grouped_last_plan(fo_gemm_grouped_t op, char* buf, size_t size, size_t* needed) {
  return guard("fo_gemm_grouped_last_plan", [&] {
    op_text(op, buf, size, needed, [](const auto& x) { return x.last_plan(); });
  });
}

fo_status fo_gemm_grouped_shape(fo_gemm_grouped_t op, int64_t* max_rows, int* experts, int64_t* n, int64_t* k,
                                fo_dtype* dtype) {
  return guard("fo_gemm_grouped_shape", [&] {
    op_shape(op, n, k, dtype);
    if (max_rows) *max_rows = op->op.max_rows();
    if (experts) *experts = op->op.experts();
  });
}

fo_status fo_gemm_grouped_destroy(fo_gemm_grouped_t op) {
  return guard("fo_gemm_grouped_destroy", [&] { delete op; });
}

}  // extern "C"
