// Sharded checkpoints (docs/operations.md §6): under ZeRO or expert
// parallelism each rank writes the slices of the parameters and AdamW
// moments it alone holds to its own file, and a resumed run, under any
// strategy, reads the ranges it needs from all of them.
#include "runtime/launch/checkpoints/ShardedCheckpoints.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/checkpoint/Json.h"

namespace piper::runtime {

std::string shardFileName(int rank) {
  return fmt::format("rank-{}.safetensors", rank);
}

namespace {

/// The piper.slices entry of tensor `name`: [start, global shape...], all
/// non-negative integers.
Status sliceOf(const std::string &path, const Json &slices,
               const SafetensorsEntry &e, int64_t &start,
               std::vector<int64_t> &shape) {
  auto it = slices.find(e.name);
  if (it == slices.end() || !it->is_array() || it->empty() ||
      e.dtype != "F32" || e.shape.size() != 1)
    return Status::error(fmt::format(
        "'{}': tensor '{}' is not a 1-D F32 slice described in piper.slices",
        path, e.name));
  shape.clear();
  for (size_t i = 0; i < it->size(); ++i) {
    const Json &v = (*it)[i];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(INT64_MAX))
      return Status::error(
          fmt::format("'{}': bad slice of '{}' in piper.slices: {}", path,
                      e.name, it->dump()));
    int64_t n = static_cast<int64_t>(v.get<uint64_t>());
    if (i == 0)
      start = n;
    else
      shape.push_back(n);
  }
  return Status::ok();
}

} // namespace

Status ShardIndex::open(std::vector<std::unique_ptr<SafetensorsReader>> files) {
  for (auto &reader : files) {
    const std::string &path = reader->path();
    const std::string *text = reader->metadataValue("piper.slices");
    Json slices;
    if (!text || !parseJson(*text, slices) || !slices.is_object())
      return Status::error(
          fmt::format("'{}' has no valid piper.slices metadata", path));
    for (const SafetensorsEntry &e : reader->tensors()) {
      int64_t start = 0;
      std::vector<int64_t> shape;
      PIPER_RETURN_IF_ERROR(sliceOf(path, slices, e, start, shape));
      Piece piece{static_cast<int>(readers.size()), &e, start, e.shape[0]};
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
