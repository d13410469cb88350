// Sharded checkpoints (docs/operations.md §6): under ZeRO or expert
// parallelism each rank writes the slices of the parameters and AdamW
// moments it alone holds to its own file, and a resumed run, under any
// strategy, reads the ranges it needs from all of them.
#include "runtime/launch/ShardedCheckpoints.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace piper::runtime {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string shardFileName(int rank) {
  return fmt::format("rank-{}.safetensors", rank);
}

Status ShardIndex::open(const std::string &dir,
                        const std::vector<std::string> &files,
                        int64_t step) {
  for (const std::string &name : files) {
    std::string path = dir + "/" + name;
    Status st;
    auto reader = SafetensorsReader::open(path, st);
    if (!reader)
      return st;
    int64_t fileStep = 0;
    PIPER_RETURN_IF_ERROR(checkpointStep(*reader, fileStep));
    if (fileStep != step)
      return Status::error(
          fmt::format("'{}' holds step {}, not {}", path, fileStep, step));
    const std::string *text = reader->metadataValue("piper.slices");
    Json slices = text ? Json::parse(*text, nullptr, false) : Json();
    if (!slices.is_object())
      return Status::error(
          fmt::format("'{}' has no valid piper.slices metadata", path));
    for (const SafetensorsEntry &e : reader->tensors()) {
      const Json &s = slices.contains(e.name) ? slices[e.name] : Json();
      if (!s.is_array() || s.size() < 1 || e.dtype != "F32" ||
          e.shape.size() != 1)
        return Status::error(fmt::format(
            "'{}': tensor '{}' is not a 1-D F32 slice described in "
            "piper.slices",
            path, e.name));
      Piece piece{static_cast<int>(readers.size()), &e, 0, e.shape[0]};
      std::vector<int64_t> shape;
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_number_integer() || s[i].get<int64_t>() < 0)
          return Status::error(fmt::format(
              "'{}': bad slice of '{}' in piper.slices", path, e.name));
        if (i == 0)
          piece.start = s[i].get<int64_t>();
        else
          shape.push_back(s[i].get<int64_t>());
      }
      Tensor &t = tensors[e.name];
      if (!t.pieces.empty() && t.shape != shape)
        return Status::error(fmt::format(
            "'{}': tensor '{}' has two global shapes", path, e.name));
      t.shape = shape;
      t.pieces.push_back(piece);
    }
    readers.push_back(std::move(reader));
  }
  return Status::ok();
}

Status ShardIndex::check(const std::vector<ParamSpec> &params) const {
  auto covers = [&](const std::string &name,
                    const std::vector<int64_t> &shape) -> Status {
    auto it = tensors.find(name);
    if (it == tensors.end())
      return Status::error(fmt::format("it does not hold '{}'", name));
    if (it->second.shape != shape)
      return Status::error(fmt::format(
          "'{}' has another shape than this strategy's parameter", name));
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const Piece &p : it->second.pieces)
      ranges.emplace_back(p.start, p.start + p.count);
    std::sort(ranges.begin(), ranges.end());
    int64_t covered = 0;
    for (auto [a, b] : ranges) {
      if (a > covered)
        break;
      covered = std::max(covered, b);
    }
    if (covered < n)
      return Status::error(fmt::format(
          "its slices of '{}' stop at element {} of {}", name, covered, n));
    return Status::ok();
  };
  for (const ParamSpec &p : params)
    for (const char *suffix : {"", ".exp_avg", ".exp_avg_sq"})
      PIPER_RETURN_IF_ERROR(covers(p.name + suffix, p.shape));
  return Status::ok();
}

Status ShardIndex::read(const std::string &name, int64_t start, int64_t count,
                        float *out) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    return Status::error("the sharded checkpoint does not hold '" + name +
                         "'");
  // Every element of [start, start + count) from a piece that holds it.
  std::vector<char> filled(static_cast<size_t>(count), 0);
  std::vector<float> buf;
  for (const Piece &p : it->second.pieces) {
    int64_t a = std::max(start, p.start),
            b = std::min(start + count, p.start + p.count);
    if (a >= b)
      continue;
    buf.resize(static_cast<size_t>(p.count));
    PIPER_RETURN_IF_ERROR(readers[p.reader]->read(*p.entry, buf.data()));
    std::copy(buf.begin() + (a - p.start), buf.begin() + (b - p.start),
              out + (a - start));
    std::fill(filled.begin() + (a - start), filled.begin() + (b - start), 1);
  }
  if (std::find(filled.begin(), filled.end(), 0) != filled.end())
    return Status::error(fmt::format(
        "the sharded checkpoint does not hold all of elements [{}, {}) of "
        "'{}'",
        start, start + count, name));
  return Status::ok();
}

} // namespace piper::runtime
