#include "plan/latency_model.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "flashoverlap/error.h"
#include "plan/json_file.h"

namespace flashoverlap::plan {

BandwidthCurve::BandwidthCurve(Collective op, int32_t world, std::vector<CurveSample> samples, std::string gpu)
    : op_(op), world_(world), gpu_(std::move(gpu)), samples_(std::move(samples)) {
  if (world_ < 1) throw InvalidArgument("bandwidth curve: world " + std::to_string(world_) + " must be >= 1");
  if (samples_.size() < 2)
    throw InvalidArgument("bandwidth curve: needs at least 2 samples, got " + std::to_string(samples_.size()));
  double running = 0;
  for (size_t i = 0; i < samples_.size(); ++i) {
    const CurveSample& s = samples_[i];
    if (!(s.bytes > 0) || !std::isfinite(s.bytes) || !(s.ms > 0) || !std::isfinite(s.ms))
      throw InvalidArgument("bandwidth curve: sample " + std::to_string(i) +
                            " needs positive finite bytes and ms");
    // (what no collective call measures: the model's sums would overflow or mean nothing)
    if (s.bytes > kMaxCurveBytes || s.ms > kMaxCurveMs) {
      std::ostringstream os;
      os << std::setprecision(4) << "bandwidth curve: sample " << i << " (" << s.bytes << " bytes in " << s.ms
         << " ms) is beyond " << kMaxCurveBytes << " bytes or " << kMaxCurveMs
         << " ms per call: not a measured collective";
      throw InvalidArgument(os.str());
    }
    if (i > 0 && !(s.bytes > samples_[i - 1].bytes))
      throw InvalidArgument("bandwidth curve: bytes must increase strictly (sample " + std::to_string(i) +
                            " has " + std::to_string(s.bytes) + " after " + std::to_string(samples_[i - 1].bytes) +
                            ")");
    running = std::max(running, s.ms);
    log_bytes_.push_back(std::log(s.bytes));
    env_ms_.push_back(running);
  }
}

double BandwidthCurve::latency_ms(double bytes) const {
  const size_t n = samples_.size();
  if (!(bytes > samples_.front().bytes)) return env_ms_.front();
  if (bytes >= samples_.back().bytes) {
    const double slope = (env_ms_[n - 1] - env_ms_[n - 2]) / (samples_[n - 1].bytes - samples_[n - 2].bytes);
    return env_ms_[n - 1] + (bytes - samples_[n - 1].bytes) * slope;
  }
  const size_t hi = size_t(std::upper_bound(samples_.begin(), samples_.end(), bytes,
                                            [](double b, const CurveSample& s) { return b < s.bytes; }) -
                           samples_.begin());
  const double f = (std::log(bytes) - log_bytes_[hi - 1]) / (log_bytes_[hi] - log_bytes_[hi - 1]);
  return env_ms_[hi - 1] + f * (env_ms_[hi] - env_ms_[hi - 1]);
}

nlohmann::json BandwidthCurve::to_json() const {
  nlohmann::json j{{"format", kFormat}, {"schema", kSchema}, {"collective", to_string(op_)}, {"world", world_}};
  if (!gpu_.empty()) j["gpu"] = gpu_;
  j["samples"] = nlohmann::json::array();
  for (const CurveSample& s : samples_) j["samples"].push_back({s.bytes, s.ms});
  return j;
}

BandwidthCurve BandwidthCurve::from_json(const nlohmann::json& j, const std::string& source) {
  auto fail = [&](const std::string& what) -> BandwidthCurve {
    throw InvalidArgument("bandwidth curve " + source + ": " + what);
  };
  if (!j.is_object()) return fail("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat)
    return fail(std::string("not a flashoverlap bandwidth curve (expected \"format\": \"") + kFormat + "\")");
  if (!j.contains("schema") || !j["schema"].is_number_integer())
    return fail("missing integer \"schema\" version");
  if (j["schema"].get<int64_t>() != kSchema)
    return fail("schema version " + j["schema"].dump() + " is not supported (this build reads " +
                std::to_string(kSchema) + ")");
  if (!j.contains("collective") || !j["collective"].is_string()) return fail("missing \"collective\" string");
  if (!j.contains("world") || !j["world"].is_number_integer()) return fail("missing integer \"world\"");
  if (j.contains("gpu") && !j["gpu"].is_string()) return fail("\"gpu\" must be a string");
  if (!j.contains("samples") || !j["samples"].is_array()) return fail("missing \"samples\" array");
  std::vector<CurveSample> samples;
  for (const auto& s : j["samples"]) {
    if (!s.is_array() || s.size() != 2 || !s[0].is_number() || !s[1].is_number())
      return fail("sample " + std::to_string(samples.size()) + " is not a [bytes, ms] pair of numbers");
    samples.push_back({s[0].get<double>(), s[1].get<double>()});
  }
  const int64_t world = j["world"].get<int64_t>();
  if (world < 1 || world > 1 << 20) return fail("world " + std::to_string(world) + " out of range");
  try {
    return BandwidthCurve(parse_collective(j["collective"].get<std::string>()), int32_t(world), std::move(samples),
                          j.value("gpu", std::string()));
  } catch (const InvalidArgument& e) {
    return fail(e.what());
  }
}

BandwidthCurve BandwidthCurve::load(const std::string& path) {
  return from_json(read_json_file(path, "bandwidth curve"), path);
}

void BandwidthCurve::save(const std::string& path) const { write_file_atomic(path, to_json().dump(1) + "\n"); }

BandwidthCurve BandwidthCurve::builtin_h200(Collective op) {
  static const double kBytes[] = {65536,    131072,   262144,   524288,    1048576,   2097152,  4194304,
                                  8388608,  16777216, 33554432, 67108864,  134217728, 268435456};
  static const double kAllReduce[] = {0.0720, 0.0740, 0.0780, 0.0787, 0.0788, 0.0718, 0.0718,
                                      0.0887, 0.1179, 0.1840, 0.3071, 0.5415, 0.9814};
  static const double kReduceScatter[] = {0.0692, 0.0643, 0.0724, 0.0721, 0.0708, 0.0721, 0.0771,
                                          0.0733, 0.0886, 0.1315, 0.2113, 0.3599, 0.6538};
  static const double kAllToAll[] = {0.0874, 0.0783, 0.0778, 0.0849, 0.0851, 0.0798, 0.0874,
                                     0.0854, 0.0932, 0.1237, 0.1858, 0.3096, 0.5490};
  const double* ms = op == Collective::AllReduce ? kAllReduce : op == Collective::ReduceScatter ? kReduceScatter
                                                                                                 : kAllToAll;
  std::vector<CurveSample> samples;
  for (size_t i = 0; i < std::size(kBytes); ++i) samples.push_back({kBytes[i], ms[i]});
  return BandwidthCurve(op, 2, std::move(samples), "NVIDIA H200 (built-in)");
}

CommModel::CommModel(BandwidthCurve c, int32_t w, int32_t saturating)
    : curve(std::move(c)), world(w), saturating_ctas(saturating) {
  if (world < 1) throw InvalidArgument("world size " + std::to_string(world) + " must be >= 1");
  if (saturating_ctas < 1) throw InvalidArgument("saturating CTAs must be >= 1");
  if (curve.world() == 1 && world != 1)
    throw InvalidArgument("a bandwidth curve measured on 1 rank cannot be scaled to world " + std::to_string(world));
}

double CommModel::bytes_scale() const {
  if (world == curve.world()) return 1.0;
  const auto ring = [](double w) { return (w - 1) / w; };
  return ring(world) / ring(curve.world());
}

double CommModel::ms(double bytes, int32_t comm_ctas) const {
  const double full = curve.latency_ms(bytes * bytes_scale());
  if (comm_ctas <= 0 || comm_ctas >= saturating_ctas) return full;
  return curve.overhead_ms() + (full - curve.overhead_ms()) * double(saturating_ctas) / comm_ctas;
}

std::string CommModel::describe() const {
  std::ostringstream o;
  o << to_string(curve.op()) << " curve " << (curve.gpu().empty() ? "(unnamed GPU)" : curve.gpu()) << ", "
    << curve.samples().size() << " samples measured on " << curve.world() << " ranks";
  if (world != curve.world()) o << "; bytes scaled x" << bytes_scale() << " for " << world << " ranks (ring traffic)";
  o << "; bandwidth x" << saturating_ctas << "/CTAs below " << saturating_ctas << " NCCL CTAs";
  return o.str();
}

double GemmModel::efficiency(TileShape t) {
  if (t == TileShape{128, 256}) return 1.0;
  if (t == TileShape{128, 128}) return 0.92;
  if (t == TileShape{128, 192}) return 1.0;  // (FP8's wide tile: per flop as 128x256 is for 16-bit inputs)
  // (FP8: each k-block's shared-memory reads fall less than its flops against 128x192's)
  if (t == TileShape{128, 160}) return 0.9;
  // (FP8: as 128x160's, a little less: its k-blocks' fixed cost over fewer flops)
  if (t == TileShape{128, 144}) return 0.87;
  // (FP8: a wave takes nearly 128x128's time for 7/8 of its flops; design §13)
  if (t == TileShape{128, 112}) return 0.84;
  throw InvalidArgument("no default GEMM estimate for tile " + to_string(t) +
                        " (known: 128x256, 128x192, 128x160, 128x144, 128x128, 128x112; pass measured wave times)");
}

double GemmModel::wave_ms(TileShape t, int64_t k) const {
  const double per_sm_flops = peak_tflops * 1e12 / peak_sms * efficiency(t);
  return 2.0 * t.bm * t.bn * double(k) / per_sm_flops * 1e3;
}

std::vector<double> GemmModel::waves_ms(const Schedule& s, int64_t k) const {
  return std::vector<double>(size_t(s.waves()), wave_ms({s.bm, s.bn}, k));
}

}  // namespace flashoverlap::plan
