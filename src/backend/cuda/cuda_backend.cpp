#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/tuning.h"
#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_linear.h"
#include "kernels/gemv.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace oasis {
namespace {

using bf16 = __nv_bfloat16;

void CheckDevice(const Tensor& t, DType dtype, const char* what) {
  OASIS_CHECK(t.device() == Device::kCuda && t.dtype() == dtype)
      << what << ": expected a device " << DTypeName(dtype) << " tensor, got " << t.ToString()
      << (t.device() == Device::kCpu ? " on the host" : "");
}

template <typename T = bf16>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// A device KV pool: bf16, or FP8 (e4m3) with its per-KV-head F32 scales and maxima on the
// device (backend.h, LayerKvPool). Returns whether it is FP8.
bool CheckKvPool(const LayerKvPool& pool, int64_t num_kv_heads, const char* what) {
  const bool fp8 = pool.fp8();
  OASIS_CHECK(pool.k.device() == Device::kCuda && pool.v.device() == Device::kCuda &&
              pool.v.dtype() == pool.k.dtype() && (fp8 || pool.k.dtype() == DType::kBF16))
      << what << ": expected device BF16 or F8_E4M3 K/V pools of one dtype, got K "
      << pool.k.ToString() << ", V " << pool.v.ToString();
  if (fp8) {
    for (const Tensor* t : {&pool.k_scale, &pool.v_scale, &pool.k_amax, &pool.v_amax}) {
      OASIS_CHECK(t->defined() && t->device() == Device::kCuda && t->dtype() == DType::kF32 &&
                  t->numel() >= num_kv_heads)
          << what << ": an FP8 KV pool needs device F32 k_scale, v_scale, k_amax, v_amax of "
          << num_kv_heads << " KV heads, got " << (t->defined() ? t->ToString() : "none");
    }
  }
  return fp8;
}

// Device allocations whose last owner let go while their stream was capturing a graph. Inside
// a capture cudaFreeAsync may only free the graph's own allocations (anything else returns
// cudaErrorInvalidValue, which the next launch then reports), so these wait until the stream
// captures no more and are freed there, after everything enqueued before them.
struct DeferredFrees {
  std::mutex mu;
  std::vector<std::pair<void*, cudaStream_t>> list;
  std::atomic<size_t> size{0};  // list.size(), read without the lock (Empty's fast path)
};
DeferredFrees& Deferred() {
  static DeferredFrees d;
  return d;
}

bool Capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

void FreeDeviceAsync(void* p, cudaStream_t s) {
  if (Capturing(s)) {
    std::lock_guard<std::mutex> lock(Deferred().mu);
    Deferred().list.emplace_back(p, s);
    Deferred().size.store(Deferred().list.size(), std::memory_order_release);
    return;
  }
  const cudaError_t err = cudaFreeAsync(p, s);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not the next launch's error
    spdlog::error("cudaFreeAsync: {}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

#define OASIS_CUBLAS_CHECK(expr)                                       \
  do {                                                                 \
    cublasStatus_t oasis_cublas_st_ = (expr);                          \
    OASIS_CHECK(oasis_cublas_st_ == CUBLAS_STATUS_SUCCESS)             \
        << #expr << " -> " << cublasGetStatusString(oasis_cublas_st_); \
  } while (0)

}  // namespace

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create() {
  if (cuda::DeviceCount() == 0) return Unavailable("no CUDA device is present");
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  if (cublasCreate(&b->cublas_) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate failed");
  OASIS_CUBLAS_CHECK(cublasSetStream(b->cublas_, b->stream()));
  OASIS_CUBLAS_CHECK(cublasSetMathMode(b->cublas_, CUBLAS_DEFAULT_MATH));
  OASIS_ASSIGN_OR_RETURN(b->cublas_workspace_, cuda::DeviceBuffer::Allocate(size_t{32} << 20));
  b->fp8_linear_ = std::make_unique<CudaFp8Linear>();
  OASIS_CUBLAS_CHECK(
      cublasSetWorkspace(b->cublas_, b->cublas_workspace_.data(), b->cublas_workspace_.size()));
  const size_t counter_bytes = sizeof(int) * kernels::kGemvQkvMaxHeads;
  OASIS_ASSIGN_OR_RETURN(b->qkv_counters_, cuda::DeviceBuffer::Allocate(counter_bytes));
  OASIS_CUDA_CHECK(cudaMemsetAsync(b->qkv_counters_.data(), 0, counter_bytes, b->stream()));
  return b;
}

void CudaBackend::UseStream(cudaStream_t s) {
  override_ = s;
  OASIS_CUBLAS_CHECK(cublasSetStream(cublas_, stream()));
}

void CudaBackend::BeginBackground() {
  OASIS_CHECK(override_ == nullptr && arena_base_ == nullptr)
      << "background copies start from the backend's own stream, outside captures";
  if (!background_) background_ = std::make_unique<Background>();
  Background& bg = *background_;
  OASIS_CHECK(!bg.active) << "background batches do not nest";
  if (bg.untimed) {  // the previous batch: done (normally long since), its uploads free again
    bg.done.Synchronize();
    bg.seconds += bg.done.ElapsedMsSince(bg.start) / 1e3;
    bg.untimed = false;
  }
  bg.uploads_used = 0;
  bg.main_ready.Record(stream_.get());
  bg.stream.Wait(bg.main_ready.get());
  bg.start.Record(bg.stream.get());
  bg.active = true;
  UseStream(bg.stream.get());
}

void CudaBackend::EndBackground() {
  OASIS_CHECK(background_ && background_->active) << "EndBackground without BeginBackground";
  Background& bg = *background_;
  bg.done.Record(bg.stream.get());
  bg.active = false;
  bg.unjoined = bg.untimed = true;
  UseStream(nullptr);
}

void CudaBackend::JoinBackground() {
  if (!background_ || !background_->unjoined) return;
  OASIS_CHECK(!background_->active) << "JoinBackground inside a background batch";
  stream_.Wait(background_->done.get());
  background_->unjoined = false;
}

double CudaBackend::TakeBackgroundSeconds() {
  if (!background_) return 0.0;
  Background& bg = *background_;
  if (bg.untimed && !bg.active && cudaEventQuery(bg.done.get()) == cudaSuccess) {
    bg.seconds += bg.done.ElapsedMsSince(bg.start) / 1e3;
    bg.untimed = false;
  }
  return std::exchange(bg.seconds, 0.0);
}

void CudaBackend::BackgroundUpload(Tensor& dst, const Tensor& host) {
  Background& bg = *background_;
  const size_t bytes = host.nbytes();
  const size_t off = (bg.uploads_used + 255) / 256 * 256;
  if (off + bytes > bg.uploads.size()) {
    // Grow: every upload of this batch so far must have left the old buffer first.
    bg.stream.Synchronize();
    auto buf = cuda::PinnedBuffer::Allocate(std::max<size_t>(2 * (off + bytes), size_t{1} << 20));
    OASIS_CHECK(buf.ok()) << "pinned background uploads: " << buf.status().ToString();
    bg.uploads = std::move(*buf);
    bg.uploads_used = 0;
    BackgroundUpload(dst, host);
    return;
  }
  char* p = static_cast<char*>(bg.uploads.data()) + off;
  std::memcpy(p, host.raw(), bytes);
  OASIS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), p, bytes, cudaMemcpyHostToDevice, stream()));
  bg.uploads_used = off + bytes;
}

CudaBackend::~CudaBackend() {
  if (background_) background_->stream.Synchronize();
  inv_freq_.clear();
  stream_.Synchronize();
  fp8_linear_.reset();
  if (cublas_) cublasDestroy(cublas_);
}

void CudaBackend::BeginArena(void* base, size_t bytes) {
  OASIS_CHECK(arena_base_ == nullptr) << "arenas do not nest";
  OASIS_CHECK(base != nullptr) << "null arena";
  arena_base_ = static_cast<char*>(base);
  arena_size_ = bytes;
  arena_used_ = 0;
}

size_t CudaBackend::EndArena() {
  OASIS_CHECK(arena_base_ != nullptr) << "EndArena without BeginArena";
  arena_base_ = nullptr;
  return arena_used_;
}

Tensor CudaBackend::Empty(std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = std::max<size_t>(static_cast<size_t>(n) * DTypeSize(dtype), 16);
  if (arena_base_ != nullptr) {
    const size_t offset = (arena_used_ + 255) / 256 * 256;
    OASIS_CHECK_LE(offset + bytes, arena_size_) << "activation arena too small";
    arena_used_ = offset + bytes;
    return Tensor(arena_base_ + offset, dtype, std::move(shape), Device::kCuda);
  }
  void* p = nullptr;
  cudaStream_t s = stream();
  FreeDeferred();
  OASIS_CUDA_CHECK(cudaMallocAsync(&p, bytes, s));
  std::shared_ptr<void> owner(p, [s](void* q) { FreeDeviceAsync(q, s); });
  return Tensor(p, dtype, std::move(shape), Device::kCuda, std::move(owner));
}

void CudaBackend::FreeDeferred() {
  if (Deferred().size.load(std::memory_order_acquire) == 0) return;  // the common case: no lock
  std::vector<std::pair<void*, cudaStream_t>> ready;
  {
    std::lock_guard<std::mutex> lock(Deferred().mu);
    auto& list = Deferred().list;
    for (size_t i = 0; i < list.size();) {
      if (Capturing(list[i].second)) {
        ++i;
      } else {
        ready.push_back(list[i]);
        list[i] = list.back();
        list.pop_back();
      }
    }
    Deferred().size.store(list.size(), std::memory_order_release);
  }
  for (const auto& [p, s] : ready) FreeDeviceAsync(p, s);
}

Tensor CudaBackend::Upload(const Tensor& host) {
  OASIS_CHECK(host.device() == Device::kCpu) << "Upload of a device tensor";
  Tensor t = Empty(host.shape(), host.dtype());
  UploadBytes(t, 0, host.raw(), host.nbytes());
  return t;
}

void CudaBackend::UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) {
  OASIS_CHECK(dst.device() == Device::kCuda) << "UploadBytes into a host tensor";
  OASIS_CHECK_LE(offset + bytes, dst.nbytes()) << "UploadBytes past the end of " << dst.ToString();
  char* out = static_cast<char*>(dst.raw()) + offset;
  constexpr size_t kChunk = size_t{32} << 20;
  if (bytes < (size_t{1} << 20)) {
    OASIS_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyHostToDevice, stream()));
  } else {
    for (int i = 0; i < 2 && staging_[i].size() == 0; ++i) {
      auto buf = cuda::PinnedBuffer::Allocate(kChunk);
      OASIS_CHECK(buf.ok()) << "pinned staging buffer: " << buf.status().ToString();
      staging_[i] = std::move(*buf);
    }
    const char* in = static_cast<const char*>(src);
    int i = 0;
    for (size_t off = 0; off < bytes; off += kChunk, i ^= 1) {
      const size_t len = std::min(kChunk, bytes - off);
      staging_free_[i].Synchronize();  // the DMA out of this buffer has finished
      std::memcpy(staging_[i].data(), in + off, len);
      OASIS_CUDA_CHECK(
          cudaMemcpyAsync(out + off, staging_[i].data(), len, cudaMemcpyHostToDevice, stream()));
      staging_free_[i].Record(stream());
    }
  }
  // The caller may reuse or free `src` as soon as we return (the copies ran on stream()).
  OASIS_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

Tensor CudaBackend::UploadAsync(const Tensor& host) {
  OASIS_CHECK(host.device() == Device::kCpu) << "UploadAsync of a device tensor";
  Tensor t = Empty(host.shape(), host.dtype());
  UploadAsyncInto(t, host);
  return t;
}

void CudaBackend::UploadAsyncInto(Tensor& dst, const Tensor& host) {
  OASIS_CHECK(host.device() == Device::kCpu) << "UploadAsyncInto from a device tensor";
  OASIS_CHECK(dst.device() == Device::kCuda) << "UploadAsyncInto a host tensor";
  constexpr size_t kHalf = size_t{2} << 20;
  const size_t bytes = host.nbytes();
  OASIS_CHECK_LE(bytes, dst.nbytes())
      << "UploadAsyncInto " << dst.ToString() << " from " << host.ToString();
  if (bytes == 0) return;
  if (background_ && background_->active) {
    BackgroundUpload(dst, host);
    return;
  }
  if (bytes > kHalf || override_ != nullptr ||
      arena_base_ != nullptr) {  // (an arena: inside a capture)
    UploadBytes(dst, 0, host.raw(), bytes);
    return;
  }
  if (async_staging_.size() == 0) {
    auto buf = cuda::PinnedBuffer::Allocate(2 * kHalf);
    OASIS_CHECK(buf.ok()) << "pinned upload ring: " << buf.status().ToString();
    async_staging_ = std::move(*buf);
  }
  size_t off = (async_used_ + 255) / 256 * 256;
  if (off + bytes > kHalf) {  // leave this half, take the other once its DMAs are done
    async_free_[async_half_].Record(stream());
    async_half_ ^= 1;
    async_free_[async_half_].Synchronize();
    off = 0;
  }
  char* p =
      static_cast<char*>(async_staging_.data()) + static_cast<size_t>(async_half_) * kHalf + off;
  std::memcpy(p, host.raw(), bytes);
  OASIS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), p, bytes, cudaMemcpyHostToDevice, stream()));
  async_used_ = off + bytes;
}

Tensor CudaBackend::Download(const Tensor& t) {
  OASIS_CHECK(t.device() == Device::kCuda) << "Download of a host tensor";
  Tensor host = Tensor::Empty(t.shape(), t.dtype());
  OASIS_CUDA_CHECK(
      cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream()));
  stream_.Synchronize();
  return host;
}

void CudaBackend::FillNormal(Tensor& t, uint64_t seed, float stddev) {
  OASIS_CHECK(t.device() == Device::kCuda) << "FillNormal of a host tensor";
  if (t.dtype() == DType::kF32) {
    OASIS_CUDA_CHECK(
        kernels::LaunchFillNormalF32(Ptr<float>(t), t.numel(), seed, stddev, stream()));
  } else if (t.dtype() == DType::kF8E4M3) {
    OASIS_CUDA_CHECK(
        kernels::LaunchFillNormalFp8(Ptr<uint8_t>(t), t.numel(), seed, stddev, stream()));
  } else {
    CheckDevice(t, DType::kBF16, "FillNormal");
    OASIS_CUDA_CHECK(kernels::LaunchFillNormal(Ptr(t), t.numel(), seed, stddev, stream()));
  }
}

void CudaBackend::Fill(Tensor& t, float value) {
  OASIS_CHECK(t.device() == Device::kCuda) << "Fill of a host tensor";
  if (t.dtype() == DType::kF32) {
    OASIS_CUDA_CHECK(kernels::LaunchFillF32(Ptr<float>(t), t.numel(), value, stream()));
  } else {
    CheckDevice(t, DType::kBF16, "Fill");
    OASIS_CUDA_CHECK(kernels::LaunchFill(Ptr(t), t.numel(), value, stream()));
  }
}

void CudaBackend::Embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  CheckDevice(ids, DType::kI32, "Embedding ids");
  CheckDevice(table, DType::kBF16, "Embedding table");
  OASIS_CUDA_CHECK(kernels::LaunchEmbedding(Ptr<int32_t>(ids), Ptr(table), Ptr(out), ids.numel(),
                                            table.dim(1), stream()));
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  CheckDevice(x, DType::kBF16, "RmsNorm x");
  const int64_t n = x.dim(-1);
  OASIS_CUDA_CHECK(kernels::LaunchRmsNorm(Ptr(x), nullptr, Ptr(weight), Ptr(out), x.numel() / n, n,
                                          eps, stream()));
}

void CudaBackend::AddRmsNorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                             Tensor& out) {
  CheckDevice(x, DType::kBF16, "AddRmsNorm x");
  CheckDevice(residual, DType::kBF16, "AddRmsNorm residual");
  const int64_t n = x.dim(-1);
  OASIS_CUDA_CHECK(kernels::LaunchRmsNorm(Ptr(x), Ptr(residual), Ptr(weight), Ptr(out),
                                          x.numel() / n, n, eps, stream()));
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor& out) {
  CheckDevice(a, DType::kBF16, "Add a");
  OASIS_CUDA_CHECK(kernels::LaunchAdd(Ptr(a), Ptr(b), Ptr(out), a.numel(), stream()));
}

void CudaBackend::Linear(const Tensor& x, const Tensor& weight, Tensor& out) {
  CheckDevice(x, DType::kBF16, "Linear x");
  if (weight.dtype() == DType::kF8E4M3) {  // an FP8 checkpoint's weight (checks its scales)
    fp8_linear_->Linear(x, weight, out, stream());
    return;
  }
  CheckDevice(weight, DType::kBF16, "Linear weight");
  const int64_t in = weight.dim(1), outf = weight.dim(0), rows = x.numel() / in;
  OASIS_CHECK_EQ(x.dim(-1), in) << "Linear: x " << x.ToString() << " weight " << weight.ToString();
  OASIS_CHECK_EQ(out.numel(), rows * outf) << "Linear out";
  if (rows == 0) return;
  const cudaDataType_t out_type = out.dtype() == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  OASIS_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) << "Linear out dtype";
  if (kernels::GemvSupported(rows, in, x.raw(), weight.raw())) {  // decode: bandwidth-bound
    const bool f32 = out.dtype() == DType::kF32;
    OASIS_CUDA_CHECK(kernels::LaunchGemv(Ptr(x), Ptr(weight), f32 ? nullptr : Ptr(out),
                                         f32 ? Ptr<float>(out) : nullptr, rows, in, outf,
                                         stream()));
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out[rows, outf] = x · Wᵀ is column-major outᵀ = W(ᵀ as stored) · xᵀ.
  OASIS_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(outf),
                                  static_cast<int>(rows), static_cast<int>(in), &alpha,
                                  weight.raw(), CUDA_R_16BF, static_cast<int>(in), x.raw(),
                                  CUDA_R_16BF, static_cast<int>(in), &beta, out.raw(), out_type,
                                  static_cast<int>(outf), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool CudaBackend::NormGemvFusable(const Tensor* x, const Tensor& residual,
                                  const Tensor* residual_out, const Tensor& norm_weight,
                                  const Tensor& weight) const {
  const int64_t in = weight.dim(1), rows = residual.numel() / in;
  const auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
  };
  return residual.dtype() == DType::kBF16 && weight.dtype() == DType::kBF16 &&
         norm_weight.dtype() == DType::kBF16 && residual.dim(-1) == in && rows > 0 &&
         kernels::GemvNormSupported(rows, in, residual.raw(), weight.raw()) &&
         (x == nullptr || (x->dtype() == DType::kBF16 && aligned(*x))) &&
         (residual_out == nullptr || aligned(*residual_out)) && aligned(norm_weight);
}

void CudaBackend::AddRmsNormLinear(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                                   const Tensor& norm_weight, float eps, const Tensor& weight,
                                   Tensor& out) {
  const int64_t in = weight.dim(1), outf = weight.dim(0), rows = residual.numel() / in;
  if (!NormGemvFusable(x, residual, residual_out, norm_weight, weight) ||
      (out.dtype() != DType::kBF16 && out.dtype() != DType::kF32)) {
    if (x != nullptr && residual_out != nullptr && x->dtype() == DType::kBF16 &&
        residual.dtype() == DType::kBF16 && residual_out->dtype() == DType::kBF16 &&
        norm_weight.dtype() == DType::kBF16 && residual_out->raw() != residual.raw() &&
        residual_out->raw() != x->raw()) {
      // More rows than the GEMV takes: the add and the norm in one kernel, then the GEMM.
      OASIS_CHECK_EQ(x->numel(), residual.numel()) << "AddRmsNormLinear x";
      OASIS_CHECK_EQ(residual_out->numel(), residual.numel()) << "AddRmsNormLinear residual_out";
      Tensor normed = Empty(residual.shape(), DType::kBF16);
      OASIS_CUDA_CHECK(kernels::LaunchAddRmsNorm(Ptr(*x), Ptr(residual), Ptr(*residual_out),
                                                 Ptr(norm_weight), Ptr(normed), rows, in, eps,
                                                 stream()));
      Linear(normed, weight, out);
      return;
    }
    Backend::AddRmsNormLinear(x, residual, residual_out, norm_weight, eps, weight, out);
    return;
  }
  OASIS_CHECK((x == nullptr) == (residual_out == nullptr))
      << "AddRmsNormLinear: residual_out goes with x";
  OASIS_CHECK(residual_out == nullptr || residual_out->raw() != residual.raw())
      << "AddRmsNormLinear: aliasing";
  OASIS_CHECK_EQ(out.numel(), rows * outf) << "AddRmsNormLinear out";
  CheckDevice(weight, DType::kBF16, "AddRmsNormLinear weight (fused GEMV)");
  const bool f32 = out.dtype() == DType::kF32;
  OASIS_CUDA_CHECK(kernels::LaunchGemvRmsNorm(
      x ? Ptr(*x) : nullptr, Ptr(residual), residual_out ? Ptr(*residual_out) : nullptr,
      Ptr(norm_weight), eps, Ptr(weight), f32 ? nullptr : Ptr(out), f32 ? Ptr<float>(out) : nullptr,
      rows, in, outf, stream()));
}

void CudaBackend::AddRmsNormGateUpSilu(const Tensor* x, const Tensor& residual,
                                       Tensor* residual_out, const Tensor& norm_weight, float eps,
                                       const Tensor& gate_up_weight, Tensor& out) {
  const int64_t in = gate_up_weight.dim(1), inter = gate_up_weight.dim(0) / 2,
                rows = residual.numel() / in;
  if (!GetTuning().fuse_silu ||
      !NormGemvFusable(x, residual, residual_out, norm_weight, gate_up_weight) ||
      out.dtype() != DType::kBF16 || gate_up_weight.dim(0) % 2 != 0) {
    Backend::AddRmsNormGateUpSilu(x, residual, residual_out, norm_weight, eps, gate_up_weight, out);
    return;
  }
  OASIS_CHECK((x == nullptr) == (residual_out == nullptr))
      << "AddRmsNormGateUpSilu: residual_out goes with x";
  OASIS_CHECK(residual_out == nullptr || residual_out->raw() != residual.raw())
      << "AddRmsNormGateUpSilu: aliasing";
  OASIS_CHECK_EQ(out.numel(), rows * inter) << "AddRmsNormGateUpSilu out";
  CheckDevice(gate_up_weight, DType::kBF16, "AddRmsNormGateUpSilu weight (fused GEMV)");
  OASIS_CUDA_CHECK(kernels::LaunchGemvRmsNormSiluMul(
      x ? Ptr(*x) : nullptr, Ptr(residual), residual_out ? Ptr(*residual_out) : nullptr,
      Ptr(norm_weight), eps, Ptr(gate_up_weight), Ptr(out), rows, in, inter, stream()));
}

void CudaBackend::AddRmsNormQkvRopeAppend(const Tensor* x, const Tensor& residual,
                                          Tensor* residual_out, const Tensor& norm_weight,
                                          float eps, const Tensor& qkv_weight, Tensor& qkv,
                                          Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                                          const Tensor& positions, const RopeParams& rope,
                                          const Tensor& slot_mapping, LayerKvPool& pool) {
  const int64_t in = qkv_weight.dim(1), rows = residual.numel() / in;
  const int heads = static_cast<int>(qkv_weight.dim(0) / q.dim(2));
  if (!GetTuning().fuse_qkv ||
      !NormGemvFusable(x, residual, residual_out, norm_weight, qkv_weight) ||
      qkv.dtype() != DType::kBF16 ||
      !kernels::GemvQkvRopeSupported(rows, in, heads, static_cast<int>(q.dim(2)), residual.raw(),
                                     qkv_weight.raw())) {
    Backend::AddRmsNormQkvRopeAppend(x, residual, residual_out, norm_weight, eps, qkv_weight, qkv,
                                     q, q_norm, k_norm, positions, rope, slot_mapping, pool);
    return;
  }
  OASIS_CHECK((x == nullptr) == (residual_out == nullptr))
      << "AddRmsNormQkvRopeAppend: residual_out goes with x";
  OASIS_CHECK(residual_out == nullptr || residual_out->raw() != residual.raw())
      << "AddRmsNormQkvRopeAppend: aliasing";
  OASIS_CHECK_EQ(qkv.numel(), rows * qkv_weight.dim(0)) << "AddRmsNormQkvRopeAppend qkv";
  CheckDevice(qkv_weight, DType::kBF16, "AddRmsNormQkvRopeAppend weight (fused GEMV)");
  const kernels::QkvRopeAppendParams p =
      QkvParams(qkv, q, q_norm, k_norm, eps, positions, rope, slot_mapping, pool);
  OASIS_CHECK_EQ(p.tokens, rows) << "AddRmsNormQkvRopeAppend rows";
  OASIS_CUDA_CHECK(kernels::LaunchGemvRmsNormQkvRope(
      x ? Ptr(*x) : nullptr, Ptr(residual), residual_out ? Ptr(*residual_out) : nullptr,
      Ptr(norm_weight), eps, Ptr(qkv_weight), in, p, static_cast<int*>(qkv_counters_.data()),
      stream()));
}

void CudaBackend::PrepareRope(const RopeParams& rope) {
  if (inv_freq_.count(rope.inv_freq) != 0) return;
  // Never inside a capture (the synchronous upload would break it) and never in an activation
  // arena: the table outlives the step, and the arena is every decode graph's scratch. Made
  // there by a graph's first step, the next graph overwrote it: every later step computed
  // RoPE from garbage (found as k >= 2 speculation accepting 0.09 of drafts after a short
  // first request ran as a decode graph; tests/unit/server/test_cuda_server_speculate.cpp).
  OASIS_CHECK(!Capturing(stream()))
      << "RoPE table first needed inside a graph capture: models prepare it as they load";
  char* arena = std::exchange(arena_base_, nullptr);
  Tensor host = Tensor::FromFloats(rope.inv_freq, {static_cast<int64_t>(rope.inv_freq.size())});
  Tensor device = Upload(host);
  arena_base_ = arena;
  inv_freq_.emplace(rope.inv_freq, std::move(device));
}

const float* CudaBackend::DeviceInvFreq(const RopeParams& rope) {
  auto it = inv_freq_.find(rope.inv_freq);
  if (it == inv_freq_.end()) {
    PrepareRope(rope);  // (a table a caller did not prepare: made outside the arena all the same)
    it = inv_freq_.find(rope.inv_freq);
  }
  return Ptr<float>(it->second);
}

void CudaBackend::QkNormRope(Tensor& q, Tensor& k, const Tensor* q_norm, const Tensor* k_norm,
                             float eps, const Tensor& positions, const RopeParams& rope) {
  CheckDevice(q, DType::kBF16, "QkNormRope q");
  CheckDevice(positions, DType::kI32, "QkNormRope positions");
  kernels::QkNormRopeParams p;
  p.q = Ptr(q);
  p.k = Ptr(k);
  p.q_norm = q_norm ? Ptr(*q_norm) : nullptr;
  p.k_norm = k_norm ? Ptr(*k_norm) : nullptr;
  p.positions = Ptr<int32_t>(positions);
  p.inv_freq = DeviceInvFreq(rope);
  p.attention_scaling = rope.attention_scaling;
  p.eps = eps;
  p.tokens = q.dim(0);
  p.num_q_heads = static_cast<int>(q.dim(1));
  p.num_kv_heads = static_cast<int>(k.dim(1));
  p.head_dim = static_cast<int>(q.dim(2));
  OASIS_CUDA_CHECK(kernels::LaunchQkNormRope(p, stream()));
}

void CudaBackend::SiluMul(const Tensor& gate_up, Tensor& out) {
  CheckDevice(gate_up, DType::kBF16, "SiluMul gate_up");
  const int64_t inter = out.dim(-1);
  OASIS_CUDA_CHECK(
      kernels::LaunchSiluMul(Ptr(gate_up), Ptr(out), out.numel() / inter, inter, stream()));
}

void CudaBackend::KvAppend(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                           LayerKvPool& pool) {
  CheckDevice(k, DType::kBF16, "KvAppend k");
  CheckDevice(slot_mapping, DType::kI64, "KvAppend slot_mapping");
  if (CheckKvPool(pool, k.dim(1), "KvAppend")) {
    OASIS_CUDA_CHECK(kernels::LaunchKvAppendFp8(
        Ptr(k), Ptr(v), Ptr<int64_t>(slot_mapping), Ptr<uint8_t>(pool.k), Ptr<uint8_t>(pool.v),
        Ptr<float>(pool.k_scale), Ptr<float>(pool.v_scale), Ptr<float>(pool.k_amax),
        Ptr<float>(pool.v_amax), k.dim(0), static_cast<int>(k.dim(1)), static_cast<int>(k.dim(2)),
        stream()));
    return;
  }
  OASIS_CUDA_CHECK(kernels::LaunchKvAppend(Ptr(k), Ptr(v), Ptr<int64_t>(slot_mapping), Ptr(pool.k),
                                           Ptr(pool.v), k.dim(0), static_cast<int>(k.dim(1)),
                                           static_cast<int>(k.dim(2)), stream()));
}

namespace {

// Longest query run per sequence given to the split-K decode kernel at head_dim 64 / 128;
// longer ones (prefill chunks) go to the tensor-core prefill kernel.
constexpr int kDecodeKernelQueryLen = 8;

// The fields the three attention kernels' parameter structs share (same names in each).
template <typename Params>
Params AttentionParams(const Tensor& q, const LayerKvPool& pool, const AttentionMetadata& meta,
                       float scale, Tensor& out) {
  Params p;
  p.q = Ptr(q);
  p.k_pool = Ptr(pool.k);
  p.v_pool = Ptr(pool.v);
  p.query_start = Ptr<int32_t>(meta.query_start);
  p.kv_lens = Ptr<int32_t>(meta.kv_lens);
  p.block_tables = Ptr<int32_t>(meta.block_tables);
  p.out = Ptr(out);
  p.tokens = q.dim(0);
  p.num_seqs = static_cast<int>(meta.query_start.numel() - 1);
  p.num_q_heads = static_cast<int>(q.dim(1));
  p.num_kv_heads = static_cast<int>(meta.kv_lens.dim(1));
  p.head_dim = static_cast<int>(q.dim(2));
  p.max_blocks = static_cast<int>(meta.block_tables.dim(2));
  p.scale = scale;
  if (pool.fp8()) {  // checked by the caller (CheckKvPool)
    p.k_pool = p.v_pool = nullptr;
    p.kv_dtype = kernels::KvDtype::kFp8E4M3;
    p.k_pool_fp8 = Ptr<uint8_t>(pool.k);
    p.v_pool_fp8 = Ptr<uint8_t>(pool.v);
    p.k_scale = Ptr<float>(pool.k_scale);
    p.v_scale = Ptr<float>(pool.v_scale);
  }
  return p;
}

// The decode kernel's params: the shared fields, the host-known bounds and after_append.
kernels::DecodeAttentionParams DecodeParams(const Tensor& q, const LayerKvPool& pool,
                                            const AttentionMetadata& meta, float scale,
                                            Tensor& out) {
  auto p = AttentionParams<kernels::DecodeAttentionParams>(q, pool, meta, scale, out);
  p.max_query_len = meta.max_query_len;
  p.max_kv_len = meta.max_kv_len;
  p.after_append = meta.after_append;
  return p;
}

}  // namespace

void CudaBackend::Attention(const Tensor& q, const LayerKvPool& pool, const AttentionMetadata& meta,
                            float scale, Tensor& out) {
  CheckDevice(q, DType::kBF16, "Attention q");
  CheckDevice(meta.block_tables, DType::kI32, "Attention block_tables");
  const bool fp8 = CheckKvPool(pool, meta.kv_lens.dim(1), "Attention");
  const int head_dim = static_cast<int>(q.dim(2));
  OASIS_CHECK(!fp8 || head_dim <= 256)
      << "Attention: FP8 KV pools are read for head_dim <= 256, got " << head_dim;
  // The decode kernel reads each K/V byte once per GQA group and query chunk, so it wins while
  // the query tokens are few: up to kDecodeKernelQueryLen (speculation chains of up to 4 drafts
  // verify 5; bench_decode_attention times both kernels at 4, 5 and 8), and at head_dim 256 up
  // to its limit (the prefill kernel does not take 256; the reference kernel would run).
  const int decode_bound = head_dim == 256 ? kernels::kDecodeMaxQueryLen : kDecodeKernelQueryLen;
  const bool decode_kernel = meta.max_query_len >= 1 && meta.max_query_len <= decode_bound &&
                             (head_dim == 64 || head_dim == 128 || head_dim == 256);
  if (decode_kernel) {  // split-K flash decoding, K/V read once per GQA group
    const kernels::DecodeAttentionParams p = DecodeParams(q, pool, meta, scale, out);
    const size_t bytes = kernels::DecodeAttentionWorkspaceBytes(p);
    Tensor workspace = bytes ? Empty({static_cast<int64_t>(bytes)}, DType::kU8) : Tensor();
    OASIS_CUDA_CHECK(kernels::LaunchDecodeAttention(p, workspace.raw(), bytes, stream()));
  } else if (kernels::PrefillAttentionSupportsHeadDim(head_dim)) {  // tensor-core flash attention
    auto p = AttentionParams<kernels::PrefillAttentionParams>(q, pool, meta, scale, out);
    p.max_query_len = meta.max_query_len;
    // FP8 pools: kAuto takes the wgmma kernel's FP8 variant on CC 9.0; OASIS_FP8_PREFILL=mma
    // asks for the mma.sync kernel (its tile as kAuto picks it elsewhere).
    if (pool.fp8() && !GetTuning().fp8_prefill_wgmma) {
      p.tile = meta.max_query_len > 0 && meta.max_query_len <= 64
                   ? kernels::PrefillTileConfig::kM64W4
               : head_dim == 128 ? kernels::PrefillTileConfig::kM128W8
                                 : kernels::PrefillTileConfig::kM128W4;
    }
    OASIS_CUDA_CHECK(kernels::LaunchPrefillAttention(p, stream()));
  } else {  // other head sizes: the reference-grade kernel
    auto p = AttentionParams<kernels::PagedAttentionParams>(q, pool, meta, scale, out);
    OASIS_CUDA_CHECK(kernels::LaunchPagedAttention(p, stream()));
  }
}

kernels::QkvRopeAppendParams CudaBackend::QkvParams(const Tensor& qkv, Tensor& q,
                                                    const Tensor* q_norm, const Tensor* k_norm,
                                                    float eps, const Tensor& positions,
                                                    const RopeParams& rope,
                                                    const Tensor& slot_mapping, LayerKvPool& pool) {
  CheckDevice(qkv, DType::kBF16, "QkvRopeAppend qkv");
  CheckDevice(slot_mapping, DType::kI64, "QkvRopeAppend slot_mapping");
  kernels::QkvRopeAppendParams p;
  p.qkv = Ptr(qkv);
  p.q = Ptr(q);
  p.slot_mapping = Ptr<int64_t>(slot_mapping);
  p.q_norm = q_norm ? Ptr(*q_norm) : nullptr;
  p.k_norm = k_norm ? Ptr(*k_norm) : nullptr;
  p.positions = Ptr<int32_t>(positions);
  p.inv_freq = DeviceInvFreq(rope);
  p.attention_scaling = rope.attention_scaling;
  p.eps = eps;
  p.tokens = q.dim(0);
  p.num_q_heads = static_cast<int>(q.dim(1));
  p.num_kv_heads = static_cast<int>(slot_mapping.dim(1));
  p.head_dim = static_cast<int>(q.dim(2));
  OASIS_CHECK_EQ(qkv.dim(1), (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim)
      << "QkvRopeAppend widths";
  if (CheckKvPool(pool, p.num_kv_heads, "QkvRopeAppend")) {
    p.kv_dtype = kernels::KvDtype::kFp8E4M3;
    p.k_pool_fp8 = Ptr<uint8_t>(pool.k);
    p.v_pool_fp8 = Ptr<uint8_t>(pool.v);
    p.k_scale = Ptr<float>(pool.k_scale);
    p.v_scale = Ptr<float>(pool.v_scale);
    p.k_amax = Ptr<float>(pool.k_amax);
    p.v_amax = Ptr<float>(pool.v_amax);
  } else {
    p.k_pool = Ptr(pool.k);
    p.v_pool = Ptr(pool.v);
  }
  return p;
}

void CudaBackend::QkvRopeAppend(const Tensor& qkv, Tensor& q, const Tensor* q_norm,
                                const Tensor* k_norm, float eps, const Tensor& positions,
                                const RopeParams& rope, const Tensor& slot_mapping,
                                LayerKvPool& pool) {
  const kernels::QkvRopeAppendParams p =
      QkvParams(qkv, q, q_norm, k_norm, eps, positions, rope, slot_mapping, pool);
  OASIS_CUDA_CHECK(kernels::LaunchQkvRopeAppend(p, stream()));
}

void CudaBackend::Copy(const Tensor& src, Tensor& dst) {
  OASIS_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() &&
              src.device() == Device::kCuda && dst.device() == Device::kCuda)
      << "Copy " << src.ToString() << " -> " << dst.ToString();
  OASIS_CUDA_CHECK(
      cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
}

void CudaBackend::SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  CheckDevice(qkv, DType::kBF16, "SplitQkv qkv");
  const int64_t tokens = qkv.dim(0);
  if (tokens == 0) return;
  OASIS_CUDA_CHECK(kernels::LaunchSplitQkv(Ptr(qkv), Ptr(q), Ptr(k), Ptr(v), tokens,
                                           q.numel() / tokens, k.numel() / tokens,
                                           v.numel() / tokens, stream()));
}

void CudaBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) {
  CheckDevice(rows, DType::kI32, "GatherRows rows");
  const int64_t row_bytes = static_cast<int64_t>(x.nbytes()) / x.dim(0);
  OASIS_CUDA_CHECK(kernels::LaunchGatherRows(x.raw(), Ptr<int32_t>(rows), out.raw(), rows.numel(),
                                             row_bytes, stream()));
}

void CudaBackend::ScatterRows(const Tensor& x, const Tensor& rows, Tensor& out) {
  CheckDevice(rows, DType::kI32, "ScatterRows rows");
  OASIS_CHECK_EQ(x.dim(0), rows.numel()) << "ScatterRows: one row index per row of x";
  const int64_t row_bytes = static_cast<int64_t>(out.nbytes()) / out.dim(0);
  OASIS_CHECK_EQ(static_cast<int64_t>(x.nbytes()), rows.numel() * row_bytes)
      << "ScatterRows row width";
  OASIS_CUDA_CHECK(kernels::LaunchScatterRows(x.raw(), Ptr<int32_t>(rows), out.raw(), rows.numel(),
                                              row_bytes, stream()));
}

}  // namespace oasis
