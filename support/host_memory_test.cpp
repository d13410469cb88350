// hostAvailableBytes and the /proc/meminfo line it reads.
#include <catch2/catch.hpp>

#include "support/HostMemory.h"

using namespace piper;

TEST_CASE("memAvailableBytes reads MemAvailable in kB", "[support]") {
  CHECK(*memAvailableBytes("MemTotal:       24576000 kB\n"
                           "MemFree:         1000000 kB\n"
                           "MemAvailable:   12345678 kB\n"
                           "Buffers:           20000 kB\n") ==
        12345678LL * 1024);
  CHECK(*memAvailableBytes("MemAvailable: 0 kB") == 0);
  CHECK(memAvailableBytes("MemTotal: 5 kB\n").status().message() ==
        "/proc/meminfo has no MemAvailable line");
  for (const char *bad : {"MemAvailable: kB", "MemAvailable: 12 MB",
                          "MemAvailable: -4 kB", "MemAvailable: 12"}) {
    INFO(bad);
    CHECK(memAvailableBytes(bad).status().message() ==
          "malformed /proc/meminfo line '" + std::string(bad) + "'");
  }
}

TEST_CASE("hostAvailableBytes is known and positive on Linux", "[support]") {
  StatusOr<int64_t> bytes = hostAvailableBytes();
  INFO(bytes.status().message());
  REQUIRE(bytes);
  CHECK(*bytes > 0);
}
