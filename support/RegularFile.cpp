#include "support/RegularFile.h"

#include <cerrno>

#include <sys/stat.h>

#include "support/Errno.h"

namespace piper {

std::string regularFileProblem(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return "cannot open: " + errnoMessage(errno);
  if (S_ISDIR(st.st_mode))
    return "is a directory";
  if (!S_ISREG(st.st_mode))
    return "is not a regular file";
  return "";
}

} // namespace piper
