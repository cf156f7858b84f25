// json_file.h — reading and writing the planner's JSON files (bandwidth
// curves, tuning cache) with errors that name the file and the problem.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

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

// A file of named entries that runs must never be stopped by (it can always
// be rebuilt): {"format": F, "schema": S, "entries": {"<name>": {...}}}.
// Reading never throws: a file that is not one (not JSON, foreign format,
// another schema) reads as empty, an entry that `check` rejects (throws) is
// dropped; each goes to warnings(). store() holds a FileLock across its
// re-read, merge and atomic write, so that concurrent writers (threads,
// processes) keep every entry; a damaged file is moved aside first, to
// "<path>.corrupt". The tuning cache and the measured picks are two.
class EntriesFile {
 public:
  // check(name, entry) throws for an entry that does not belong.
  using Check = std::function<void(const std::string& name, const nlohmann::json& entry)>;
  EntriesFile(std::string path, std::string format, int schema, std::string what, Check check);

  const std::map<std::string, nlohmann::json>& entries() const { return entries_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  const std::string& path() const { return path_; }
  // Throws Error when the file cannot be locked or written.
  void store(const std::string& name, nlohmann::json entry);

 private:
  bool read();  // false (with a warning) where the file exists but is not one
  std::string path_, format_, what_;
  int schema_;
  Check check_;
  std::map<std::string, nlohmann::json> entries_;
  std::vector<std::string> warnings_;
};

}  // namespace flashoverlap::plan
