// The safetensors format: header JSON, validation, atomic writing, merging.
#include "runtime/formats/Safetensors.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/formats/Integrity.h"
#include "runtime/formats/Json.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"
#include "support/FileIO.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little endian and written from memory");

namespace piper::runtime {

namespace {

constexpr const char *kMetadataKey = "__metadata__";

/// Bytes of a tensor of `dtype` and `shape`; false on overflow or a
/// negative dimension.
bool tensorByteSize(const std::string &dtype, const std::vector<int64_t> &shape,
                    uint64_t &bytes) {
  uint64_t n = static_cast<uint64_t>(safetensorsDTypeSize(dtype));
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      return false;
  }
  bytes = n;
  return true;
}

/// Whether `s` is valid UTF-8 (JSON strings must be).
bool isUtf8(const std::string &s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::type_error &) {
    return false;
  }
}

/// "a, b, c" with at most `limit` names, then "and N more".
std::string joinNames(const std::vector<std::string> &names,
                      size_t limit = 20) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit)
    out += " and " + std::to_string(names.size() - limit) + " more";
  return out;
}

/// True and sets `out` when `v` is a non-negative integer that fits 64 bits
/// (nlohmann/json stores those, and only those, as number_unsigned).
bool asUint64(const Json &v, uint64_t &out) {
  if (!v.is_number_unsigned())
    return false;
  out = v.get<uint64_t>();
  return true;
}

/// Parses one tensor entry of the header.
Status parseEntry(const std::string &name, const Json &v,
                  SafetensorsEntry &out) {
  std::string where = "tensor " + jsonQuote(name) + ": ";
  if (!v.is_object())
    return Status::error(where + "expected an object, found " +
                         jsonKindName(v));
  out.name = name;
  auto dtype = v.find("dtype");
  auto shape = v.find("shape");
  auto offsets = v.find("data_offsets");
  if (dtype == v.end() || !dtype->is_string())
    return Status::error(where + "missing string \"dtype\"");
  out.dtype = dtype->get<std::string>();
  if (safetensorsDTypeSize(out.dtype) == 0)
    return Status::error(where + "unknown dtype " + jsonQuote(out.dtype));
  if (shape == v.end() || !shape->is_array())
    return Status::error(where + "missing array \"shape\"");
  for (const Json &d : *shape) {
    uint64_t dim;
    if (!asUint64(d, dim) || dim > uint64_t(INT64_MAX))
      return Status::error(where + "\"shape\" must hold non-negative integers");
    out.shape.push_back(static_cast<int64_t>(dim));
  }
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !asUint64((*offsets)[0], out.begin) || !asUint64((*offsets)[1], out.end))
    return Status::error(where + "\"data_offsets\" must be two non-negative "
                                 "integers [begin, end]");
  if (out.end < out.begin)
    return Status::error(where + fmt::format("\"data_offsets\" [{}, {}] end "
                                             "before they begin",
                                             out.begin, out.end));
  uint64_t bytes;
  if (!tensorByteSize(out.dtype, out.shape, bytes))
    return Status::error(where + "shape " + formatShape(out.shape) +
                         " is too large");
  if (out.end - out.begin != bytes)
    return Status::error(
        where + fmt::format("\"data_offsets\" [{}, {}] span {} bytes, but {} "
                            "{} needs {}",
                            out.begin, out.end, out.end - out.begin, out.dtype,
                            formatShape(out.shape), bytes));
  return Status::ok();
}

} // namespace

int safetensorsDTypeSize(const std::string &dtype) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string formatShape(const std::vector<int64_t> &shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string safetensorsHeader(const std::vector<SafetensorsEntry> &tensors,
                              const SafetensorsMetadata &metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json &meta = header[kMetadataKey] = Json::object();
    for (const auto &[key, value] : metadata)
      meta[key] = value;
  }
  for (const SafetensorsEntry &t : tensors)
    header[t.name] = Json{{"dtype", t.dtype},
                          {"shape", t.shape},
                          {"data_offsets", {t.begin, t.end}}};
  // Compact, as the reference implementation writes it. Names are checked
  // to be UTF-8 before they get here (writeSafetensors; a file read back
  // was checked by its parser).
  std::string json =
      header.dump(-1, ' ', false, Json::error_handler_t::replace);
  // Spaces are JSON whitespace; a multiple of 8 keeps the data aligned.
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

Status writeSafetensors(const std::string &path,
                        const std::vector<SafetensorsTensor> &tensors,
                        const SafetensorsMetadata &metadata) {
  std::string where = "checkpoint '" + path + "': ";
  std::vector<SafetensorsEntry> entries;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensor &t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey || !isUtf8(t.name))
      return Status::error(where + "invalid tensor name " + jsonQuote(t.name));
    if (!names.insert(t.name).second)
      return Status::error(where + "tensor '" + t.name + "' appears twice");
    uint64_t bytes;
    if (safetensorsDTypeSize(t.dtype) == 0)
      return Status::error(where + "tensor '" + t.name + "': unknown dtype " +
                           jsonQuote(t.dtype));
    if (!tensorByteSize(t.dtype, t.shape, bytes))
      return Status::error(where + "tensor '" + t.name + "': invalid shape " +
                           formatShape(t.shape));
    if (bytes > 0 && !t.data)
      return Status::error(where + "tensor '" + t.name + "' has no data");
    entries.push_back(
        SafetensorsEntry{t.name, t.dtype, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  std::string header = safetensorsHeader(entries, metadata);
  AtomicFile out;
  PIPER_RETURN_IF_ERROR(out.open(path).withContext("checkpoint"));
  PIPER_RETURN_IF_ERROR(
      out.write(header.data(), header.size()).withContext("checkpoint"));
  for (size_t i = 0; i < tensors.size(); ++i)
    PIPER_RETURN_IF_ERROR(
        out.write(tensors[i].data, entries[i].end - entries[i].begin)
            .withContext("checkpoint"));
  return out.commit().withContext("checkpoint");
}

namespace {

/// The checks of the 8-byte header length `n` of a file of `size` bytes.
Status checkHeaderLength(const std::string &where, uint64_t n, uint64_t size) {
  if (n > kSafetensorsMaxHeaderBytes)
    return Status::error(
        where + fmt::format("the header length {} is over the {}-byte limit "
                            "(not a safetensors file?)",
                            n, kSafetensorsMaxHeaderBytes));
  if (n > size - 8)
    return Status::error(
        where + fmt::format("truncated: the header length is {} bytes but "
                            "only {} bytes follow it",
                            n, size - 8));
  if (n < 2)
    return Status::error(
        where +
        fmt::format("the header length {} is too small for a JSON object", n));
  return Status::ok();
}

Status truncatedLength(const std::string &where, uint64_t size) {
  return Status::error(where + fmt::format("truncated: the file has {} "
                                           "bytes, fewer than the 8-byte "
                                           "header length",
                                           size));
}

uint64_t headerLength(const unsigned char *lenBytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = n << 8 | lenBytes[i];
  return n;
}

/// Parses and validates the header JSON `json` of a file of `size` bytes
/// whose data section starts at `dataStart`.
Status parseHeader(const std::string &where, const std::string &json,
                   uint64_t size, uint64_t dataStart,
                   std::vector<SafetensorsEntry> &entries,
                   SafetensorsMetadata &meta) {
  PIPER_ASSIGN_OR_RETURN(Json root,
                         parseJson(json).withContext(where + "header"));
  if (!root.is_object())
    return Status::error(where + "the header is " +
                         std::string(jsonKindName(root)) +
                         ", not a JSON object");
  uint64_t dataBytes = size - dataStart;
  for (const auto &[name, value] : root.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object())
        return Status::error(where + "\"__metadata__\" is " +
                             std::string(jsonKindName(value)) +
                             ", not an object");
      for (const auto &[key, v] : value.items()) {
        if (!v.is_string())
          return Status::error(where + "\"__metadata__\" value of " +
                               jsonQuote(key) + " is " + jsonKindName(v) +
                               ", not a string");
        meta.emplace_back(key, v.get<std::string>());
      }
      continue;
    }
    SafetensorsEntry e;
    PIPER_RETURN_IF_ERROR(
        parseEntry(name, value, e).withContext(where + "header"));
    if (e.end > dataBytes)
      return Status::error(
          where + fmt::format("tensor '{}': \"data_offsets\" [{}, {}] run "
                              "past the end of the data ({} bytes after the "
                              "header; truncated file?)",
                              name, e.begin, e.end, dataBytes));
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section: sorted by offset, each begins
  // where the previous one ends, and the last one ends at the end of file.
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const SafetensorsEntry &x = entries[a], &y = entries[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t expected = 0;
  const SafetensorsEntry *previous = nullptr;
  for (size_t i : order) {
    const SafetensorsEntry &e = entries[i];
    if (e.begin < expected)
      return Status::error(where + "tensors '" + previous->name + "' and '" +
                           e.name + "' overlap");
    if (e.begin > expected)
      return Status::error(where +
                           fmt::format("a gap of {} bytes before tensor '{}'",
                                       e.begin - expected, e.name));
    expected = e.end;
    previous = &e;
  }
  if (expected != dataBytes)
    return Status::error(where +
                         fmt::format("{} bytes after the last tensor's data",
                                     dataBytes - expected));
  return Status::ok();
}

} // namespace

std::unique_ptr<SafetensorsReader>
SafetensorsReader::open(const std::string &path, Status &status) {
  std::string where = "checkpoint '" + path + "': ";
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->filePath = path;
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  r->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (r->fd < 0) {
    status = Status::error(where + "cannot open: " + errnoMessage(errno));
    return nullptr;
  }
  struct stat st;
  if (::fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = Status::error(where + "is not a regular file");
    return nullptr;
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    status = truncatedLength(where, size);
    return nullptr;
  }
  unsigned char lenBytes[8];
  if (!preadAll(r->fd, lenBytes, 8, 0)) {
    status = Status::error(where + "cannot read: " + errnoMessage(errno));
    return nullptr;
  }
  uint64_t n = headerLength(lenBytes);
  status = checkHeaderLength(where, n, size);
  if (!status)
    return nullptr;
  std::string json(static_cast<size_t>(n), '\0');
  if (!preadAll(r->fd, json.data(), json.size(), 8)) {
    status =
        Status::error(where + "cannot read the header: " + errnoMessage(errno));
    return nullptr;
  }
  r->dataStart = 8 + n;
  r->size = size;
  r->headerCrc =
      crc32Update(crc32Update(0, lenBytes, 8), json.data(), json.size());
  status = parseHeader(where, json, size, r->dataStart, r->entries, r->meta);
  if (!status)
    return nullptr;
  return r;
}

Status parseSafetensors(const std::string &path, std::string_view bytes,
                        std::vector<SafetensorsEntry> &entries,
                        SafetensorsMetadata &metadata) {
  std::string where = "checkpoint '" + path + "': ";
  entries.clear();
  metadata.clear();
  uint64_t size = bytes.size();
  if (size < 8)
    return truncatedLength(where, size);
  uint64_t n =
      headerLength(reinterpret_cast<const unsigned char *>(bytes.data()));
  PIPER_RETURN_IF_ERROR(checkHeaderLength(where, n, size));
  std::string json(bytes.substr(8, static_cast<size_t>(n)));
  return parseHeader(where, json, size, 8 + n, entries, metadata);
}

SafetensorsReader::~SafetensorsReader() {
  if (fd >= 0)
    ::close(fd);
}

const std::string *
SafetensorsReader::metadataValue(const std::string &key) const {
  for (const auto &[k, v] : meta)
    if (k == key)
      return &v;
  return nullptr;
}

const SafetensorsEntry *SafetensorsReader::find(const std::string &name) const {
  for (const SafetensorsEntry &e : entries)
    if (e.name == name)
      return &e;
  return nullptr;
}

Status SafetensorsReader::read(const SafetensorsEntry &entry, void *out) const {
  return readRange(entry, 0, static_cast<size_t>(entry.end - entry.begin), out);
}

Status SafetensorsReader::readRange(const SafetensorsEntry &entry,
                                    uint64_t offset, size_t n,
                                    void *out) const {
  if (offset > entry.end - entry.begin || n > entry.end - entry.begin - offset)
    return Status::error(fmt::format("checkpoint '{}': internal: bytes [{}, "
                                     "{}) are outside tensor '{}'",
                                     filePath, offset, offset + n, entry.name));
  errno = 0;
  if (!preadAll(fd, out, n, dataStart + entry.begin + offset))
    return Status::error("checkpoint '" + filePath + "': cannot read tensor '" +
                         entry.name + "': " +
                         (errno ? errnoMessage(errno)
                                : std::string("the file is shorter than its "
                                              "header says")));
  return Status::ok();
}

Status mergeSafetensors(const std::vector<std::string> &parts,
                        const std::string &path,
                        const SafetensorsMetadata &metadata) {
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  for (const std::string &part : parts) {
    Status st;
    readers.push_back(SafetensorsReader::open(part, st));
    if (!readers.back())
      return st;
  }
  struct Source {
    const SafetensorsReader *reader;
    const SafetensorsEntry *entry;
  };
  std::vector<Source> sources;
  std::map<std::string, size_t> byName;
  std::vector<char> a, b;
  // Each part's bytes must still match the CRC-32s it records; the merged
  // file records them when every part does.
  bool checksummed = true;
  std::vector<std::pair<std::string, uint32_t>> crcs;
  for (const auto &reader : readers) {
    std::map<std::string, uint32_t> recorded;
    bool present = false;
    PIPER_RETURN_IF_ERROR(recordedCrcs(*reader, recorded, present));
    checksummed = checksummed && present;
    for (const SafetensorsEntry &e : reader->tensors()) {
      if (present) {
        TensorScan scan;
        PIPER_RETURN_IF_ERROR(scanTensor(*reader, e, scan));
        if (scan.crc != recorded[e.name])
          return crcMismatch(reader->path(), e.name, "its metadata",
                             recorded[e.name], scan.crc);
      }
      auto it = byName.find(e.name);
      if (it == byName.end()) {
        byName[e.name] = sources.size();
        sources.push_back(Source{reader.get(), &e});
        crcs.emplace_back(e.name, recorded[e.name]);
        continue;
      }
      // Held twice (a tied or replicated parameter): keep one copy, but only
      // if the copies agree.
      const Source &first = sources[it->second];
      std::string both = "parameter '" + e.name + "' is in '" +
                         first.reader->path() + "' and in '" + reader->path() +
                         "'";
      if (first.entry->dtype != e.dtype || first.entry->shape != e.shape)
        return Status::error(both + " with different types (" +
                             first.entry->dtype + " " +
                             formatShape(first.entry->shape) + " and " +
                             e.dtype + " " + formatShape(e.shape) + ")");
      a.resize(static_cast<size_t>(e.end - e.begin));
      b.resize(a.size());
      PIPER_RETURN_IF_ERROR(first.reader->read(*first.entry, a.data()));
      PIPER_RETURN_IF_ERROR(reader->read(e, b.data()));
      if (a != b)
        return Status::error(both + " with different values");
    }
  }
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const Source &s : sources) {
    SafetensorsEntry e = *s.entry;
    uint64_t bytes = e.end - e.begin;
    e.begin = offset;
    e.end = offset + bytes;
    offset += bytes;
    entries.push_back(std::move(e));
  }
  SafetensorsMetadata merged = metadata;
  if (checksummed && !readers.empty())
    merged.emplace_back(kCrc32Key, crc32Json(crcs));
  std::string header = safetensorsHeader(entries, merged);
  AtomicFile out;
  PIPER_RETURN_IF_ERROR(out.open(path).withContext("checkpoint"));
  PIPER_RETURN_IF_ERROR(
      out.write(header.data(), header.size()).withContext("checkpoint"));
  for (const Source &s : sources) {
    a.resize(static_cast<size_t>(s.entry->end - s.entry->begin));
    PIPER_RETURN_IF_ERROR(s.reader->read(*s.entry, a.data()));
    PIPER_RETURN_IF_ERROR(
        out.write(a.data(), a.size()).withContext("checkpoint"));
  }
  return out.commit().withContext("checkpoint");
}

Status checkCheckpointParams(const SafetensorsReader &reader,
                             const std::vector<ParamSpec> &params,
                             bool rejectExtra) {
  std::vector<std::string> missing, problems, extra;
  std::set<std::string> wanted;
  for (const ParamSpec &p : params) {
    wanted.insert(p.name);
    const SafetensorsEntry *e = reader.find(p.name);
    if (!e) {
      missing.push_back(p.name);
      continue;
    }
    if (e->dtype != "F32")
      problems.push_back("tensor '" + p.name + "' is " + e->dtype +
                         ", but piper loads F32 only");
    else if (e->shape != p.shape)
      problems.push_back(
          "tensor '" + p.name + "' has shape " + formatShape(e->shape) +
          ", but the model's parameter has " + formatShape(p.shape));
  }
  if (rejectExtra)
    for (const SafetensorsEntry &e : reader.tensors())
      if (!wanted.count(e.name))
        extra.push_back(e.name);
  if (missing.empty() && problems.empty() && extra.empty())
    return Status::ok();
  std::string msg =
      "checkpoint '" + reader.path() + "' does not match the model: ";
  std::vector<std::string> parts;
  if (!missing.empty())
    parts.push_back("missing parameters: " + joinNames(missing));
  for (const std::string &p : problems)
    parts.push_back(p);
  if (!extra.empty())
    parts.push_back("tensors that are not parameters of the model: " +
                    joinNames(extra));
  for (size_t i = 0; i < parts.size(); ++i)
    msg += (i ? "; " : "") + parts[i];
  return Status::error(msg);
}

SafetensorsMetadata checkpointMetadata(int64_t step) {
  return {
      {"format", "pt"}, {"producer", "piper"}, {"step", std::to_string(step)}};
}

Status checkpointStep(const SafetensorsReader &reader, int64_t &step) {
  step = 0;
  const std::string *text = reader.metadataValue("step");
  if (!text)
    return Status::ok();
  uint64_t v = 0;
  const char *end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, v);
  if (text->empty() || ec != std::errc() || ptr != end ||
      v > uint64_t(INT64_MAX))
    return Status::error("checkpoint '" + reader.path() +
                         "': metadata \"step\" is " + jsonQuote(*text) +
                         ", not a non-negative integer");
  step = static_cast<int64_t>(v);
  return Status::ok();
}

} // namespace piper::runtime
