#include "support/ByteSize.h"

#include <cstdlib>
#include <utility>

namespace piper {

StatusOr<int64_t> parseByteSize(const std::string &text) {
  auto invalid = [&] {
    return Status::error("'" + text +
                         "': expected a size such as 80GiB, 512MiB, 16GB or a "
                         "number of bytes");
  };
  const char *blanks = " \t";
  size_t begin = text.find_first_not_of(blanks);
  if (begin == std::string::npos)
    return invalid();
  std::string t = text.substr(begin, text.find_last_not_of(blanks) + 1 - begin);
  // Keep an exponent's 'e' but not a unit letter after it.
  size_t digits = t.find_first_not_of("0123456789.eE+");
  std::string number = t.substr(0, digits);
  std::string unit = digits == std::string::npos ? "" : t.substr(digits);
  unit.erase(0, std::min(unit.size(), unit.find_first_not_of(blanks)));
  if (number.empty())
    return invalid();
  char *end = nullptr;
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !(value >= 0))
    return invalid();
  static const std::pair<const char *, double> units[] = {
      {"", 1.0},
      {"B", 1.0},
      {"KiB", 1024.0},
      {"MiB", 1048576.0},
      {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12}};
  for (auto [name, scale] : units)
    if (unit == name) {
      double bytes = value * scale;
      if (!(bytes < 9.2e18))
        return invalid();
      return static_cast<int64_t>(bytes);
    }
  return invalid();
}

} // namespace piper
