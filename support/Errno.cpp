#include "support/Errno.h"

#include <cstring>

namespace piper {

std::string errnoMessage(int err) {
  std::string s = std::strerror(err);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z')
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

} // namespace piper
