// Unit tests of the whole-buffer descriptor I/O (FileIO.h) and errnoMessage.
#include "support/FileIO.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <string>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "support/Errno.h"

using namespace piper;

TEST_CASE("preadAll reads at an offset and refuses a short file") {
  char path[] = "/tmp/piper-file-io-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::string text = "0123456789";
  REQUIRE(writeAll(fd, text.data(), text.size()));
  char got[4] = {};
  CHECK(preadAll(fd, got, 4, 3));
  CHECK(std::string(got, 4) == "3456");
  CHECK_FALSE(preadAll(fd, got, 4, 8)); // two bytes left
  ::close(fd);
  ::unlink(path);
}

TEST_CASE("sendAll and recvAll move whole buffers; a closed peer is ECONNRESET") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  std::string big(1 << 20, 'x');
  big.back() = 'y';
  std::string in(big.size(), '\0');
  // Larger than the socket buffer: the writer needs the reader to make room.
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    std::_Exit(sendAll(fds[1], big.data(), big.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  CHECK(recvAll(fds[0], in.data(), in.size()));
  CHECK(in == big);
  char more;
  errno = 0;
  CHECK_FALSE(recvAll(fds[0], &more, 1));
  CHECK(errno == ECONNRESET);
  ::close(fds[0]);
  int status = -1;
  ::waitpid(child, &status, 0);
  CHECK(status == 0);
}

TEST_CASE("writeAll reports the error of a closed pipe") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  ::close(fds[0]);
  ::signal(SIGPIPE, SIG_IGN);
  CHECK_FALSE(writeAll(fds[1], "x", 1));
  CHECK(errnoMessage(errno) == "broken pipe");
  ::close(fds[1]);
}
