#include "plan/json_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "flashoverlap/error.h"

namespace flashoverlap::plan {

namespace {
// nlohmann's what() without its "[json.exception.<kind>.<id>] " prefix.
std::string problem_of(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0)
    if (const size_t end = s.find("] "); end != std::string::npos) s.erase(0, end + 2);
  return s;
}
}  // namespace

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  // (A directory opens as a stream and reads as nothing: "not valid JSON".)
  if (std::filesystem::is_directory(path, ec)) throw InvalidArgument(what + " " + path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos)
    throw InvalidArgument(what + " " + path + ": empty file");
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidArgument(what + " " + path + ": not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {
    // parse() throws out_of_range, not parse_error, for a number no double
    // holds ("1e999": "number overflow parsing '1e999'").
    throw InvalidArgument(what + " " + path + ": " + problem_of(e));
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string name = ".";
  name += target.filename().string();
  name += ".XXXXXX";
  std::string tmpl = (dir / name).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throw Error("cannot create a temporary file next to " + path + ": " + std::strerror(errno));
  ::fchmod(fd, 0644);  // mkstemp makes it 0600; the cache is shared by the ranks
  const char* p = text.data();
  size_t left = text.size();
  bool ok = true;
  while (left > 0 && ok) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) p += n, left -= size_t(n);
  }
  const int err = ok ? 0 : errno;
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmpl.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(err ? err : errno);
    std::remove(tmpl.c_str());
    throw Error("cannot write " + path + ": " + why);
  }
}

FileLock::FileLock(const std::string& path) {
  const std::string lock = path + ".lock";
  // Read-only is enough for flock, and works on a lock file another user made.
  fd_ = ::open(lock.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open the lock file " + lock + ": " + std::strerror(errno));
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {}
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw Error("cannot lock " + lock + ": " + why);
  }
}

FileLock::~FileLock() { ::close(fd_); }  // closing releases the lock

EntriesFile::EntriesFile(std::string path, std::string format, int schema, std::string what, Check check)
    : path_(std::move(path)), format_(std::move(format)), what_(std::move(what)), schema_(schema), check_(std::move(check)) {
  read();
}

bool EntriesFile::read() {
  entries_.clear();
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return true;  // absent (or unreachable: the read would say why)
  auto reject = [&](const std::string& why) {
    warnings_.push_back(what_ + " " + path_ + ": " + why + "; ignoring it");
    return false;
  };
  nlohmann::json j;
  try {
    j = read_json_file(path_, what_);
  } catch (const InvalidArgument& e) {
    warnings_.push_back(std::string(e.what()) + "; ignoring it");
    return false;
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != format_) return reject("not a " + what_);
  if (!j.contains("schema") || j["schema"] != schema_)
    return reject("schema " + (j.contains("schema") ? j["schema"].dump() : std::string("missing")) +
                  " is not supported (this build reads " + std::to_string(schema_) + ")");
  if (!j.contains("entries") || !j["entries"].is_object()) return reject("no \"entries\" object");
  for (const auto& [name, entry] : j["entries"].items()) {
    try {
      check_(name, entry);
      entries_[name] = entry;
    } catch (const std::exception& e) {  // (the check's, and json errors from fields it reads)
      warnings_.push_back(what_ + " " + path_ + ": dropping entry " + name + ": " + e.what());
    }
  }
  return true;
}

void EntriesFile::store(const std::string& name, nlohmann::json entry) {
  // Without it, two writers that both re-read before either renames each
  // write their own entry only, and the last rename drops the other's.
  const FileLock lock(path_);
  if (!read()) {  // keep the damaged file for inspection instead of losing it silently
    const std::string aside = path_ + ".corrupt";
    if (std::rename(path_.c_str(), aside.c_str()) == 0)
      warnings_.push_back(what_ + " " + path_ + ": moved the damaged file to " + aside);
  }
  entries_[name] = std::move(entry);
  nlohmann::json j{{"format", format_}, {"schema", schema_}, {"entries", nlohmann::json::object()}};
  for (const auto& [n, e] : entries_) j["entries"][n] = e;
  write_file_atomic(path_, j.dump(1) + "\n");
}

}  // namespace flashoverlap::plan
