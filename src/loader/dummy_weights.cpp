// Dummy weights (`--load-format dummy`): values are a pure function of (seed, tensor name,
// element index), so Load and LoadSlice agree and any slice is generated without the rest.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/check.h"
#include "common/host_memory.h"
#include "loader/tensor_copy.h"
#include "loader/weights.h"

namespace oasis {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Standard normals for element pair `pair` (elements 2*pair and 2*pair+1): Box-Muller on
// two 24-bit uniforms drawn from a counter-based hash.
void NormalPair(uint64_t key, uint64_t pair, float* z0, float* z1) {
  const uint64_t h = SplitMix64(key ^ SplitMix64(pair));
  const float u1 = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>(h & 0xffffffu) * (1.0f / 16777216.0f);  // [0, 1)
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float theta = 6.28318530717958647f * u2;
  *z0 = r * std::cos(theta);
  *z1 = r * std::sin(theta);
}

// Writes `n` floats to `dst` as `dtype` (any dtype; integers are value-converted).
void StoreFloats(const float* src, void* dst, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
      ConvertFromFloat(src, dst, dtype, n);
      return;
    case DType::kF8E5M2:
      break;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = src[i];
      return;
    case DType::kI64:
      for (size_t i = 0; i < n; ++i) static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(src[i]);
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(src[i]);
      return;
    case DType::kI16:
      for (size_t i = 0; i < n; ++i) static_cast<int16_t*>(dst)[i] = static_cast<int16_t>(src[i]);
      return;
    case DType::kI8:
      for (size_t i = 0; i < n; ++i) static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(src[i]);
      return;
    case DType::kU8:
    case DType::kBool:
      for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(src[i]);
      return;
  }
  OASIS_CHECK(false) << "StoreFloats: unknown dtype";
}

// DummyWeights: owns the specs; generates tensors on request (large ones on short-lived
// worker threads). Immutable; thread-safe.
class DummyWeights final : public WeightSource {
 public:
  DummyWeights(std::vector<WeightSpec> specs, uint64_t seed)
      : specs_(std::move(specs)), seed_(seed) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      const WeightSpec& s = specs_[i];
      OASIS_CHECK(by_name_.emplace(s.name, i).second)
          << "duplicate dummy weight '" << s.name << "'";
      for (int64_t d : s.shape) OASIS_CHECK_GE(d, 0) << "dummy weight '" << s.name << "'";
      OASIS_CHECK(s.init != DummyInit::kNormal || IsFloatDType(s.dtype))
          << "dummy weight '" << s.name << "': normal init needs a float dtype, not "
          << DTypeName(s.dtype);
      OASIS_CHECK(std::isfinite(s.stddev) && s.stddev >= 0) << "dummy weight '" << s.name << "'";
    }
  }

  std::string Describe() const override {
    return "dummy weights (" + std::to_string(specs_.size()) + " tensors, seed " +
           std::to_string(seed_) + ")";
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const auto& s : specs_) names.push_back(s.name);
    std::sort(names.begin(), names.end());
    return names;
  }
  bool Has(const std::string& name) const override { return by_name_.count(name) != 0; }

  StatusOr<TensorInfo> Info(const std::string& name) const override {
    OASIS_ASSIGN_OR_RETURN(const WeightSpec* s, Find(name));
    return TensorInfo{s->name, s->dtype, s->shape};
  }

  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    OASIS_ASSIGN_OR_RETURN(const WeightSpec* s, Find(name));
    OASIS_RETURN_IF_ERROR(
        CheckConversion(TensorInfo{s->name, s->dtype, s->shape}, dtype, Describe()));
    Tensor out = Tensor::Empty(s->shape, dtype);
    GenerateParallel(*s, {{0, 0, out.numel()}}, static_cast<uint8_t*>(out.raw()), dtype);
    return out;
  }

  StatusOr<Tensor> LoadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                             DType dtype) const override {
    OASIS_ASSIGN_OR_RETURN(const WeightSpec* s, Find(name));
    TensorInfo info{s->name, s->dtype, s->shape};
    OASIS_RETURN_IF_ERROR(CheckConversion(info, dtype, Describe()));
    OASIS_RETURN_IF_ERROR(CheckSlice(info, dim, begin, end, Describe()));
    Tensor out = Tensor::Empty(SliceShape(s->shape, dim, begin, end), dtype);
    std::vector<Run> runs;
    ForEachSliceRun(s->shape, dim, begin, end, [&](int64_t from, int64_t to, int64_t count) {
      runs.push_back({from, to, count});
    });
    GenerateParallel(*s, std::move(runs), static_cast<uint8_t*>(out.raw()), dtype);
    return out;
  }

 private:
  StatusOr<const WeightSpec*> Find(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return NotFound(Describe() + ": no tensor '" + name + "'");
    return &specs_[it->second];
  }

  // Contiguous run: `count` elements from element `from` of the full tensor to element `to`
  // of the output.
  struct Run {
    int64_t from, to, count;
  };

  // Generates all runs into `dst`, splitting them into pieces spread over up to
  // hardware_concurrency threads when there is enough work. Values do not depend on the split.
  void GenerateParallel(const WeightSpec& s, std::vector<Run> runs, uint8_t* dst,
                        DType dtype) const {
    constexpr int64_t kPiece = int64_t{1} << 20;
    std::vector<Run> pieces;
    int64_t total = 0;
    for (const Run& r : runs) {
      total += r.count;
      for (int64_t off = 0; off < r.count; off += kPiece) {
        pieces.push_back({r.from + off, r.to + off, std::min(kPiece, r.count - off)});
      }
    }
    const size_t dst_size = DTypeSize(dtype);
    auto work = [&](std::atomic<size_t>* next) {
      for (size_t i; (i = next->fetch_add(1)) < pieces.size();) {
        const Run& p = pieces[i];
        Generate(s, p.from, p.count, dst + static_cast<size_t>(p.to) * dst_size, dtype);
      }
    };
    std::atomic<size_t> next{0};
    const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()),
                                            static_cast<size_t>(total / kPiece));
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work, &next);
    work(&next);
    for (auto& h : helpers) h.join();
  }

  // Elements [first, first + count) of the full row-major tensor `s`, stored as `dtype`.
  // Values are first rounded to the spec's dtype, as a checkpoint in that dtype would be.
  void Generate(const WeightSpec& s, int64_t first, int64_t count, uint8_t* dst,
                DType dtype) const {
    constexpr int64_t kBlock = 4096;
    alignas(8) float values[kBlock];
    alignas(8) uint8_t rounded[kBlock * 2];
    const uint64_t key = SplitMix64(seed_ ^ Fnv1a64(s.name));
    const size_t dst_size = DTypeSize(dtype);
    for (int64_t done = 0; done < count;) {
      const int64_t n = std::min(kBlock, count - done);
      Fill(s, key, first + done, n, values);
      // Storing to the spec's own dtype rounds once already.
      if ((s.dtype == DType::kBF16 || s.dtype == DType::kF16) && dtype != s.dtype) {
        ConvertFromFloat(values, rounded, s.dtype, static_cast<size_t>(n));
        ConvertToFloat(rounded, s.dtype, values, static_cast<size_t>(n));
      }
      StoreFloats(values, dst + static_cast<size_t>(done) * dst_size, dtype,
                  static_cast<size_t>(n));
      done += n;
    }
  }

  static void Fill(const WeightSpec& s, uint64_t key, int64_t first, int64_t n, float* out) {
    if (s.init != DummyInit::kNormal) {
      std::fill(out, out + n, s.init == DummyInit::kOnes ? 1.0f : 0.0f);
      return;
    }
    float z0, z1;
    for (int64_t i = first, end = first + n; i < end;) {
      NormalPair(key, static_cast<uint64_t>(i) >> 1, &z0, &z1);
      if ((i & 1) == 0) {
        out[i - first] = z0 * s.stddev;
        if (i + 1 < end) out[i + 1 - first] = z1 * s.stddev;
        i += 2;
      } else {
        out[i - first] = z1 * s.stddev;
        i += 1;
      }
    }
  }

  std::vector<WeightSpec> specs_;
  uint64_t seed_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace

std::unique_ptr<WeightSource> MakeDummyWeights(std::vector<WeightSpec> specs, uint64_t seed) {
  return std::make_unique<DummyWeights>(std::move(specs), seed);
}

double WeightBytes(const std::vector<WeightSpec>& specs, size_t bytes_per_element,
                   bool at_most_spec_dtype) {
  double total = 0;
  for (const WeightSpec& s : specs) {
    double n = 1;
    for (int64_t d : s.shape) n *= static_cast<double>(d);
    const size_t per =
        at_most_spec_dtype ? std::min(bytes_per_element, DTypeSize(s.dtype)) : bytes_per_element;
    total += n * static_cast<double>(per);
  }
  return total;
}

Status CheckHostMemoryForWeights(double bytes, const std::string& what) {
  const std::optional<double> avail_gib = AvailableHostMemoryGiB();
  const double gib = bytes / (1024.0 * 1024.0 * 1024.0);
  if (!avail_gib || gib <= *avail_gib) return Status::Ok();
  char msg[400];
  std::snprintf(msg, sizeof msg,
                "%s need %.2f GiB of host memory, more than the %.2f GiB this machine has "
                "available now (MemAvailable and the memory cgroup): use a smaller model (or "
                "config.json for --load-format dummy) or a machine with more memory",
                what.c_str(), gib, *avail_gib);
  return ResourceExhausted(msg);
}

}  // namespace oasis
