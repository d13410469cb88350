// Per-tensor CRC-32s and run ids in safetensors metadata, and the scan that
// checks a file's bytes against them and for non-finite values.
#include "runtime/formats/Integrity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <zlib.h>

#include "runtime/formats/Json.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensor bytes are little endian and read into memory");

namespace piper::runtime {

namespace {

/// Bytes read at a time when scanning a tensor (a multiple of 8).
constexpr size_t kScanChunk = size_t(4) << 20;

/// "nan", "inf" or "-inf".
std::string nonFiniteText(double v) {
  if (std::isnan(v))
    return "nan";
  return v < 0 ? "-inf" : "inf";
}

/// The first non-finite element of `n` elements of `dtype` at `data`, or
/// -1; its value in `value`.
int64_t firstNonFinite(const std::string &dtype, const char *data, size_t n,
                       double &value) {
  if (dtype == "F32") {
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      if (!std::isfinite(f)) {
        value = f;
        return static_cast<int64_t>(i);
      }
    }
  } else if (dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, data + 8 * i, 8);
      if (!std::isfinite(d)) {
        value = d;
        return static_cast<int64_t>(i);
      }
    }
  } else if (dtype == "F16" || dtype == "BF16") {
    // All exponent bits set: an infinity (zero mantissa) or a NaN.
    const uint16_t exponent = dtype == "F16" ? 0x7C00 : 0x7F80;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      if ((h & exponent) == exponent) {
        bool nan = (h & ~exponent & 0x7FFF) != 0;
        value = nan ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
        return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

} // namespace

uint32_t crc32Update(uint32_t crc, const void *data, size_t size) {
  return static_cast<uint32_t>(
      ::crc32_z(crc, static_cast<const Bytef *>(data), size));
}

std::string formatCrc32(uint32_t crc) { return fmt::format("{:08x}", crc); }

bool parseCrc32(const std::string &text, uint32_t &crc) {
  if (text.size() != 8)
    return false;
  uint32_t v = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return false;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  crc = v;
  return true;
}

std::string newRunId() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i)
    id += fmt::format("{:08x}", static_cast<uint32_t>(device()));
  return id;
}

bool isRunId(const std::string &id) {
  return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

SafetensorsMetadata checkpointMetadata(int64_t step, const std::string &runId) {
  SafetensorsMetadata meta = checkpointMetadata(step);
  if (!runId.empty())
    meta.emplace_back(kRunIdKey, runId);
  return meta;
}

std::string
crc32Json(const std::vector<std::pair<std::string, uint32_t>> &crcs) {
  Json object = Json::object();
  for (const auto &[name, crc] : crcs)
    object[name] = formatCrc32(crc);
  return object.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void addCrc32s(SafetensorsMetadata &metadata,
               const std::vector<SafetensorsTensor> &tensors) {
  std::vector<std::pair<std::string, uint32_t>> crcs;
  for (const SafetensorsTensor &t : tensors) {
    uint64_t n = static_cast<uint64_t>(safetensorsDTypeSize(t.dtype));
    for (int64_t d : t.shape)
      n *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    crcs.emplace_back(t.name, n && t.data ? crc32Update(0, t.data, n) : 0);
  }
  metadata.emplace_back(kCrc32Key, crc32Json(crcs));
}

Status recordedCrcs(const SafetensorsReader &reader,
                    std::map<std::string, uint32_t> &out, bool &present) {
  out.clear();
  const std::string *text = reader.metadataValue(kCrc32Key);
  present = text != nullptr;
  if (!text)
    return Status::ok();
  const std::string where =
      fmt::format("checkpoint '{}': metadata \"{}\"", reader.path(), kCrc32Key);
  PIPER_ASSIGN_OR_RETURN(Json crcs, parseJson(*text).withContext(where));
  if (!crcs.is_object())
    return Status::error(
        fmt::format("{} is {}, expected an object", where, jsonKindName(crcs)));
  for (const auto &[name, value] : crcs.items()) {
    uint32_t crc = 0;
    if (!value.is_string() ||
        !parseCrc32(value.get_ref<const std::string &>(), crc))
      return Status::error(fmt::format("{}: the CRC-32 of {} is {}, expected "
                                       "8 hex digits",
                                       where, jsonQuote(name), value.dump()));
    if (!reader.find(name))
      return Status::error(
          fmt::format("{} names tensor {}, which the file does not hold", where,
                      jsonQuote(name)));
    out[name] = crc;
  }
  for (const SafetensorsEntry &e : reader.tensors())
    if (!out.count(e.name))
      return Status::error(fmt::format("{} has no CRC-32 of tensor {}", where,
                                       jsonQuote(e.name)));
  return Status::ok();
}

Status recordedRunId(const SafetensorsReader &reader, std::string &runId) {
  runId.clear();
  const std::string *text = reader.metadataValue(kRunIdKey);
  if (!text)
    return Status::ok();
  if (!isRunId(*text))
    return Status::error(fmt::format(
        "checkpoint '{}': metadata \"{}\" is {}, expected 32 lowercase hex "
        "digits",
        reader.path(), kRunIdKey, jsonQuote(*text)));
  runId = *text;
  return Status::ok();
}

Status scanTensor(const SafetensorsReader &reader,
                  const SafetensorsEntry &entry, TensorScan &out) {
  out = TensorScan();
  const uint64_t bytes = entry.end - entry.begin;
  const size_t elementSize =
      static_cast<size_t>(std::max(1, safetensorsDTypeSize(entry.dtype)));
  std::vector<char> chunk(
      static_cast<size_t>(std::min<uint64_t>(bytes, kScanChunk)));
  for (uint64_t offset = 0; offset < bytes; offset += chunk.size()) {
    size_t n =
        static_cast<size_t>(std::min<uint64_t>(chunk.size(), bytes - offset));
    PIPER_RETURN_IF_ERROR(reader.readRange(entry, offset, n, chunk.data()));
    out.crc = crc32Update(out.crc, chunk.data(), n);
    if (out.nonFinite >= 0)
      continue;
    double value = 0;
    int64_t i =
        firstNonFinite(entry.dtype, chunk.data(), n / elementSize, value);
    if (i >= 0) {
      out.nonFinite = static_cast<int64_t>(offset / elementSize) + i;
      out.nonFiniteValue = nonFiniteText(value);
    }
  }
  return Status::ok();
}

Status crcMismatch(const std::string &path, const std::string &name,
                   const std::string &where, uint32_t recorded, uint32_t read) {
  return Status::error(fmt::format(
      "checkpoint '{}': tensor '{}' does not match its CRC-32 in {} "
      "(recorded {}, read {}): the file was corrupted or replaced",
      path, name, where, formatCrc32(recorded), formatCrc32(read)));
}

Status verifyTensors(const SafetensorsReader &reader,
                     const std::map<std::string, uint32_t> *expected,
                     const std::string &expectedWhere, bool finite) {
  std::map<std::string, uint32_t> own;
  bool present = false;
  PIPER_RETURN_IF_ERROR(recordedCrcs(reader, own, present));
  // Both records when both exist: a tensor changed together with its CRC-32
  // in state.json (or in the file) still disagrees with the other.
  std::vector<std::pair<const std::map<std::string, uint32_t> *, std::string>>
      records;
  if (expected)
    records.emplace_back(expected, expectedWhere);
  if (present)
    records.emplace_back(&own, "its metadata");
  for (const SafetensorsEntry &e : reader.tensors()) {
    TensorScan scan;
    PIPER_RETURN_IF_ERROR(scanTensor(reader, e, scan));
    for (const auto &[crcs, where] : records) {
      auto it = crcs->find(e.name);
      if (it == crcs->end())
        return Status::error(
            fmt::format("checkpoint '{}': tensor '{}' has no CRC-32 in {}",
                        reader.path(), e.name, where));
      if (it->second != scan.crc)
        return crcMismatch(reader.path(), e.name, where, it->second, scan.crc);
    }
    if (finite && scan.nonFinite >= 0)
      return Status::error(fmt::format(
          "checkpoint '{}': tensor '{}' holds a non-finite value ({} at "
          "element {}); piper does not start from it",
          reader.path(), e.name, scan.nonFiniteValue, scan.nonFinite));
  }
  return Status::ok();
}

} // namespace piper::runtime
