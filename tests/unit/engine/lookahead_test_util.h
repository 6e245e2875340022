// Helpers of the lookahead engine tests: draft heads for the tiny fixture targets — the
// PyTorch-reference head of tests/fixtures/eagle3/ and a constructed "copy" head whose
// draft is the target's own greedy prediction — and their DraftRunners.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runner/draft_runner.h"
#include "loader/weights.h"
#include "models/eagle3.h"
#include "test_engine_util.h"

namespace oasis::engine_test {

// A WeightSource over host tensors (F32 floats, I64 d2t), returned as stored.
class HostWeights final : public WeightSource {
 public:
  void Set(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
  std::string Describe() const override { return "test host weights"; }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const auto& [n, t] : tensors_) names.push_back(n);
    return names;
  }
  bool Has(const std::string& name) const override { return tensors_.count(name) > 0; }
  StatusOr<TensorInfo> Info(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return NotFound(name);
    return TensorInfo{name, it->second.dtype(), it->second.shape()};
  }
  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return NotFound(name);
    if (it->second.dtype() != dtype) return InvalidArgument(name + ": stored with another dtype");
    return it->second.Clone();
  }
  StatusOr<Tensor> LoadSlice(const std::string& name, int, int64_t, int64_t, DType) const override {
    return Unimplemented("LoadSlice " + name);
  }

 private:
  std::map<std::string, Tensor> tensors_;
};

// The head of tests/fixtures/eagle3/qwen3-tiny (tools/eagle3_reference.py), for the
// qwen3-tiny target: default aux layers, draft vocab 256 with a non-trivial d2t.
inline std::unique_ptr<Eagle3Head> FixtureHead(TinyModel& tm) {
  auto head = Eagle3Head::Load(testing::FixturePath("eagle3/qwen3-tiny"), *tm.model, tm.backend);
  REQUIRE(head.ok());
  return std::move(*head);
}

// A head whose draft is the target's greedy prediction at the row's own position: aux
// layer L (the stream leaving the last layer), fc selecting it, zero attention and MLP
// outputs (o_proj = down = 0), the target's final norm and lm_head, d2t = 0. Head row p
// (embedding x_{p+1}) thus proposes argmax(target logits at p) for x_{p+2}: under greedy
// decoding "repeat the last token", which the tiny random targets do for long stretches.
inline std::unique_ptr<Eagle3Head> CopyHead(TinyModel& tm) {
  const ModelConfig& t = tm.config;
  ModelConfig hc = Eagle3Head::ConfigForTarget(t);
  const int64_t L = t.num_hidden_layers, H = t.hidden_size;
  hc.aux_hidden_state_layer_ids = {0, L / 2, L};
  HostWeights w;
  for (const WeightSpec& s : Eagle3Head::ExpectedWeights(hc, false)) {
    if (s.dtype == DType::kI64) {
      w.Set(s.name, Tensor::Zeros(s.shape, DType::kI64));
    } else if (s.init == DummyInit::kOnes) {
      w.Set(s.name, Tensor::FromFloats(std::vector<float>(static_cast<size_t>(s.numel()), 1.0f), s.shape));
    } else {
      w.Set(s.name, Tensor::Zeros(s.shape, DType::kF32));
    }
  }
  Tensor fc = Tensor::Zeros({H, 3 * H}, DType::kF32);
  for (int64_t i = 0; i < H; ++i) fc.data<float>()[i * 3 * H + 2 * H + i] = 1.0f;
  w.Set("fc.weight", fc);
  auto load = [&](const std::string& name) {
    auto x = tm.weights->Load(name, DType::kF32);
    REQUIRE(x.ok());
    return *x;
  };
  w.Set("norm.weight", load("model.norm.weight"));
  w.Set("lm_head.weight",
        load(tm.weights->Has("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight"));
  auto head = Eagle3Head::Create(hc, w, *tm.model, tm.backend);
  REQUIRE(head.ok());
  return std::move(*head);
}

// A draft runner whose pool holds as many tokens as the target's.
inline std::unique_ptr<DraftRunner> MakeDraftRunner(TinyModel& tm, Eagle3Head& head) {
  const int64_t slots = DraftKvSlotsFor(tm.runner->num_kv_slots(), tm.config.num_key_value_heads,
                                        head.config().num_key_value_heads);
  return std::make_unique<DraftRunner>(head, tm.backend, slots);
}

}  // namespace oasis::engine_test
