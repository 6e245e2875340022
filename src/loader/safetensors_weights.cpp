// WeightSource over safetensors checkpoints: one file, a directory of *.safetensors files,
// or shards listed by model.safetensors.index.json.
#include <spdlog/spdlog.h>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/check.h"
#include "common/json_depth.h"
#include "loader/safetensors.h"
#include "loader/small_file.h"
#include "loader/tensor_copy.h"
#include "loader/weights.h"

namespace oasis {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";

// SafetensorsWeights: owns the mapped files of one checkpoint and a name -> (file, entry)
// index over the tensors it exposes. Immutable after construction; thread-safe.
class SafetensorsWeights final : public WeightSource {
 public:
  struct Location {
    size_t file = 0;                          // index into files_
    const SafetensorsEntry* entry = nullptr;  // points into files_[file]'s header
  };

  SafetensorsWeights(std::string description, std::vector<std::unique_ptr<SafetensorsFile>> files,
                     std::unordered_map<std::string, Location> tensors)
      : description_(std::move(description)),
        files_(std::move(files)),
        tensors_(std::move(tensors)) {
    names_.reserve(tensors_.size());
    for (const auto& [name, loc] : tensors_) names_.push_back(name);
    std::sort(names_.begin(), names_.end());
  }

  std::string Describe() const override { return description_; }
  std::vector<std::string> Names() const override { return names_; }
  bool Has(const std::string& name) const override { return tensors_.count(name) != 0; }

  StatusOr<TensorInfo> Info(const std::string& name) const override {
    OASIS_ASSIGN_OR_RETURN(Location loc, Find(name));
    return TensorInfo{name, loc.entry->dtype, loc.entry->shape};
  }

  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    OASIS_ASSIGN_OR_RETURN(Location loc, Find(name));
    const SafetensorsEntry& e = *loc.entry;
    OASIS_RETURN_IF_ERROR(CheckConversion(TensorInfo{name, e.dtype, e.shape}, dtype, description_));
    Tensor out = Tensor::Empty(e.shape, dtype);
    ConvertElements(files_[loc.file]->Bytes(e).data(), e.dtype, out.raw(), dtype,
                    static_cast<size_t>(out.numel()));
    return out;
  }

  StatusOr<std::span<const uint8_t>> RawBytes(const std::string& name) const override {
    OASIS_ASSIGN_OR_RETURN(Location loc, Find(name));
    return files_[loc.file]->Bytes(*loc.entry);
  }

  StatusOr<Tensor> LoadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                             DType dtype) const override {
    OASIS_ASSIGN_OR_RETURN(Location loc, Find(name));
    const SafetensorsEntry& e = *loc.entry;
    TensorInfo info{name, e.dtype, e.shape};
    OASIS_RETURN_IF_ERROR(CheckConversion(info, dtype, description_));
    OASIS_RETURN_IF_ERROR(CheckSlice(info, dim, begin, end, description_));
    Tensor out = Tensor::Empty(SliceShape(e.shape, dim, begin, end), dtype);
    const uint8_t* src = files_[loc.file]->Bytes(e).data();
    auto* dst = static_cast<uint8_t*>(out.raw());
    const size_t src_size = DTypeSize(e.dtype), dst_size = DTypeSize(dtype);
    ForEachSliceRun(e.shape, dim, begin, end, [&](int64_t from, int64_t to, int64_t count) {
      ConvertElements(src + static_cast<size_t>(from) * src_size, e.dtype,
                      dst + static_cast<size_t>(to) * dst_size, dtype, static_cast<size_t>(count));
    });
    return out;
  }

 private:
  StatusOr<Location> Find(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return NotFound(description_ + ": no tensor '" + name + "'");
    return it->second;
  }

  std::string description_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, Location> tensors_;
  std::vector<std::string> names_;  // sorted
};

StatusOr<std::unique_ptr<SafetensorsFile>> OpenFile(const fs::path& path) {
  OASIS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  return std::make_unique<SafetensorsFile>(std::move(file));
}

// Every tensor of every file; duplicate names across files are an error.
StatusOr<std::unique_ptr<WeightSource>> OpenFiles(const std::vector<fs::path>& paths,
                                                  std::string description) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, SafetensorsWeights::Location> tensors;
  for (const fs::path& path : paths) {
    OASIS_ASSIGN_OR_RETURN(auto file, OpenFile(path));
    for (const SafetensorsEntry& e : file->header().tensors) {
      auto [it, inserted] = tensors.emplace(e.name, SafetensorsWeights::Location{files.size(), &e});
      if (!inserted) {
        return InvalidArgument("tensor '" + e.name + "' appears in both " +
                               files[it->second.file]->path().string() + " and " + path.string());
      }
    }
    files.push_back(std::move(file));
  }
  return std::unique_ptr<WeightSource>(
      new SafetensorsWeights(std::move(description), std::move(files), std::move(tensors)));
}

StatusOr<std::unique_ptr<WeightSource>> OpenIndexed(const fs::path& index_path) {
  const std::string src = index_path.string();
  OASIS_ASSIGN_OR_RETURN(const std::string text,
                         ReadSmallFile(index_path, "safetensors index", kMaxIndexJsonBytes));
  if (JsonNestedDeeperThan(text))
    return DataLoss(src + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return DataLoss(src + ": not valid JSON");
  if (!root.is_object()) return InvalidArgument(src + ": not a JSON object");
  auto map_it = root.find("weight_map");
  if (map_it == root.end() || !map_it->is_object()) {
    return InvalidArgument(src + ": missing or non-object \"weight_map\"");
  }
  if (map_it->empty()) return InvalidArgument(src + ": \"weight_map\" is empty");

  // Shard file name -> tensors the map places there.
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return InvalidArgument(src + ": weight_map entry of tensor '" + tensor + "' is not a string");
    }
    const auto& shard_name = shard.get_ref<const std::string&>();
    fs::path rel(shard_name);
    bool escapes = shard_name.empty() || rel.is_absolute() ||
                   std::any_of(rel.begin(), rel.end(), [](const fs::path& p) { return p == ".."; });
    if (escapes) {
      return InvalidArgument(src + ": tensor '" + tensor + "' maps to shard '" + shard_name +
                             "', which is not a file name inside the checkpoint directory");
    }
    shards[shard_name].push_back(tensor);
  }

  const fs::path dir = index_path.parent_path();
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, SafetensorsWeights::Location> tensors;
  size_t unmapped = 0;
  for (const auto& [shard_name, names] : shards) {
    const fs::path shard_path = dir / shard_name;
    auto file = OpenFile(shard_path);
    if (!file.ok()) {
      return Status(file.status().code(),
                    src + ": shard '" + shard_name + "': " + file.status().message());
    }
    for (const std::string& name : names) {
      const SafetensorsEntry* e = (*file)->Find(name);
      if (e == nullptr) {
        return NotFound(src + ": tensor '" + name + "' is mapped to shard '" + shard_name +
                        "', which does not contain it");
      }
      tensors.emplace(name, SafetensorsWeights::Location{files.size(), e});
    }
    unmapped += (*file)->header().tensors.size() - names.size();
    files.push_back(std::move(file).value());
  }
  if (unmapped > 0) {
    spdlog::warn("{}: {} tensor(s) in the shards are not in the weight_map and are ignored", src,
                 unmapped);
  }
  std::string description = std::to_string(files.size()) + " shard(s) of " + src;
  return std::unique_ptr<WeightSource>(
      new SafetensorsWeights(std::move(description), std::move(files), std::move(tensors)));
}

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsWeights(const fs::path& model_dir) {
  std::error_code ec;
  if (fs::is_regular_file(model_dir, ec)) {
    return OpenFiles({model_dir}, model_dir.string());
  }
  if (!fs::is_directory(model_dir, ec)) {
    return NotFound(model_dir.string() + ": no such checkpoint directory");
  }
  const fs::path index = model_dir / kIndexName;
  if (fs::exists(index, ec)) return OpenIndexed(index);

  std::vector<fs::path> paths;
  for (const auto& item : fs::directory_iterator(model_dir, ec)) {
    if (item.path().extension() == ".safetensors" && item.is_regular_file(ec)) {
      paths.push_back(item.path());
    }
  }
  if (ec) return Internal(model_dir.string() + ": cannot list directory: " + ec.message());
  if (paths.empty()) {
    return NotFound(model_dir.string() + ": no " + kIndexName + " and no *.safetensors files");
  }
  std::sort(paths.begin(), paths.end());
  std::string description =
      paths.size() == 1
          ? paths[0].filename().string() + " in " + model_dir.string()
          : std::to_string(paths.size()) + " safetensors files in " + model_dir.string();
  return OpenFiles(paths, std::move(description));
}

}  // namespace oasis
