// GPU: the EAGLE-3 head and the target's aux-layer capture on the CUDA backend (fused
// kernels, PDL launches) against the PyTorch reference fixtures of tests/fixtures/eagle3
// (tools/eagle3_reference.py), like tests/models/test_eagle3.cpp does on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cuda/cuda_backend.h"
#include "runner/batch_builder.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "models/eagle3.h"
#include "test_support.h"

using namespace oasis;

TEST_CASE("CUDA EAGLE-3 head with the target's capture matches the PyTorch reference", "[gpu][eagle3]") {
  auto backend = CudaBackend::Create();
  REQUIRE(backend.ok());
  CudaBackend& B = **backend;
  for (const testing::Eagle3Fixture& spec : testing::Eagle3Fixtures()) {
    const std::string& name = spec.name;
    DYNAMIC_SECTION(name) {
      const auto& head_dir = spec.head;
      const auto& target_dir = spec.target;
      REQUIRE(std::filesystem::exists(spec.reference));
      auto config = LoadModelConfig(target_dir);
      REQUIRE(config.ok());
      auto weights = OpenSafetensorsWeights(target_dir);
      REQUIRE(weights.ok());
      auto target = DecoderLM::Create(*config, **weights, B);
      REQUIRE(target.ok());
      auto head = Eagle3Head::Load(head_dir, **target, B);
      REQUIRE(head.ok());
      auto ref = SafetensorsFile::Open(spec.reference);
      REQUIRE(ref.ok());
      int prompts = 0;
      for (int p = 0; ref->TensorBytes("prompt" + std::to_string(p) + ".ids").ok(); ++p, ++prompts) {
        const std::string key = "prompt" + std::to_string(p);
        auto ids64 = testing::TensorVector<int64_t>(*ref, key + ".ids");
        std::vector<int32_t> prompt(ids64.begin(), ids64.end());
        auto expect = testing::TensorVector<float>(*ref, key + ".draft_logits");
        auto tokens = testing::TensorVector<int64_t>(*ref, key + ".draft_tokens");
        auto margins = testing::TensorVector<float>(*ref, key + ".draft_margins");
        const int64_t P = static_cast<int64_t>(prompt.size());
        // Target prefill with the capture, on the device.
        BlockAllocator target_alloc(64);
        HeadBlockTable target_table(static_cast<int32_t>(config->num_key_value_heads));
        REQUIRE(target_table.Reserve(P, target_alloc).ok());
        auto target_kv = (*target)->AllocateKvCache(64);
        ResidualCapture cap;
        for (int64_t id : (*head)->aux_layer_ids()) cap.layer_ids.push_back(id);
        cap.out = B.Empty({static_cast<int64_t>(cap.layer_ids.size()), P, config->hidden_size}, DType::kBF16);
        ForwardInput tin = UploadForwardInput(B, BuildHostForwardInput({StepSequence{&target_table, 0, prompt}}, LogitsFor::kEveryToken));
        (void)(*target)->Forward(tin, target_kv, &cap);
        // The head over rows [0, P-1): row t embeds token t+1 and uses the features of row t.
        std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
        const int64_t T = P - 1;
        BlockAllocator head_alloc(16);
        HeadBlockTable head_table(static_cast<int32_t>((*head)->config().num_key_value_heads));
        REQUIRE(head_table.Reserve(T, head_alloc).ok());
        auto head_kv = (*head)->AllocateKvCache(16);
        ForwardInput hin = UploadForwardInput(B, BuildHostForwardInput({StepSequence{&head_table, 0, next}}, LogitsFor::kEveryToken));
        Tensor logits = B.Download((*head)->Forward(hin, cap.out, head_kv));
        REQUIRE(logits.numel() == static_cast<int64_t>(expect.size()));
        double num = 0, den = 0;
        for (int64_t i = 0; i < logits.numel(); ++i) {
          const double d = logits.data<float>()[i] - expect[static_cast<size_t>(i)];
          num += d * d;
          den += static_cast<double>(expect[static_cast<size_t>(i)]) * expect[static_cast<size_t>(i)];
        }
        const double err = std::sqrt(num / std::max(den, 1e-30));
        INFO(name << " " << key << " normalized error " << err);
        std::printf("%s %s: normalized error %.3g\n", name.c_str(), key.c_str(), err);
        CHECK(err < 2e-2);  // bf16 activations and weights against the float32 reference
        std::vector<int32_t> got = (*head)->GreedyTargetTokens(logits);
        REQUIRE(got.size() == tokens.size());
        for (size_t i = 0; i < got.size(); ++i) {
          if (margins[i] > 5e-2f) CHECK(got[i] == tokens[i]);
        }
        head_table.Release(head_alloc);
        target_table.Release(target_alloc);
      }
      CHECK(prompts > 0);
    }
  }
}
