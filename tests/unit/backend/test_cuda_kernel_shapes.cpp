// CheckCudaKernelShapes / CheckCudaSparseShapes (src/backend/cuda/kernel_shapes.h): the shapes
// the CUDA kernels compute are accepted (the real models, every fixture the GPU tests load),
// the others refused with a message naming the value and the limit.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "backend/cuda/kernel_shapes.h"
#include "test_support.h"

using namespace oasis;

namespace {

ModelConfig Llama(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.hidden_size = hidden;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = 4 * hidden;
  c.vocab_size = 32000;
  return c;
}

void RequireRefused(const Status& s, const std::string& value, const std::string& limit) {
  INFO(s.ToString());
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains(value));
  CHECK_THAT(s.message(), Catch::Contains(limit));
  CHECK_THAT(s.message(), Catch::Contains("use --backend cpu"));
}

}  // namespace

TEST_CASE("CUDA kernel shapes: the served models are accepted", "[backend][shapes]") {
  ModelConfig qwen3 = Llama(4096, 32, 8, 128);  // Qwen3-8B
  qwen3.architecture = Architecture::kQwen3;
  qwen3.intermediate_size = 12288;
  qwen3.vocab_size = 151936;
  qwen3.qk_norm = true;
  CHECK(CheckCudaKernelShapes(qwen3).ok());
  CHECK(CheckCudaKernelShapes(qwen3, 2).ok());
  CHECK(CheckCudaKernelShapes(qwen3, 8).ok());
  CHECK(CheckCudaSparseShapes(qwen3).ok());
  ModelConfig llama = Llama(4096, 32, 8, 128);  // Llama-3.1-8B
  llama.intermediate_size = 14336;
  llama.vocab_size = 128256;
  CHECK(CheckCudaKernelShapes(llama).ok());
  CHECK(CheckCudaSparseShapes(llama).ok());
  CHECK(CheckCudaKernelShapes(Llama(2048, 32, 8, 64)).ok());  // Llama-3.2-1B
  CHECK(CheckCudaKernelShapes(Llama(2048, 8, 8, 256)).ok());  // head_dim 256: decode kernel
  CHECK(CheckCudaKernelShapes(Llama(64, 4, 2, 16)).ok());     // the GPU tests' tiny shapes
  CHECK(CheckCudaKernelShapes(Llama(64, 4, 2, 24)).ok());
  CHECK(CheckCudaKernelShapes(Llama(64, 6, 1, 32)).ok());  // a group of 6
  CHECK(CheckCudaKernelShapes(Llama(96, 9, 3, 32)).ok());  // 3 KV heads
}

TEST_CASE("CUDA kernel shapes: every committed fixture the GPU tests load is accepted",
          "[backend][shapes]") {
  int checked = 0;
  for (const char* dir : {"models", "eagle3"}) {
    for (const auto& entry : std::filesystem::directory_iterator(testing::FixturePath(dir))) {
      if (!std::filesystem::exists(entry.path() / "config.json")) continue;
      auto config = LoadModelConfig(entry.path());
      REQUIRE(config.ok());
      INFO(entry.path().string() << ": head_dim " << config->head_dim);
      const Status s = CheckCudaKernelShapes(*config);
      INFO(s.ToString());
      CHECK(s.ok());
      ++checked;
    }
  }
  for (const auto& dir : {testing::FixturePath("tiny-default"),
                          testing::SourceDir() / "models" / "embedded",
                          testing::SourceDir() / "models" / "embedded-eagle3"}) {
    if (!std::filesystem::exists(dir / "config.json")) continue;
    auto config = LoadModelConfig(dir);
    REQUIRE(config.ok());
    INFO(dir.string());
    CHECK(CheckCudaKernelShapes(*config).ok());
    ++checked;
  }
  CHECK(checked >= 6);
}

TEST_CASE("CUDA kernel shapes: head_dim outside what the kernels compute is refused",
          "[backend][shapes]") {
  // The probe of issue 29: hidden 64, 8 heads, 4 KV heads, head_dim 8.
  RequireRefused(CheckCudaKernelShapes(Llama(64, 8, 4, 8)), "head_dim 8",
                 "a multiple of 8 from 16 to 256");
  RequireRefused(CheckCudaKernelShapes(Llama(64, 16, 4, 4)), "head_dim 4", "from 16 to 256");
  RequireRefused(CheckCudaKernelShapes(Llama(64, 4, 4, 20)), "head_dim 20", "a multiple of 8");
  RequireRefused(CheckCudaKernelShapes(Llama(4096, 8, 8, 512)), "head_dim 512", "to 256");
  RequireRefused(CheckCudaKernelShapes(Llama(4096, 8, 8, 264)), "head_dim 264", "to 256");
  // The draft head names itself.
  ModelConfig head = Llama(64, 8, 4, 8);
  head.architecture = Architecture::kEagle3Llama;
  head.draft_vocab_size = 512;
  RequireRefused(CheckCudaKernelShapes(head), "the draft head's head_dim 8", "from 16 to 256");
  head.head_dim = 32;
  CHECK(CheckCudaKernelShapes(head).ok());
}

TEST_CASE("CUDA kernel shapes: heads that do not group, or split over the ranks, are refused",
          "[backend][shapes]") {
  RequireRefused(CheckCudaKernelShapes(Llama(64, 6, 4, 16)), "6 query heads over 4 KV heads",
                 "a whole number of query heads per KV head");
  RequireRefused(CheckCudaKernelShapes(Llama(64, 4, 0, 16)), "over 0 KV heads",
                 "a whole number");
  RequireRefused(CheckCudaKernelShapes(Llama(4096, 32, 8, 128), 3), "over 3 tensor-parallel ranks",
                 "both divisible by the ranks");
}

TEST_CASE("CUDA kernel shapes: sizes beyond the int the GEMMs and the sampler take are refused",
          "[backend][shapes]") {
  ModelConfig c = Llama(4096, 32, 8, 128);
  c.vocab_size = int64_t{1} << 31;
  RequireRefused(CheckCudaKernelShapes(c), "vocab_size 2147483648", "at most 2147483647");
  c.vocab_size = 2147483647;
  CHECK(CheckCudaKernelShapes(c).ok());
  c.intermediate_size = int64_t{3} << 30;
  RequireRefused(CheckCudaKernelShapes(c), "intermediate_size 3221225472", "at most 2147483647");
}

TEST_CASE("CUDA sparse KV shapes: head_dim 32/64/128/256 and groups up to 16", "[backend][shapes]") {
  CHECK(CheckCudaSparseShapes(Llama(64, 4, 2, 32)).ok());
  CHECK(CheckCudaSparseShapes(Llama(4096, 64, 4, 64)).ok());  // group 16
  RequireRefused(CheckCudaSparseShapes(Llama(64, 4, 2, 16)), "sparse KV with head_dim 16",
                 "32, 64, 128, 256");
  RequireRefused(CheckCudaSparseShapes(Llama(64, 4, 2, 24)), "head_dim 24", "32, 64, 128, 256");
  RequireRefused(CheckCudaSparseShapes(Llama(4096, 68, 4, 64)), "17 query heads per KV head",
                 "1 to 16");
}

TEST_CASE("CUDA kernel shapes: MoE models within the MoE kernels' limits are accepted",
          "[backend][shapes][moe]") {
  ModelConfig c = Llama(2048, 32, 4, 128);  // Qwen3-30B-A3B
  c.architecture = Architecture::kQwen3Moe;
  c.architecture_name = "Qwen3MoeForCausalLM";
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  CHECK(CheckCudaKernelShapes(c, 1).ok());
  CHECK(CheckCudaKernelShapes(c, 2).ok());  // I 384 per rank
  CHECK(CheckCudaKernelShapes(c, 4).ok());  // I 192 per rank
  ModelConfig big = c;                      // Qwen3-235B-A22B
  big.hidden_size = 4096;
  big.num_attention_heads = 64;
  big.moe_intermediate_size = 1536;
  CHECK(CheckCudaKernelShapes(big, 1).ok());
  CHECK(CheckCudaKernelShapes(big, 4).ok());
  // (TP8 would need the 4 KV heads replicated: refused by the head check, not by MoE.)
  c.num_experts = 1024;
  CHECK(CheckCudaKernelShapes(c, 1).ok());
}

TEST_CASE("CUDA kernel shapes: MoE sizes the MoE kernels do not compute are refused",
          "[backend][shapes][moe]") {
  ModelConfig c = Llama(2048, 32, 4, 128);
  c.architecture = Architecture::kQwen3Moe;
  c.architecture_name = "Qwen3MoeForCausalLM";
  c.num_experts = 1025;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  RequireRefused(CheckCudaKernelShapes(c), "num_experts 1025", "at most 1024");
  c.num_experts = 128;
  c.moe_intermediate_size = 12;
  RequireRefused(CheckCudaKernelShapes(c), "moe_intermediate_size 12", "a multiple of 8 per rank");
  c.moe_intermediate_size = 24;
  CHECK(CheckCudaKernelShapes(c, 1).ok());
  RequireRefused(CheckCudaKernelShapes(c, 2), "moe_intermediate_size 24 over 2 tensor-parallel",
                 "a multiple of 8 per rank");  // 12 per rank
  c.moe_intermediate_size = 768;
  c.hidden_size = 2044;
  c.num_attention_heads = 16;
  RequireRefused(CheckCudaKernelShapes(c), "hidden_size 2044 with mixture-of-experts layers",
                 "a multiple of 8");
  // Every layer dense (no experts, or all in mlp_only_layers): the dense kernels serve it,
  // whatever the MoE sizes say.
  c.mlp_only_layers = {0, 1};
  CHECK(CheckCudaKernelShapes(c, 1).ok());
  c.mlp_only_layers.clear();
  c.num_experts = 0;
  CHECK(CheckCudaKernelShapes(c, 1).ok());
}
