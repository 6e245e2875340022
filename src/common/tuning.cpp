#include "common/tuning.h"

#include <cstdlib>
#include <string>

namespace oasis {
namespace {

// Set, and not "0".
bool OnUnlessZero(const char* v, bool fallback) {
  return v == nullptr ? fallback : std::string(v) != "0";
}

void ParseGather(const std::function<const char*(const char*)>& env, Tuning& t) {
  if (const char* v = env("OASIS_GATHER_CTAS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 1024) {
      t.gather_error = std::string("OASIS_GATHER_CTAS must be 1 to 1024, not '") + v + "'";
    } else {
      t.gather_ctas = static_cast<int>(n);
    }
  }
  if (const char* v = env("OASIS_GATHER_KERNEL"); v != nullptr && *v != '\0') {
    if (std::string(v) == "registers") {
      t.gather_kernel = GatherKernel::kRegisters;
    } else if (std::string(v) != "tma") {
      t.gather_error = std::string("OASIS_GATHER_KERNEL must be tma or registers, not '") + v + "'";
    }
  }
}

Tuning& ProcessTuning() {
  static Tuning tuning = ParseTuning([](const char* name) { return std::getenv(name); });
  return tuning;
}

}  // namespace

Tuning ParseTuning(const std::function<const char*(const char*)>& env) {
  Tuning t;
  t.fuse_qkv = OnUnlessZero(env("OASIS_FUSE_QKV"), false);
  t.fuse_silu = OnUnlessZero(env("OASIS_FUSE_SILU"), true);
  t.host_register = OnUnlessZero(env("OASIS_HOST_REGISTER"), true);
  t.sparse_graphs = OnUnlessZero(env("OASIS_SPARSE_GRAPHS"), true);
  t.profile_draft = env("OASIS_PROFILE_DRAFT") != nullptr;
  t.pdl = OnUnlessZero(env("OASIS_PDL"), true);
  t.moe_gemm_wgmma = OnUnlessZero(env("OASIS_MOE_GEMM_WGMMA"), true);
  const char* radix = env("OASIS_TOPK_RADIX");
  t.topk_radix = radix != nullptr && std::string(radix) == "1";
  const char* fp8_prefill = env("OASIS_FP8_PREFILL");
  if (fp8_prefill != nullptr && std::string(fp8_prefill) == "wgmma") t.fp8_prefill_wgmma = true;
  if (fp8_prefill != nullptr && std::string(fp8_prefill) == "mma") t.fp8_prefill_wgmma = false;
  if (const char* v = env("OASIS_GEMV_NARROW_K"); v != nullptr && std::atoll(v) >= 1) {
    t.gemv_narrow_below = std::atoll(v);
  }
  if (const char* v = env("OASIS_GEMV_NORM_CTAS_PER_SM"); v != nullptr && std::atoi(v) >= 1) {
    t.gemv_norm_ctas_per_sm = std::atoi(v);
  }
  if (const char* v = env("OASIS_MOE_GEMM_TILE_ROWS"); v != nullptr) {
    const int rows = std::atoi(v);
    if (rows == 16 || rows == 32 || rows == 64 || rows == 128) t.moe_gemm_tile_rows = rows;
  }
  t.moe_down_one_wave = OnUnlessZero(env("OASIS_MOE_DOWN_ONE_WAVE"), true);
  t.gemv_narrow_norm = OnUnlessZero(env("OASIS_GEMV_NARROW_NORM"), true);
  if (const char* v = env("OASIS_DECODE_SPLITS"); v != nullptr) {
    const int n = std::atoi(v);
    if (n >= 1 && n <= 1024) t.decode_splits = n;
  }
  ParseGather(env, t);
  return t;
}

const Tuning& GetTuning() { return ProcessTuning(); }

void SetTuningForTesting(const Tuning& tuning) { ProcessTuning() = tuning; }

}  // namespace oasis
