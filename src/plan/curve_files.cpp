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

std::string allgather_curve_file(const std::string& dir, int world, const std::string& dtype) {
  return dir + "/allgather-ce-w" + std::to_string(world) + "-" + dtype + ".json";
}

std::optional<BandwidthCurve> load_fitting_curve(const std::string& path, Collective op,
                                                       const std::string& gpu, int world, std::ostream& log) {
  if (path.empty() || !std::filesystem::exists(path)) return std::nullopt;
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

BandwidthCurve cached_curve(const std::string& path, Collective op, const std::string& gpu, int world,
                                  bool save, const std::function<bool(bool)>& all_ranks,
                                  const std::function<BandwidthCurve()>& measure, std::ostream& log) {
  std::optional<BandwidthCurve> mine = load_fitting_curve(path, op, gpu, world, log);
  if (all_ranks(mine.has_value())) return *mine;
  BandwidthCurve c = measure();
  if (save && !path.empty()) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    c.save(path);
  }
  return c;
}

}  // namespace flashoverlap::plan
