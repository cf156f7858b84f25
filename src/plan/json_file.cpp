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

}  // namespace flashoverlap::plan
