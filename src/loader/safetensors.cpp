#include "loader/safetensors.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "common/check.h"
#include "common/json_depth.h"

namespace oasis {
namespace {

using json = nlohmann::json;

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Parses `text` as JSON; sets `duplicate_key` to the first top-level key seen twice (the
// JSON library would silently keep the last one). Returns a discarded value on error.
json ParseTopLevel(const char* begin, const char* end, std::string* duplicate_key) {
  std::unordered_set<std::string> keys;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate_key->empty()) *duplicate_key = key;
    }
    return true;
  };
  return json::parse(begin, end, callback, /*allow_exceptions=*/false);
}

// Validates one tensor entry. `data_size` is the size of the data section.
Status ParseEntry(const std::string& source, const std::string& name, const json& value,
                  uint64_t data_size, SafetensorsEntry* out) {
  const std::string where = source + ": tensor '" + name + "': ";
  if (!value.is_object()) return InvalidArgument(where + "entry is not a JSON object");
  out->name = name;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    return InvalidArgument(where + "missing or non-string \"dtype\"");
  }
  const auto& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = DTypeFromName(dtype_name);
  if (!dtype) return InvalidArgument(where + "unknown dtype \"" + dtype_name + "\"");
  out->dtype = *dtype;

  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    return InvalidArgument(where + "missing or non-array \"shape\"");
  }
  uint64_t numel = 1;
  bool overflow = false;
  out->shape.clear();
  out->shape.reserve(shape_it->size());
  for (const json& d : *shape_it) {
    if (!d.is_number_integer()) return InvalidArgument(where + "shape has a non-integer dimension");
    if (!d.is_number_unsigned()) {
      return InvalidArgument(where + "shape has a negative dimension " + d.dump());
    }
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument(where + "shape dimension " + std::to_string(dim) + " is too large");
    }
    out->shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(out->dtype)), &nbytes)) {
    return InvalidArgument(where + "shape " + ShapeText(out->shape) + " overflows 64-bit sizes");
  }

  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return InvalidArgument(where +
                           "\"data_offsets\" must be [begin, end] of non-negative integers");
  }
  out->begin = (*offsets_it)[0].get<uint64_t>();
  out->end = (*offsets_it)[1].get<uint64_t>();
  const std::string range =
      "[" + std::to_string(out->begin) + ", " + std::to_string(out->end) + "]";
  if (out->begin > out->end)
    return InvalidArgument(where + "data_offsets " + range + " has begin > end");
  if (out->end > data_size) {
    return DataLoss(where + "data_offsets " + range + " lie outside the data section of " +
                    std::to_string(data_size) + " bytes (file truncated?)");
  }
  if (nbytes != out->end - out->begin) {
    return InvalidArgument(where + "shape " + ShapeText(out->shape) + " of " +
                           std::string(DTypeName(out->dtype)) + " needs " + std::to_string(nbytes) +
                           " bytes but data_offsets " + range + " span " +
                           std::to_string(out->end - out->begin));
  }
  return Status::Ok();
}

Status ParseMetadata(const std::string& source, const json& value,
                     std::map<std::string, std::string>* out) {
  if (!value.is_object())
    return InvalidArgument(source + ": \"__metadata__\" is not a JSON object");
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return InvalidArgument(source + ": \"__metadata__\" value of '" + key + "' is not a string");
    }
    (*out)[key] = v.get<std::string>();
  }
  return Status::Ok();
}

Status CheckNoOverlap(const std::string& source, const std::vector<SafetensorsEntry>& tensors) {
  std::vector<size_t> order;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].nbytes() > 0) order.push_back(i);  // empty tensors hold no bytes
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].begin != tensors[b].begin ? tensors[a].begin < tensors[b].begin
                                                : tensors[a].end < tensors[b].end;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const SafetensorsEntry& prev = tensors[order[k - 1]];
    const SafetensorsEntry& cur = tensors[order[k]];
    if (cur.begin < prev.end) {
      return InvalidArgument(source + ": tensors '" + prev.name + "' and '" + cur.name +
                             "' overlap in the data section");
    }
  }
  return Status::Ok();
}

StatusOr<SafetensorsHeader> ParseImpl(const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8) {
    return DataLoss(source + ": file is " + std::to_string(size) +
                    " bytes, too short for the 8-byte header length");
  }
  SafetensorsHeader header;
  header.header_size = ReadLe64(data);
  if (header.header_size > size - 8) {
    return DataLoss(source + ": header length " + std::to_string(header.header_size) +
                    " extends past the end of the file (" + std::to_string(size) + " bytes)");
  }
  if (header.header_size > kMaxSafetensorsHeaderBytes) {
    return DataLoss(source + ": header length " + std::to_string(header.header_size) +
                    " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                    " bytes");
  }
  header.data_offset = 8 + header.header_size;
  header.data_size = size - header.data_offset;

  const char* text = reinterpret_cast<const char*>(data + 8);
  std::string duplicate;
  if (JsonNestedDeeperThan(std::string_view(text, header.header_size))) {
    return DataLoss(source + ": header nests JSON deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels");
  }
  json root = ParseTopLevel(text, text + header.header_size, &duplicate);
  if (root.is_discarded()) return DataLoss(source + ": header is not valid JSON");
  if (!root.is_object()) return DataLoss(source + ": header is not a JSON object");
  if (!duplicate.empty()) {
    return InvalidArgument(source + ": tensor '" + duplicate + "' appears twice in the header");
  }

  header.tensors.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      OASIS_RETURN_IF_ERROR(ParseMetadata(source, value, &header.metadata));
      continue;
    }
    SafetensorsEntry entry;
    OASIS_RETURN_IF_ERROR(ParseEntry(source, key, value, header.data_size, &entry));
    header.tensors.push_back(std::move(entry));
  }
  OASIS_RETURN_IF_ERROR(CheckNoOverlap(source, header.tensors));
  for (size_t i = 0; i < header.tensors.size(); ++i)
    header.by_name.emplace(header.tensors[i].name, i);
  return header;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow
  return n;
}

const SafetensorsEntry* SafetensorsHeader::Find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                   std::string source) {
  if (data == nullptr && size != 0) return InvalidArgument(source + ": null buffer");
  try {
    return ParseImpl(data, size, source);
  } catch (const nlohmann::json::exception& e) {
    // Defensive: the checks above avoid throwing accessors, but a JSON library exception
    // must never escape as a crash.
    return DataLoss(source + ": malformed header: " + e.what());
  }
}

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  OASIS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  OASIS_ASSIGN_OR_RETURN(SafetensorsHeader header,
                         ParseSafetensorsHeader(file.data(), file.size(), path.string()));
  return SafetensorsFile(std::move(file), std::move(header));
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(header_.tensors.size());
  for (const auto& t : header_.tensors) names.push_back(t.name);
  return names;
}

std::span<const uint8_t> SafetensorsFile::Bytes(const SafetensorsEntry& entry) const {
  OASIS_CHECK(entry.end <= header_.data_size && entry.begin <= entry.end)
      << "entry '" << entry.name << "' is not from " << path().string();
  return {file_.data() + header_.data_offset + entry.begin, static_cast<size_t>(entry.nbytes())};
}

StatusOr<std::span<const uint8_t>> SafetensorsFile::TensorBytes(const std::string& name) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) return NotFound(path().string() + ": no tensor '" + name + "'");
  return Bytes(*entry);
}

}  // namespace oasis
