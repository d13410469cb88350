// The one regular-file check: each kind of path it refuses, named.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "support/RegularFile.h"

using namespace piper;

TEST_CASE("regularFileProblem names what a path is instead of a file",
          "[support]") {
  const char *tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/regular_file_test";
  ::mkdir(dir.c_str(), 0755);
  std::string file = dir + "/f", fifo = dir + "/fifo", link = dir + "/link";
  std::ofstream(file) << "x";
  ::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  ::unlink(link.c_str());
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);

  CHECK(regularFileProblem(file).empty());
  CHECK(isRegularFile(file));
  CHECK(regularFileProblem(link).empty()); // links are followed
  CHECK(regularFileProblem(dir) == "is a directory");
  CHECK(regularFileProblem(fifo) == "is not a regular file");
  CHECK(regularFileProblem("/dev/null") == "is not a regular file");
  CHECK(regularFileProblem(dir + "/missing") ==
        "cannot open: no such file or directory");
  CHECK(regularFileProblem("") == "cannot open: no such file or directory");
  CHECK_FALSE(isRegularFile(fifo));
}
