// json_file.h — reading and writing the planner's JSON files (bandwidth
// curves, tuning cache) with errors that name the file and the problem.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace flashoverlap::plan {

// Parses the file; throws InvalidArgument "<what> <path>: <problem>" when it
// cannot be read or is not JSON.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

// Writes `text` to a temporary file in the same directory, then renames it over
// `path`: readers see the old or the new file, never a partial one. Throws Error.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace flashoverlap::plan
