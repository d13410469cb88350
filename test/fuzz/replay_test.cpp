// Replays the fuzz targets' seed corpora and crash reproducers
// (test/fuzz/corpus/<target>/, test/fuzz/crashes/<target>/) through the
// entry points of Targets.h, built with the normal toolchain: no input may
// crash, every seed of a real file must be accepted, and every reproducer
// must be rejected with an error message.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/fuzz/Targets.h"

namespace fs = std::filesystem;
using piper::fuzz::Target;

namespace {

fs::path fuzzDir() {
  const char *src = std::getenv("TEST_SRCDIR");
  const char *ws = std::getenv("TEST_WORKSPACE");
  REQUIRE(src);
  return fs::path(src) / (ws ? ws : "piper") / "test" / "fuzz";
}

std::vector<fs::path> filesIn(const fs::path &dir) {
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const fs::directory_entry &e : fs::directory_iterator(dir))
      if (e.is_regular_file())
        files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string readFile(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

piper::fuzz::Result run(const Target &t, const std::string &bytes) {
  return t.run(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
}

} // namespace

TEST_CASE("every target has seeds, and every seed named ok-* is accepted") {
  for (const Target &t : piper::fuzz::targets()) {
    std::vector<fs::path> seeds = filesIn(fuzzDir() / "corpus" / t.name);
    INFO("target " << t.name);
    CHECK(!seeds.empty());
    for (const fs::path &seed : seeds) {
      INFO("seed " << seed.filename().string());
      piper::fuzz::Result r = run(t, readFile(seed));
      if (seed.filename().string().rfind("ok-", 0) == 0)
        CHECK(r == "");
      else
        CHECK(r != "");
    }
  }
}

TEST_CASE("every crash reproducer is rejected with an error") {
  for (const Target &t : piper::fuzz::targets()) {
    for (const fs::path &input : filesIn(fuzzDir() / "crashes" / t.name)) {
      INFO("target " << t.name << ", reproducer " << input.filename().string());
      CHECK(run(t, readFile(input)) != "");
    }
  }
}
