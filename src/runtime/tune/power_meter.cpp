// power_meter.cpp — see power_meter.h. NVML is opened with dlopen and its
// few entry points declared here (its ABI: C functions returning an int
// status, 0 = success; devices are opaque handles).
#include "runtime/tune/power_meter.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <type_traits>

#include "flashoverlap/error.h"

namespace flashoverlap::rt {

PowerSummary summarize(const std::vector<PowerSample>& s) {
  PowerSummary out;
  if (s.size() < 2) return out;
  out.samples = int(s.size());
  out.seconds = s.back().t_s - s.front().t_s;
  out.joules = double(s.back().energy_mj - s.front().energy_mj) / 1e3;
  out.mean_w = out.seconds > 0 ? out.joules / out.seconds : 0;
  double mhz = 0;
  int capped = 0;
  out.sm_mhz_min = s.front().sm_mhz;
  for (const PowerSample& p : s) {
    mhz += p.sm_mhz;
    out.sm_mhz_min = std::min(out.sm_mhz_min, p.sm_mhz);
    capped += p.power_capped ? 1 : 0;
  }
  out.sm_mhz_mean = mhz / double(s.size());
  out.capped_share = double(capped) / double(s.size());
  return out;
}

EnergyBound energy_bound(double idle_w, const CallEnergy& gemm, const CallEnergy& comm, double sequential_ms,
                         const CallEnergy& overlapped) {
  EnergyBound b;
  b.ideal_ms = std::max(gemm.ms, comm.ms);
  b.least_mj = gemm.mj + std::max(0.0, comm.mj - idle_w * comm.ms);  // W x ms = mJ
  b.bound_ms = std::max(b.ideal_ms, gemm.w > 0 ? b.least_mj / gemm.w : 0.0);
  const double ideal_gain = sequential_ms - b.ideal_ms;
  if (ideal_gain > 0) {
    b.bound_gain = (sequential_ms - b.bound_ms) / ideal_gain;
    b.gain = (sequential_ms - overlapped.ms) / ideal_gain;
  }
  b.excess_mj = overlapped.mj - b.least_mj;
  return b;
}

namespace {
using Status = int;
using Device = void*;
constexpr unsigned kClockSm = 1;                 // NVML_CLOCK_SM
constexpr unsigned long long kSwPowerCap = 0x4;  // clock event reasons: software power cap
constexpr unsigned long long kHwPowerBrake = 0x80;
}  // namespace

struct PowerMeter::Api {
  void* lib = nullptr;
  Status (*init)() = nullptr;
  Status (*shutdown)() = nullptr;
  Status (*by_bus_id)(const char*, Device*) = nullptr;
  Status (*energy)(Device, unsigned long long*) = nullptr;
  Status (*clock)(Device, unsigned, unsigned*) = nullptr;
  Status (*limit)(Device, unsigned*) = nullptr;
  Status (*reasons)(Device, unsigned long long*) = nullptr;
  bool inited = false;
  ~Api() {
    if (inited) shutdown();
    if (lib) dlclose(lib);
  }
};

std::unique_ptr<PowerMeter> PowerMeter::open(const std::string& pci_bus_id, std::string* why_not) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<PowerMeter> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) return fail("NVML (libnvidia-ml.so.1) not found: no driver on this machine");
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->lib, name));
    return fn != nullptr;
  };
  if (!sym(api->init, "nvmlInit_v2") || !sym(api->shutdown, "nvmlShutdown") ||
      !sym(api->by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") ||
      !sym(api->energy, "nvmlDeviceGetTotalEnergyConsumption") || !sym(api->clock, "nvmlDeviceGetClockInfo") ||
      !sym(api->limit, "nvmlDeviceGetEnforcedPowerLimit"))
    return fail("NVML lacks an entry point this meter needs");
  // The clock reasons' newer name first (the older one is deprecated).
  if (!sym(api->reasons, "nvmlDeviceGetCurrentClocksEventReasons"))
    sym(api->reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  if (Status st = api->init(); st != 0) return fail("nvmlInit failed (NVML status " + std::to_string(st) + ")");
  api->inited = true;
  Device dev = nullptr;
  if (Status st = api->by_bus_id(pci_bus_id.c_str(), &dev); st != 0)
    return fail("NVML has no GPU at PCI bus id '" + pci_bus_id + "' (NVML status " + std::to_string(st) + ")");
  unsigned long long e = 0;
  if (Status st = api->energy(dev, &e); st != 0)
    return fail("NVML gives no energy counter for this GPU (NVML status " + std::to_string(st) + ")");
  unsigned limit_mw = 0;
  std::unique_ptr<PowerMeter> m(new PowerMeter());
  if (api->limit(dev, &limit_mw) == 0) m->limit_w_ = limit_mw / 1e3;
  m->api_ = std::move(api);
  m->device_ = dev;
  return m;
}

PowerMeter::~PowerMeter() = default;

PowerSample PowerMeter::sample() const {
  PowerSample s;
  s.t_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  unsigned long long e = 0, why = 0;
  unsigned mhz = 0;
  if (Status st = api_->energy(device_, &e); st != 0)
    throw Error("NVML energy counter read failed (NVML status " + std::to_string(st) + ")");
  if (Status st = api_->clock(device_, kClockSm, &mhz); st != 0)
    throw Error("NVML SM clock read failed (NVML status " + std::to_string(st) + ")");
  if (api_->reasons && api_->reasons(device_, &why) == 0) s.power_capped = (why & (kSwPowerCap | kHwPowerBrake)) != 0;
  s.energy_mj = e, s.sm_mhz = int(mhz);
  return s;
}

}  // namespace flashoverlap::rt
