// Sharded checkpoint slices (ShardedCheckpoints.h): flat ranges and
// tensor-parallel slices, read back by flat ranges; bad slice metadata is
// an error naming the file and the tensor.
#include "runtime/launch/checkpoints/ShardedCheckpoints.h"

#include <cstdlib>
#include <numeric>

#include <catch2/catch.hpp>

using namespace piper;
using namespace piper::runtime;

namespace {

std::string tempDir() {
  std::string dir = std::string(std::getenv("TEST_TMPDIR")
                                    ? std::getenv("TEST_TMPDIR")
                                    : "/tmp") +
                    "/sharded-XXXXXX";
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  return dir;
}

/// One file holding `values` as tensor `name` described by `slice`.
std::unique_ptr<SafetensorsReader> file(const std::string &path,
                                        const std::string &name,
                                        const std::vector<float> &values,
                                        const std::string &slice) {
  SafetensorsTensor t{name, "F32", {int64_t(values.size())}, values.data()};
  Status s = writeSafetensors(path, {t},
                              {{"piper.slices", "{\"" + name + "\": " +
                                                    slice + "}"}});
  REQUIRE(s.isOk());
  std::unique_ptr<SafetensorsReader> r = SafetensorsReader::open(path, s);
  REQUIRE(s.isOk());
  return r;
}

} // namespace

TEST_CASE("tensor-parallel slices of a fused weight read back whole") {
  // A [2, 8] weight of parts q|k|v = 4|2|2 columns over 2 members: member
  // 0 holds columns 0,1,4,6 of each row, member 1 columns 2,3,5,7.
  std::vector<float> whole(16);
  std::iota(whole.begin(), whole.end(), 0.0f);
  const std::vector<int> cols[2] = {{0, 1, 4, 6}, {2, 3, 5, 7}};
  std::string dir = tempDir();
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  for (int m = 0; m < 2; ++m) {
    std::vector<float> mine;
    for (int row = 0; row < 2; ++row)
      for (int c : cols[m])
        mine.push_back(whole[row * 8 + c]);
    files.push_back(file(dir + "/rank-" + std::to_string(m), "w", mine,
                         "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, "
                         "\"member\": " +
                             std::to_string(m) + ", \"parts\": [4, 2, 2]}"));
  }
  ShardIndex index;
  REQUIRE(index.open(std::move(files)).isOk());
  std::vector<float> got(16, -1.0f);
  REQUIRE(index.read("w", 0, 16, got.data()).isOk());
  CHECK(got == whole);
  // Any flat range: row 1's k and v columns.
  std::vector<float> part(4);
  REQUIRE(index.read("w", 12, 4, part.data()).isOk());
  CHECK(part == std::vector<float>{12, 13, 14, 15});
}

TEST_CASE("ZeRO ranges of tensor-parallel slices read back whole") {
  // The same weight under ZeRO over 2 data replicas of each member: each
  // rank writes 4 of its member's 8 local elements, from "start".
  std::vector<float> whole(16);
  std::iota(whole.begin(), whole.end(), 0.0f);
  const std::vector<int> cols[2] = {{0, 1, 4, 6}, {2, 3, 5, 7}};
  std::string dir = tempDir();
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  for (int m = 0; m < 2; ++m) {
    std::vector<float> local;
    for (int row = 0; row < 2; ++row)
      for (int c : cols[m])
        local.push_back(whole[row * 8 + c]);
    for (int start : {0, 4})
      files.push_back(file(
          dir + "/rank-" + std::to_string(2 * start / 4 + m), "w",
          std::vector<float>(local.begin() + start, local.begin() + start + 4),
          "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, \"member\": " +
              std::to_string(m) + ", \"parts\": [4, 2, 2], \"start\": " +
              std::to_string(start) + "}"));
  }
  ShardIndex index;
  REQUIRE(index.open(std::move(files)).isOk());
  std::vector<float> got(16, -1.0f);
  REQUIRE(index.read("w", 0, 16, got.data()).isOk());
  CHECK(got == whole);
}

TEST_CASE("one member's slices alone do not cover the tensor") {
  std::string dir = tempDir();
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  files.push_back(file(dir + "/rank-0", "w", {0, 1, 4, 6, 8, 9, 12, 14},
                       "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, "
                       "\"member\": 0, \"parts\": [4, 2, 2]}"));
  ShardIndex index;
  REQUIRE(index.open(std::move(files)).isOk());
  std::vector<float> got(16);
  Status s = index.read("w", 0, 16, got.data());
  CHECK(s.message().find("does not hold all of elements [0, 16)") !=
        std::string::npos);
}

TEST_CASE("bad tensor-parallel slice metadata is an error") {
  std::string dir = tempDir();
  const char *bad[] = {
      // member out of range, parts that do not sum to the dimension, a
      // dimension the members do not divide, too few elements, no members,
      "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, \"member\": 2, "
      "\"parts\": []}",
      "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, \"member\": 0, "
      "\"parts\": [4, 2]}",
      "{\"global\": [2, 7], \"dim\": 1, \"members\": 2, \"member\": 0, "
      "\"parts\": []}",
      "{\"global\": [4, 8], \"dim\": 1, \"members\": 2, \"member\": 0, "
      "\"parts\": []}",
      "{\"global\": [2, 8], \"dim\": 1, \"member\": 0, \"parts\": []}",
      // a ZeRO range past the member's 8 elements.
      "{\"global\": [2, 8], \"dim\": 1, \"members\": 2, \"member\": 0, "
      "\"parts\": [], \"start\": 1}",
  };
  for (const char *slice : bad) {
    std::vector<std::unique_ptr<SafetensorsReader>> files;
    files.push_back(file(dir + "/rank-0", "w", std::vector<float>(8), slice));
    ShardIndex index;
    Status s = index.open(std::move(files));
    INFO(slice);
    CHECK(s.message().find("bad slice of 'w' in piper.slices") !=
          std::string::npos);
  }
}
