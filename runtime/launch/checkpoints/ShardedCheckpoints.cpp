// Sharded checkpoints (docs/operations.md §6): under ZeRO or expert
// parallelism each rank writes the slices of the parameters and AdamW
// moments it alone holds to its own file, and a resumed run, under any
// strategy, reads the ranges it needs from all of them.
#include "runtime/launch/checkpoints/ShardedCheckpoints.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/formats/Json.h"

namespace piper::runtime {

std::string shardFileName(int rank) {
  return fmt::format("rank-{}.safetensors", rank);
}

namespace {

/// A non-negative integer of a piper.slices entry, or false.
bool count(const Json &v, int64_t &out) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(INT64_MAX))
    return false;
  out = static_cast<int64_t>(v.get<uint64_t>());
  return true;
}

bool counts(const Json &v, std::vector<int64_t> &out) {
  if (!v.is_array())
    return false;
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t n = 0;
    if (!count(v[i], n))
      return false;
    out.push_back(n);
  }
  return true;
}

/// The piper.slices entry of tensor `name`: [start, global shape...], a
/// flat range, or {"global": [...], "dim", "members", "member", "parts":
/// [...]}, a tensor-parallel slice (plan.proto TensorSlice), with "start"
/// when the entry is a ZeRO range of that slice (the elements from flat
/// element `start` of the member's tensor). Gives the global shape and the
/// runs the entry's elements fill.
Status sliceOf(const std::string &path, const Json &slices,
               const SafetensorsEntry &e, std::vector<int64_t> &shape,
               std::vector<plan::SliceRun> &runs) {
  auto it = slices.find(e.name);
  if (it == slices.end() || e.dtype != "F32" || e.shape.size() != 1 ||
      !(it->is_array() || it->is_object()))
    return Status::error(fmt::format(
        "'{}': tensor '{}' is not a 1-D F32 slice described in piper.slices",
        path, e.name));
  auto bad = [&] {
    return Status::error(
        fmt::format("'{}': bad slice of '{}' in piper.slices: {}", path, e.name,
                    it->dump()));
  };
  std::vector<int64_t> values;
  if (it->is_array()) {
    if (!counts(*it, values) || values.empty())
      return bad();
    shape.assign(values.begin() + 1, values.end());
    runs = {plan::SliceRun{values[0], 0, e.shape[0]}};
    return Status::ok();
  }
  int64_t dim = 0, members = 0, member = 0;
  std::vector<int64_t> parts;
  if (!it->contains("global") || !counts((*it)["global"], shape) ||
      !it->contains("dim") || !count((*it)["dim"], dim) ||
      !it->contains("members") || !count((*it)["members"], members) ||
      !it->contains("member") || !count((*it)["member"], member) ||
      !it->contains("parts") || !counts((*it)["parts"], parts) ||
      dim >= static_cast<int64_t>(shape.size()) || members < 2 ||
      member >= members || shape[dim] % members != 0)
    return bad();
  // The member's slice as a plan parameter: its runs.
  plan::Parameter p;
  p.set_name(e.name);
  for (size_t d = 0; d < shape.size(); ++d)
    p.mutable_type()->add_shape(
        static_cast<int64_t>(d) == dim ? shape[d] / members : shape[d]);
  p.mutable_tensor_slice()->set_dim(static_cast<int32_t>(dim));
  p.mutable_tensor_slice()->set_members(static_cast<int32_t>(members));
  int64_t sum = 0;
  for (int64_t part : parts) {
    if (part == 0 || part % members != 0)
      return bad();
    sum += part;
    p.mutable_tensor_slice()->add_parts(part);
  }
  int64_t start = 0;
  bool ranged = it->contains("start");
  if (ranged && !count((*it)["start"], start))
    return bad();
  if ((!parts.empty() && sum != shape[dim]) ||
      (ranged ? start + e.shape[0] > plan::paramElements(p)
              : plan::paramElements(p) != e.shape[0]))
    return bad();
  runs = plan::rangeRuns(p, member, start, e.shape[0]);
  return Status::ok();
}

} // namespace

Status ShardIndex::open(std::vector<std::unique_ptr<SafetensorsReader>> files) {
  for (auto &reader : files) {
    const std::string &path = reader->path();
    const std::string *text = reader->metadataValue("piper.slices");
    StatusOr<Json> parsed =
        text ? parseJson(*text) : StatusOr<Json>(Status::error("absent"));
    if (!parsed || !parsed->is_object())
      return Status::error(
          fmt::format("'{}' has no valid piper.slices metadata", path));
    const Json &slices = *parsed;
    for (const SafetensorsEntry &e : reader->tensors()) {
      std::vector<int64_t> shape;
      Piece piece{static_cast<int>(readers.size()), &e, {}};
      PIPER_RETURN_IF_ERROR(sliceOf(path, slices, e, shape, piece.runs));
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
      for (const plan::SliceRun &r : p.runs)
        ranges.emplace_back(r.global, r.global + r.count);
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
    return Status::error("the sharded checkpoint does not hold '" + name + "'");
  // Every element of [start, start + count) from a piece that holds it.
  std::vector<char> filled(static_cast<size_t>(count), 0);
  std::vector<float> buf;
  for (const Piece &p : it->second.pieces) {
    bool loaded = false;
    for (const plan::SliceRun &r : p.runs) {
      int64_t a = std::max(start, r.global),
              b = std::min(start + count, r.global + r.count);
      if (a >= b)
        continue;
      if (!loaded) {
        buf.resize(static_cast<size_t>(p.entry->shape[0]));
        PIPER_RETURN_IF_ERROR(readers[p.reader]->read(*p.entry, buf.data()));
        loaded = true;
      }
      int64_t at = r.local + (a - r.global);
      std::copy(buf.begin() + at, buf.begin() + at + (b - a),
                out + (a - start));
      std::fill(filled.begin() + (a - start), filled.begin() + (b - start), 1);
    }
  }
  if (std::find(filled.begin(), filled.end(), 0) != filled.end())
    return Status::error(fmt::format(
        "the sharded checkpoint does not hold all of elements [{}, {}) of "
        "'{}'",
        start, start + count, name));
  return Status::ok();
}

} // namespace piper::runtime
