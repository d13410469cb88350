// parseByteSize: every unit, blanks, and each refused form.
#include <catch2/catch.hpp>

#include "support/ByteSize.h"

using namespace piper;

TEST_CASE("parseByteSize reads bytes and the binary and decimal units",
          "[support]") {
  CHECK(*parseByteSize("0") == 0);
  CHECK(*parseByteSize("4096") == 4096);
  CHECK(*parseByteSize("1e9") == 1000000000);
  CHECK(*parseByteSize("12B") == 12);
  CHECK(*parseByteSize("20KiB") == 20 * 1024);
  CHECK(*parseByteSize("512MiB") == 512LL << 20);
  CHECK(*parseByteSize(" 80GiB ") == 80LL << 30);
  CHECK(*parseByteSize("1.5 TiB") == 3LL << 39);
  CHECK(*parseByteSize("16GB") == 16000000000LL);
  CHECK(*parseByteSize("2KB") == 2000);
  CHECK(*parseByteSize("3MB") == 3000000);
  CHECK(*parseByteSize("1TB") == 1000000000000LL);
}

TEST_CASE("parseByteSize refuses what is not a size", "[support]") {
  for (const char *bad : {"", " ", "80X", "-5GiB", "GiB", "1.2.3", "80 G",
                          "1e30", "nan", "8GiBs", "0x10"}) {
    StatusOr<int64_t> size = parseByteSize(bad);
    INFO(bad);
    REQUIRE_FALSE(size);
    CHECK(size.status().message() ==
          "'" + std::string(bad) +
              "': expected a size such as 80GiB, 512MiB, 16GB or a number of "
              "bytes");
  }
}
