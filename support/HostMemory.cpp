#include "support/HostMemory.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace piper {

StatusOr<int64_t> memAvailableBytes(const std::string &meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  const std::string key = "MemAvailable:";
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0)
      continue;
    const char *p = line.c_str() + key.size();
    char *end = nullptr;
    errno = 0;
    long long kib = std::strtoll(p, &end, 10);
    std::string unit = end ? std::string(end) : std::string();
    unit.erase(0, unit.find_first_not_of(' '));
    if (end == p || errno != 0 || kib < 0 || unit != "kB" ||
        kib > (int64_t(1) << 53))
      return Status::error("malformed /proc/meminfo line '" + line + "'");
    return static_cast<int64_t>(kib) * 1024;
  }
  return Status::error("/proc/meminfo has no MemAvailable line");
}

StatusOr<int64_t> hostAvailableBytes() {
  std::ifstream file("/proc/meminfo");
  if (file) {
    std::ostringstream text;
    text << file.rdbuf();
    StatusOr<int64_t> bytes = memAvailableBytes(text.str());
    if (bytes)
      return bytes;
  }
  long pages = ::sysconf(_SC_AVPHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0)
    return static_cast<int64_t>(pages) * size;
  return Status::error("the host's available memory is unknown");
}

} // namespace piper
