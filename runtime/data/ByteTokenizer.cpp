// Byte-level tokenization of a file, streamed in chunks.
#include "runtime/data/ByteTokenizer.h"

#include <cerrno>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

Status tokenizeBytesFile(const std::string &inputPath,
                         const std::string &outputPath, TokenDType dtype,
                         bool withHeader, int64_t &numTokens) {
  numTokens = 0;
  if (dtype == TokenDType::Auto)
    dtype = TokenDType::U16;
  // Opening a FIFO would block until a writer comes, and a device such as
  // /dev/zero would never end.
  PIPER_RETURN_IF_ERROR(
      checkRegularFile(inputPath, "input '" + inputPath + "'"));
  int fd = ::open(inputPath.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::error("input '" + inputPath +
                         "': cannot open: " + errnoMessage(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return Status::error("input '" + inputPath + "': is not a regular file");
  // The output replaces its file whole: were it the input (by any name),
  // the text would be gone.
  struct stat outSt;
  if (::stat(outputPath.c_str(), &outSt) == 0 && outSt.st_dev == st.st_dev &&
      outSt.st_ino == st.st_ino)
    return Status::error("output '" + outputPath + "' is the input '" +
                         inputPath +
                         "': piper-tokenize does not overwrite its input");

  AtomicFile out;
  PIPER_RETURN_IF_ERROR(out.open(outputPath));
  if (withHeader) {
    std::string header = tokenFileHeader(dtype);
    PIPER_RETURN_IF_ERROR(out.write(header.data(), header.size()));
  }
  int width = tokenWidth(dtype);
  std::vector<unsigned char> in(1 << 20);
  std::vector<unsigned char> tokens(in.size() * width, 0);
  while (true) {
    ssize_t got = ::read(fd, in.data(), in.size());
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return Status::error("input '" + inputPath +
                           "': cannot read: " + errnoMessage(errno));
    if (got == 0)
      break;
    // Little endian: the byte value, then zero high bytes (already zero).
    for (ssize_t i = 0; i < got; ++i)
      tokens[static_cast<size_t>(i) * width] = in[static_cast<size_t>(i)];
    PIPER_RETURN_IF_ERROR(
        out.write(tokens.data(), static_cast<size_t>(got) * width));
    numTokens += got;
  }
  return out.commit();
}

} // namespace piper::runtime
