#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <string>

#include "common/tuning.h"

using namespace oasis;

namespace {
Tuning Parse(const std::map<std::string, std::string>& vars) {
  return ParseTuning([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}
}  // namespace

TEST_CASE("tuning knobs: defaults with nothing set", "[tuning]") {
  const Tuning t = Parse({});
  CHECK_FALSE(t.fuse_qkv);
  CHECK(t.fuse_silu);
  CHECK(t.host_register);
  CHECK(t.sparse_graphs);
  CHECK_FALSE(t.profile_draft);
  CHECK(t.pdl);
  CHECK_FALSE(t.topk_radix);
  CHECK(t.gemv_norm_ctas_per_sm == 0);
  CHECK(t.gather_ctas == kDefaultGatherCtas);
  CHECK(t.gather_kernel == GatherKernel::kTma);
  CHECK(t.gather_error.empty());
}

TEST_CASE("tuning knobs: each variable's values", "[tuning]") {
  CHECK(Parse({{"OASIS_FUSE_QKV", "1"}}).fuse_qkv);
  CHECK_FALSE(Parse({{"OASIS_FUSE_QKV", "0"}}).fuse_qkv);
  CHECK_FALSE(Parse({{"OASIS_FUSE_SILU", "0"}}).fuse_silu);
  CHECK_FALSE(Parse({{"OASIS_HOST_REGISTER", "0"}}).host_register);
  CHECK_FALSE(Parse({{"OASIS_SPARSE_GRAPHS", "0"}}).sparse_graphs);
  CHECK(Parse({{"OASIS_SPARSE_GRAPHS", "1"}}).sparse_graphs);
  CHECK(Parse({{"OASIS_PROFILE_DRAFT", "0"}}).profile_draft);  // set at all: on
  CHECK_FALSE(Parse({{"OASIS_PDL", "0"}}).pdl);
  CHECK(Parse({{"OASIS_TOPK_RADIX", "1"}}).topk_radix);
  CHECK_FALSE(Parse({{"OASIS_TOPK_RADIX", "yes"}}).topk_radix);
  CHECK(Parse({}).fp8_prefill_wgmma);
  CHECK(Parse({{"OASIS_FP8_PREFILL", "wgmma"}}).fp8_prefill_wgmma);
  CHECK_FALSE(Parse({{"OASIS_FP8_PREFILL", "mma"}}).fp8_prefill_wgmma);
  CHECK(Parse({{"OASIS_FP8_PREFILL", "fast"}}).fp8_prefill_wgmma);
  CHECK(Parse({{"OASIS_GEMV_NORM_CTAS_PER_SM", "3"}}).gemv_norm_ctas_per_sm == 3);
  CHECK(Parse({{"OASIS_GEMV_NORM_CTAS_PER_SM", "0"}}).gemv_norm_ctas_per_sm == 0);
  CHECK(Parse({{"OASIS_GEMV_NORM_CTAS_PER_SM", "x"}}).gemv_norm_ctas_per_sm == 0);
  CHECK(Parse({}).gemv_narrow_below == 4096);
  CHECK(Parse({{"OASIS_GEMV_NARROW_K", "1"}}).gemv_narrow_below == 1);
  CHECK(Parse({{"OASIS_GEMV_NARROW_K", "8192"}}).gemv_narrow_below == 8192);
  CHECK(Parse({{"OASIS_GEMV_NARROW_K", "0"}}).gemv_narrow_below == 4096);
  CHECK(Parse({}).moe_gemm_tile_rows == 0);
  CHECK(Parse({}).moe_gemm_wgmma);
  CHECK_FALSE(Parse({{"OASIS_MOE_GEMM_WGMMA", "0"}}).moe_gemm_wgmma);
  CHECK(Parse({{"OASIS_MOE_GEMM_WGMMA", "1"}}).moe_gemm_wgmma);
  for (const char* rows : {"16", "32", "64", "128"}) {
    CHECK(Parse({{"OASIS_MOE_GEMM_TILE_ROWS", rows}}).moe_gemm_tile_rows == std::atoi(rows));
  }
  for (const char* bad : {"0", "8", "48", "256", "-16", "x", ""}) {
    CHECK(Parse({{"OASIS_MOE_GEMM_TILE_ROWS", bad}}).moe_gemm_tile_rows == 0);
  }
  CHECK(Parse({}).gemv_narrow_norm);
  CHECK(Parse({{"OASIS_GEMV_NARROW_NORM", "1"}}).gemv_narrow_norm);
  CHECK_FALSE(Parse({{"OASIS_GEMV_NARROW_NORM", "0"}}).gemv_narrow_norm);
  CHECK(Parse({}).moe_down_one_wave);
  CHECK(Parse({{"OASIS_MOE_DOWN_ONE_WAVE", "1"}}).moe_down_one_wave);
  CHECK_FALSE(Parse({{"OASIS_MOE_DOWN_ONE_WAVE", "0"}}).moe_down_one_wave);
  CHECK(Parse({}).decode_splits == 0);
  CHECK(Parse({{"OASIS_DECODE_SPLITS", "1"}}).decode_splits == 1);
  CHECK(Parse({{"OASIS_DECODE_SPLITS", "4"}}).decode_splits == 4);
  CHECK(Parse({{"OASIS_DECODE_SPLITS", "1024"}}).decode_splits == 1024);
  for (const char* bad : {"0", "-2", "1025", "x", ""}) {
    CHECK(Parse({{"OASIS_DECODE_SPLITS", bad}}).decode_splits == 0);
  }
  CHECK(Parse({{"OASIS_GEMV_NARROW_K", "-5"}}).gemv_narrow_below == 4096);
  CHECK(Parse({{"OASIS_GEMV_NARROW_K", "x"}}).gemv_narrow_below == 4096);
  const Tuning g = Parse({{"OASIS_GATHER_CTAS", "32"}, {"OASIS_GATHER_KERNEL", "registers"}});
  CHECK(g.gather_ctas == 32);
  CHECK(g.gather_kernel == GatherKernel::kRegisters);
  CHECK(g.gather_error.empty());
  CHECK(Parse({{"OASIS_GATHER_CTAS", ""}, {"OASIS_GATHER_KERNEL", ""}})
            .gather_error.empty());  // empty: unset
}

TEST_CASE("tuning knobs: invalid gather values are errors naming the variable", "[tuning]") {
  for (const char* bad : {"0", "1025", "12x", "many"}) {
    const Tuning t = Parse({{"OASIS_GATHER_CTAS", bad}});
    INFO(bad);
    CHECK(t.gather_error == std::string("OASIS_GATHER_CTAS must be 1 to 1024, not '") + bad + "'");
    CHECK(t.gather_ctas == kDefaultGatherCtas);
  }
  const Tuning k = Parse({{"OASIS_GATHER_KERNEL", "cuda"}});
  CHECK(k.gather_error == "OASIS_GATHER_KERNEL must be tma or registers, not 'cuda'");
  CHECK(k.gather_kernel == GatherKernel::kTma);
}
