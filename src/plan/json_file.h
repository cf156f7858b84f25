// json_file.h — reading and writing the planner's JSON files (bandwidth
// curves, tuning cache) with errors that name the file and the problem.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace flashoverlap::plan {

// Parses the file; throws InvalidArgument "<what> <path>: <problem>" when it
// cannot be read or is not JSON (a number out of double's range included), and
// nothing else of nlohmann's: callers map InvalidArgument to "bad input".
nlohmann::json read_json_file(const std::string& path, const std::string& what);

// Writes `text` to a temporary file in the same directory, then renames it over
// `path`: readers see the old or the new file, never a partial one. Throws Error.
void write_file_atomic(const std::string& path, const std::string& text);

// An exclusive advisory lock (flock) on the sidecar file "<path>.lock",
// created if need be and never removed (removing it would let two writers
// lock two different files). Held for the object's life, it serialises
// read-modify-write cycles of `path` across threads (each lock opens its own
// file description) and processes. Blocks until the lock is free. Throws
// Error when the lock file cannot be opened or locked.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace flashoverlap::plan
