// SplitFusedExperts: per-expert names over transformers 5's fused MoE expert tensors.
#include "loader/expert_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loader/tensor_copy.h"

namespace oasis {
namespace {

constexpr const char* kGateUp = "mlp.experts.gate_up_proj";
constexpr const char* kDown = "mlp.experts.down_proj";

// `name` = prefix + leaf (+ ".weight"): the prefix ("model.layers.3."), else nullopt.
std::optional<std::string> FusedPrefix(const std::string& name, const std::string& leaf) {
  for (const std::string& suffix : {leaf, leaf + ".weight"}) {
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return name.substr(0, name.size() - suffix.size());
    }
  }
  return std::nullopt;
}

// One per-expert tensor inside a fused one: rows [row_begin, row_begin + shape[0]) of
// fused[expert], a row-major [shape[0], shape[1]] block.
struct ExpertView {
  std::string fused;
  int64_t expert = 0;
  int64_t row_begin = 0;
  std::vector<int64_t> shape;  // [rows, cols]
};

// SplitFusedExperts' view: owns the name map; reads through the base. Immutable; thread-safe
// as the base is.
class SplitExperts final : public WeightSource {
 public:
  SplitExperts(const WeightSource& base, std::unordered_map<std::string, ExpertView> views)
      : base_(base), views_(std::move(views)) {}

  std::string Describe() const override {
    return base_.Describe() + " (fused experts read per expert)";
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names = base_.Names();
    for (const auto& [name, view] : views_) names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }
  bool Has(const std::string& name) const override {
    return views_.count(name) != 0 || base_.Has(name);
  }
  StatusOr<TensorInfo> Info(const std::string& name) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return base_.Info(name);
    OASIS_ASSIGN_OR_RETURN(TensorInfo fused, base_.Info(it->second.fused));
    return TensorInfo{name, fused.dtype, it->second.shape};
  }
  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return base_.Load(name, dtype);
    const ExpertView& v = it->second;
    OASIS_ASSIGN_OR_RETURN(Tensor one, base_.LoadSlice(v.fused, 0, v.expert, v.expert + 1, dtype));
    Tensor out = Tensor::Empty(v.shape, dtype);
    const size_t row_bytes = static_cast<size_t>(v.shape[1]) * DTypeSize(dtype);
    std::memcpy(out.raw(), static_cast<const char*>(one.raw()) + v.row_begin * row_bytes,
                out.nbytes());
    return out;
  }
  StatusOr<Tensor> LoadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                             DType dtype) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return base_.LoadSlice(name, dim, begin, end, dtype);
    OASIS_ASSIGN_OR_RETURN(TensorInfo info, Info(name));
    OASIS_RETURN_IF_ERROR(CheckSlice(info, dim, begin, end, Describe()));
    OASIS_ASSIGN_OR_RETURN(Tensor whole, Load(name, dtype));
    Tensor out = Tensor::Empty(SliceShape(info.shape, dim, begin, end), dtype);
    const size_t size = DTypeSize(dtype);
    ForEachSliceRun(info.shape, dim, begin, end, [&](int64_t from, int64_t to, int64_t count) {
      std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(to) * size,
                  static_cast<const char*>(whole.raw()) + static_cast<size_t>(from) * size,
                  static_cast<size_t>(count) * size);
    });
    return out;
  }
  StatusOr<std::span<const uint8_t>> RawBytes(const std::string& name) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return base_.RawBytes(name);
    const ExpertView& v = it->second;
    OASIS_ASSIGN_OR_RETURN(TensorInfo fused, base_.Info(v.fused));
    OASIS_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, base_.RawBytes(v.fused));
    const size_t row_bytes = static_cast<size_t>(v.shape[1]) * DTypeSize(fused.dtype);
    const size_t first_row = static_cast<size_t>(v.expert * fused.shape[1] + v.row_begin);
    return bytes.subspan(first_row * row_bytes, static_cast<size_t>(v.shape[0]) * row_bytes);
  }

 private:
  const WeightSource& base_;
  std::unordered_map<std::string, ExpertView> views_;
};

std::string ExpertName(const std::string& prefix, int64_t e, const char* proj) {
  return prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
}

}  // namespace

bool HasFusedExperts(const WeightSource& weights) {
  for (const std::string& name : weights.Names()) {
    if (FusedPrefix(name, kGateUp) || FusedPrefix(name, kDown)) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<WeightSource>> SplitFusedExperts(const WeightSource& base) {
  struct Layer {
    std::string gate_up, down;
  };
  std::map<std::string, Layer> layers;  // by prefix
  for (const std::string& name : base.Names()) {
    if (auto p = FusedPrefix(name, kGateUp)) layers[*p].gate_up = name;
    if (auto p = FusedPrefix(name, kDown)) layers[*p].down = name;
  }
  const std::string where = " (" + base.Describe() + ")";
  std::unordered_map<std::string, ExpertView> views;
  for (const auto& [prefix, layer] : layers) {
    if (layer.gate_up.empty() || layer.down.empty()) {
      return InvalidArgument("fused experts of '" + prefix + "mlp.experts' need both " + kGateUp +
                             " and " + kDown + where);
    }
    OASIS_ASSIGN_OR_RETURN(TensorInfo gu, base.Info(layer.gate_up));
    OASIS_ASSIGN_OR_RETURN(TensorInfo dn, base.Info(layer.down));
    if (gu.shape.size() != 3 || gu.shape[1] % 2 != 0) {
      return InvalidArgument("'" + layer.gate_up + "' has shape " + ShapeToString(gu.shape) +
                             ", expected [num_experts, 2 * moe_intermediate_size, hidden]" + where);
    }
    const int64_t experts = gu.shape[0], inter = gu.shape[1] / 2, hidden = gu.shape[2];
    if (dn.shape != std::vector<int64_t>{experts, hidden, inter}) {
      return InvalidArgument("'" + layer.down + "' has shape " + ShapeToString(dn.shape) +
                             ", expected " + ShapeToString({experts, hidden, inter}) +
                             " to match '" + layer.gate_up + "' " + ShapeToString(gu.shape) +
                             where);
    }
    for (int64_t e = 0; e < experts; ++e) {
      const std::string gate = ExpertName(prefix, e, "gate_proj");
      const std::string up = ExpertName(prefix, e, "up_proj");
      const std::string down = ExpertName(prefix, e, "down_proj");
      for (const std::string& n : {gate, up, down}) {
        if (base.Has(n)) {
          return InvalidArgument("'" + n + "' is stored both per expert and fused in '" + prefix +
                                 "mlp.experts'" + where);
        }
      }
      views[gate] = ExpertView{layer.gate_up, e, 0, {inter, hidden}};
      views[up] = ExpertView{layer.gate_up, e, inter, {inter, hidden}};
      views[down] = ExpertView{layer.down, e, 0, {hidden, inter}};
    }
  }
  return std::unique_ptr<WeightSource>(new SplitExperts(base, std::move(views)));
}

}  // namespace oasis
