// power_meter.h — a GPU's energy counter, power, SM clock and power-cap
// state through NVML, loaded at run time (libnvidia-ml ships with the
// driver): on a machine without it there is no meter, and no error. Host
// only; the caller names the GPU by its PCI bus id (cudaDeviceGetPCIBusId).
//
// Why: on the H200s the overlapped GEMM + NVLink transfers run at the 700 W
// cap with lowered SM clocks (docs/results.md §2.5), so `bench --power`
// reports what each variant draws.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashoverlap::rt {

struct PowerSample {
  double t_s = 0;           // host steady clock, seconds
  uint64_t energy_mj = 0;   // the GPU's energy counter (mJ since the driver loaded)
  int sm_mhz = 0;
  bool power_capped = false;  // a power-cap clock reason is active (software cap or hardware brake)
};

struct PowerSummary {
  int samples = 0;
  double seconds = 0, joules = 0, mean_w = 0;
  double sm_mhz_mean = 0;
  int sm_mhz_min = 0;
  double capped_share = 0;  // of the samples
};

// Over a run sampled in time order (at least 2 samples, else all zero):
// energy and mean power from the counter's first and last values, clocks and
// the capped share over every sample.
PowerSummary summarize(const std::vector<PowerSample>& s);

// One variant called back to back: ms and mJ per call, mean power.
struct CallEnergy {
  double ms = 0, mj = 0, w = 0;
};

// What the power limit allows an overlapped GEMM + collective called back to
// back, when the GEMM alone already runs at the limit (docs/results.md §2.5):
// it cannot take less than max(GEMM, collective), nor less than its least
// energy, the GEMM's plus the collective's above idle, at the GEMM's power.
// Gains are shares of the ideal one, sequential - max(GEMM, collective)
// (0 where that is not positive).
struct EnergyBound {
  double ideal_ms = 0;    // max(GEMM, collective)
  double least_mj = 0;    // GEMM + collective above idle (never below the GEMM's)
  double bound_ms = 0;    // max(ideal, least energy / the GEMM's power)
  double bound_gain = 0;  // (sequential - bound) / (sequential - ideal)
  double gain = 0;        // the same for the overlapped call
  double excess_mj = 0;   // its energy per call above least_mj
};
EnergyBound energy_bound(double idle_w, const CallEnergy& gemm, const CallEnergy& comm, double sequential_ms,
                         const CallEnergy& overlapped);

class PowerMeter {
 public:
  // Null, with the reason in *why_not, when NVML or the GPU is not there.
  static std::unique_ptr<PowerMeter> open(const std::string& pci_bus_id, std::string* why_not);
  ~PowerMeter();
  PowerMeter(const PowerMeter&) = delete;
  PowerMeter& operator=(const PowerMeter&) = delete;

  PowerSample sample() const;  // throws Error if NVML fails mid-run
  double limit_w() const { return limit_w_; }

 private:
  PowerMeter() = default;
  struct Api;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;
  double limit_w_ = 0;
};

}  // namespace flashoverlap::rt
