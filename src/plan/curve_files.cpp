// curve_files.cpp — see curve_files.h.
#include "plan/curve_files.h"

#include <filesystem>
#include <ostream>

#include "flashoverlap/error.h"
#include "plan/collective.h"

namespace flashoverlap::plan {

std::string allreduce_curve_file(const std::string& dir, int ctas, int world, const std::string& dtype) {
  return dir + "/allreduce-ctas" + (ctas > 0 ? std::to_string(ctas) : std::string("default")) + "-w" +
         std::to_string(world) + "-" + dtype + ".json";
}

std::optional<BandwidthCurve> load_fitting_curve(const std::string& path, Collective op, const std::string& gpu,
                                                 int world, std::ostream& log) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    BandwidthCurve c = BandwidthCurve::load(path);
    std::string why;
    if (c.op() != op) why = "it is a " + std::string(to_string(c.op())) + " curve";
    else if (c.world() != world) why = "it was measured on " + std::to_string(c.world()) + " ranks";
    else if (c.gpu() != gpu) why = "it was measured on a " + c.gpu();
    if (why.empty()) return c;
    log << "curve " << path << " not used: " << why << " (this run: " << world << " x " << gpu << "); measuring\n";
  } catch (const std::exception& e) {
    log << "curve " << path << " not used (" << e.what() << "); measuring\n";
  }
  return std::nullopt;
}

BandwidthCurve cached_curve(const std::string& path, Collective op, const std::string& gpu, int world, bool save,
                            const RankAgreement& ranks, const std::function<BandwidthCurve()>& measure,
                            std::ostream& log) {
  const std::optional<BandwidthCurve> mine = load_fitting_curve(path, op, gpu, world, log);
  if (ranks.all_ranks(mine.has_value()))
    return BandwidthCurve::from_json(nlohmann::json::parse(ranks.from_rank0(mine->to_json().dump())),
                                     "rank 0's " + path);
  BandwidthCurve c = measure();
  if (save && !path.empty()) {
    try {
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      c.save(path);
    } catch (const std::exception& e) {
      log << "curve not saved to " << path << ": " << e.what() << "\n";
    }
  }
  return c;
}

}  // namespace flashoverlap::plan
