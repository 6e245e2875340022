// CudaBackend: the sparse-KV ops of backend.h on the GPU (kernels/sparse_kv.h). Integer outputs
// equal the CPU reference's bit for bit; ScoreBlocks sums in a different order (float).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "common/check.h"
#include "common/host_memory.h"
#include "common/status_error.h"
#include "common/tuning.h"
#include "kernels/sparse_kv.h"

namespace oasis {
namespace {

using bf16 = __nv_bfloat16;

template <typename T = bf16>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// A device tensor of `dtype` (state, tables, queries, summaries).
void CheckDev(const Tensor& t, DType dtype, const char* what) {
  OASIS_CHECK(t.device() == Device::kCuda && t.dtype() == dtype)
      << what << ": expected a device " << DTypeName(dtype) << " tensor, got " << t.ToString();
}

// A pool may live on the device or in mapped pinned host memory (EmptyHost); bf16 or FP8
// (e4m3: copies move its bytes, summaries read its stored values).
void CheckPool(const LayerKvPool& p, const char* what) {
  OASIS_CHECK((p.k.dtype() == DType::kBF16 || p.k.dtype() == DType::kF8E4M3) &&
              p.v.dtype() == p.k.dtype() && p.k.shape() == p.v.shape() && p.k.ndim() == 3 &&
              p.k.dim(1) == kBlockSize)
      << what << ": expected BF16 or F8_E4M3 pools [slots, " << kBlockSize << ", head_dim], got K "
      << p.k.ToString() << ", V " << p.v.ToString();
}

// Bytes of one token row of a pool (16-byte multiples: what the copy kernels move).
int RowBytes(const LayerKvPool& p, const char* what) {
  const int64_t bytes = p.k.dim(2) * static_cast<int64_t>(DTypeSize(p.k.dtype()));
  OASIS_CHECK(bytes % 16 == 0) << what << ": a token row of " << p.k.ToString() << " is " << bytes
                               << " bytes, not a multiple of 16";
  return static_cast<int>(bytes);
}

void CheckState(const Tensor& t, int64_t rows, int64_t heads, const char* what) {
  CheckDev(t, DType::kI32, what);
  OASIS_CHECK(t.ndim() == 3 && t.dim(0) == rows && t.dim(1) == heads)
      << what << " " << t.ToString() << ", expected [" << rows << ", " << heads << ", *]";
}

}  // namespace

namespace {

// Pinned, mapped host memory for the host KV store (tens of GiB), made faster than one
// cudaHostAlloc (which pinned ~1.6 GB/s on the H200 machine: 80 GiB took ~50 s of server
// start): an anonymous mapping asking for transparent huge pages, its pages faulted in by
// several threads, then registered (pinned and mapped) with cudaHostRegister. Used only where
// the device may read registered memory through its host address (UVA: the kernels get the
// host pointer); nullptr when anything fails (the caller falls back to cudaHostAlloc).
// OASIS_HOST_REGISTER=0 turns it off.
std::shared_ptr<void> RegisteredHostAlloc(size_t bytes) {
  if (!GetTuning().host_register) return nullptr;
  if (bytes < (size_t{64} << 20)) return nullptr;  // small buffers: cudaHostAlloc is fine
  int dev = 0, direct = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&direct, cudaDevAttrCanUseHostPointerForRegisteredMem, dev) !=
          cudaSuccess ||
      !direct) {
    (void)cudaGetLastError();
    return nullptr;
  }
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, len, MADV_HUGEPAGE);  // a hint: fewer, larger pages to fault in and pin
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  const size_t slice = (len / threads + kHuge - 1) / kHuge * kHuge;
  std::vector<std::thread> touch;
  for (unsigned t = 0; t < threads; ++t) {
    const size_t begin = std::min(len, t * slice), end = std::min(len, begin + slice);
    if (begin < end)
      touch.emplace_back([=] { std::memset(static_cast<char*>(p) + begin, 0, end - begin); });
  }
  for (std::thread& t : touch) t.join();
  if (cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    munmap(p, len);
    return nullptr;
  }
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, p, 0) != cudaSuccess || device != p) {
    (void)cudaGetLastError();
    cudaHostUnregister(p);
    munmap(p, len);
    return nullptr;
  }
  return std::shared_ptr<void>(p, [len](void* q) {
    cudaHostUnregister(q);
    munmap(q, len);
  });
}

}  // namespace

Tensor CudaBackend::EmptyHost(std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = std::max<size_t>(static_cast<size_t>(n) * DTypeSize(dtype), 16);
  // Touching pages beyond what the machine (or the memory cgroup) has left would end in the
  // OOM killer, not an error: refuse first.
  const double gib = static_cast<double>(bytes) / static_cast<double>(size_t{1} << 30);
  if (const std::optional<double> free =
          bytes >= (size_t{64} << 20) ? AvailableHostMemoryGiB() : std::nullopt;
      free && gib > 0.95 * *free) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "cannot pin %.1f GiB of host memory for the host KV store: %.1f GiB available: "
                  "lower --host-kv-gib",
                  gib, *free);
    throw StatusError(ResourceExhausted(text));
  }
  if (std::shared_ptr<void> owner = RegisteredHostAlloc(bytes)) {
    void* raw = owner.get();
    return Tensor(raw, dtype, std::move(shape), Device::kCpu, std::move(owner));
  }
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the device stays usable
    throw StatusError(
        ResourceExhausted("cannot pin " + std::to_string(bytes >> 20) +
                          " MiB of host memory for the host KV store (" + cudaGetErrorString(err) +
                          "): lower --host-kv-gib, or raise the locked-memory limit"));
  }
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor(p, dtype, std::move(shape), Device::kCpu, std::move(owner));
}

void CudaBackend::BlockSummaries(const LayerKvPool& pool, const Tensor& src_slots,
                                 const Tensor& num_tokens, const Tensor& dst_rows, Tensor& kmin,
                                 Tensor& kmax) {
  CheckPool(pool, "BlockSummaries pool");
  CheckDev(src_slots, DType::kI32, "BlockSummaries src_slots");
  CheckDev(num_tokens, DType::kI32, "BlockSummaries num_tokens");
  CheckDev(dst_rows, DType::kI32, "BlockSummaries dst_rows");
  // Summaries: BF16, or for an FP8 pool also F8E4M3 (the min/max of stored e4m3 values are e4m3
  // values: exact).
  const bool fp8_rows = kmin.dtype() == DType::kF8E4M3;
  OASIS_CHECK(!fp8_rows || pool.fp8())
      << "BlockSummaries: F8_E4M3 summaries are for FP8 pools only, the pool is "
      << pool.k.ToString() << " (use BF16 kmin/kmax)";
  CheckDev(kmin, fp8_rows ? DType::kF8E4M3 : DType::kBF16, "BlockSummaries kmin");
  CheckDev(kmax, kmin.dtype(), "BlockSummaries kmax (the dtype of kmin)");
  const int64_t n = src_slots.numel(), d = pool.k.dim(2);
  OASIS_CHECK(num_tokens.numel() == n && dst_rows.numel() == n)
      << "BlockSummaries: entry counts differ";
  OASIS_CHECK(kmin.ndim() == 2 && kmin.shape() == kmax.shape() && kmin.dim(1) == d)
      << "BlockSummaries kmin " << kmin.ToString() << " kmax " << kmax.ToString()
      << ", expected [rows, " << d << "]";
  if (fp8_rows) {  // the stored e4m3 bytes of the min/max
    OASIS_CUDA_CHECK(kernels::LaunchBlockSummariesFp8(
        Ptr<uint8_t>(pool.k), Ptr<int32_t>(src_slots), Ptr<int32_t>(num_tokens),
        Ptr<int32_t>(dst_rows), Ptr<uint8_t>(kmin), Ptr<uint8_t>(kmax), n, static_cast<int>(d),
        stream()));
    return;
  }
  if (pool.fp8()) {  // min/max of the stored e4m3 values (unscaled), exact in bf16
    OASIS_CUDA_CHECK(kernels::LaunchBlockSummariesFp8(
        Ptr<uint8_t>(pool.k), Ptr<int32_t>(src_slots), Ptr<int32_t>(num_tokens),
        Ptr<int32_t>(dst_rows), Ptr(kmin), Ptr(kmax), n, static_cast<int>(d), stream()));
    return;
  }
  OASIS_CUDA_CHECK(kernels::LaunchBlockSummaries(
      Ptr(pool.k), Ptr<int32_t>(src_slots), Ptr<int32_t>(num_tokens), Ptr<int32_t>(dst_rows),
      Ptr(kmin), Ptr(kmax), n, static_cast<int>(d), stream()));
}

void CudaBackend::ScoreBlocks(const Tensor& q, const Tensor& query_rows, const Tensor& num_blocks,
                              const Tensor& host_tables, const Tensor& kmin, const Tensor& kmax,
                              GroupReduce reduce, Tensor& scores) {
  CheckDev(q, DType::kBF16, "ScoreBlocks q");
  CheckDev(query_rows, DType::kI32, "ScoreBlocks query_rows");
  CheckDev(num_blocks, DType::kI32, "ScoreBlocks num_blocks");
  // Summaries: BF16, or F8E4M3 (FP8 pools' summaries, in stored units); kmax as kmin.
  OASIS_CHECK(kmin.dtype() == DType::kBF16 || kmin.dtype() == DType::kF8E4M3)
      << "ScoreBlocks kmin: expected BF16 or F8_E4M3 summaries, got " << kmin.ToString();
  const bool fp8_rows = kmin.dtype() == DType::kF8E4M3;
  CheckDev(kmin, kmin.dtype(), "ScoreBlocks kmin");
  CheckDev(kmax, kmin.dtype(), "ScoreBlocks kmax (the dtype of kmin)");
  CheckDev(scores, DType::kF32, "ScoreBlocks scores");
  const int64_t R = query_rows.numel();
  CheckState(host_tables, R, host_tables.dim(1), "ScoreBlocks host_tables");
  OASIS_CHECK(q.ndim() == 3 && scores.shape() == host_tables.shape() && num_blocks.numel() == R &&
              kmin.ndim() == 2 && kmin.dim(1) == q.dim(2) && kmax.shape() == kmin.shape())
      << "ScoreBlocks shapes: q " << q.ToString() << " tables " << host_tables.ToString()
      << " scores " << scores.ToString() << " kmin " << kmin.ToString() << " kmax "
      << kmax.ToString();
  kernels::ScoreBlocksParams p;
  p.q = Ptr(q);
  p.query_rows = Ptr<int32_t>(query_rows);
  p.num_blocks = Ptr<int32_t>(num_blocks);
  p.host_tables = Ptr<int32_t>(host_tables);
  if (fp8_rows) {
    p.kmin_fp8 = Ptr<uint8_t>(kmin);
    p.kmax_fp8 = Ptr<uint8_t>(kmax);
  } else {
    p.kmin = Ptr(kmin);
    p.kmax = Ptr(kmax);
  }
  p.scores = Ptr<float>(scores);
  p.rows = static_cast<int>(R);
  p.num_q_heads = static_cast<int>(q.dim(1));
  p.num_kv_heads = static_cast<int>(host_tables.dim(1));
  p.head_dim = static_cast<int>(q.dim(2));
  p.max_blocks = static_cast<int>(host_tables.dim(2));
  p.reduce_max = reduce == GroupReduce::kMax;
  OASIS_CHECK(p.num_q_heads % p.num_kv_heads == 0 &&
              kernels::ScoreBlocksSupported(p.head_dim, p.num_q_heads / p.num_kv_heads))
      << "ScoreBlocks: head_dim " << p.head_dim << " with " << p.num_q_heads << "/"
      << p.num_kv_heads
      << " heads is not supported on CUDA (head_dim 32/64/128/256, GQA group <= 16)";
  OASIS_CUDA_CHECK(kernels::LaunchScoreBlocks(p, stream()));
}

void CudaBackend::TopKBlocks(const Tensor& scores, const Tensor& rows, const Tensor& num_blocks,
                             Tensor& topk) {
  CheckDev(scores, DType::kF32, "TopKBlocks scores");
  CheckDev(rows, DType::kI32, "TopKBlocks rows");
  CheckDev(num_blocks, DType::kI32, "TopKBlocks num_blocks");
  const int64_t R = scores.dim(0), hkv = scores.dim(1);
  OASIS_CHECK(rows.numel() == R && num_blocks.numel() == R) << "TopKBlocks: row counts";
  CheckState(topk, R, hkv, "TopKBlocks topk");
  OASIS_CUDA_CHECK(kernels::LaunchTopKBlocks(
      Ptr<float>(scores), Ptr<int32_t>(rows), Ptr<int32_t>(num_blocks), Ptr<int32_t>(topk),
      static_cast<int>(R), static_cast<int>(hkv), static_cast<int>(scores.dim(2)),
      static_cast<int>(topk.dim(2)), stream()));
}

void CudaBackend::WriteIndexed(const Tensor& values, const Tensor& index, Tensor& out) {
  CheckDev(values, DType::kI32, "WriteIndexed values");
  CheckDev(index, DType::kI32, "WriteIndexed index");
  CheckDev(out, DType::kI32, "WriteIndexed out");
  OASIS_CHECK_EQ(values.numel(), index.numel()) << "WriteIndexed: one index per value";
  OASIS_CUDA_CHECK(kernels::LaunchWriteIndexed(Ptr<int32_t>(values), Ptr<int32_t>(index),
                                               Ptr<int32_t>(out), index.numel(), out.numel(),
                                               stream()));
}

void CudaBackend::SelectBlocks(const Tensor& topk, const Tensor& rows, const Tensor& host_tables,
                               const Tensor& ws_slots, Tensor& ws_blocks, Tensor& ws_age,
                               Tensor& fetch_src, Tensor& fetch_dst, Tensor& resident_slots,
                               Tensor& num_resident, Tensor& stats, const Tensor* remote,
                               Tensor* remote_out, int32_t in_place_base, const Tensor* fetch_cap) {
  CheckDev(rows, DType::kI32, "SelectBlocks rows");
  const int64_t R = rows.numel(), hkv = topk.dim(1), k = topk.dim(2);
  CheckState(topk, R, hkv, "SelectBlocks topk");
  CheckState(host_tables, R, hkv, "SelectBlocks host_tables");
  for (const Tensor* t :
       {&ws_slots, &static_cast<const Tensor&>(ws_blocks), &static_cast<const Tensor&>(ws_age),
        &static_cast<const Tensor&>(resident_slots)}) {
    CheckState(*t, R, hkv, "SelectBlocks working-set state");
    OASIS_CHECK_EQ(t->dim(2), k) << "SelectBlocks: working-set width must equal K";
  }
  CheckState(fetch_src, R, hkv, "SelectBlocks fetch_src");
  CheckState(fetch_dst, R, hkv, "SelectBlocks fetch_dst");
  OASIS_CHECK(fetch_dst.shape() == fetch_src.shape())
      << "SelectBlocks fetch_dst " << fetch_dst.ToString();
  CheckDev(num_resident, DType::kI32, "SelectBlocks num_resident");
  OASIS_CHECK_EQ(num_resident.numel(), R * hkv) << "SelectBlocks num_resident";
  CheckState(stats, R, hkv, "SelectBlocks stats");
  OASIS_CHECK_EQ(stats.dim(2), 3) << "SelectBlocks stats";
  kernels::SelectBlocksParams p;
  p.topk = Ptr<int32_t>(topk);
  p.rows = Ptr<int32_t>(rows);
  p.host_tables = Ptr<int32_t>(host_tables);
  p.ws_slots = Ptr<int32_t>(ws_slots);
  p.ws_blocks = Ptr<int32_t>(ws_blocks);
  p.ws_age = Ptr<int32_t>(ws_age);
  p.fetch_src = Ptr<int32_t>(fetch_src);
  p.fetch_dst = Ptr<int32_t>(fetch_dst);
  p.resident_slots = Ptr<int32_t>(resident_slots);
  p.num_resident = Ptr<int32_t>(num_resident);
  p.stats = Ptr<int32_t>(stats);
  p.rows_count = static_cast<int>(R);
  p.num_kv_heads = static_cast<int>(hkv);
  p.k = static_cast<int>(k);
  p.c = static_cast<int>(fetch_src.dim(2));
  p.max_blocks = static_cast<int>(host_tables.dim(2));
  p.in_place_base = in_place_base;
  if (remote != nullptr) {  // host-mapped (EmptyHost) or device memory: read through UVA
    OASIS_CHECK(remote->dtype() == DType::kU8 && remote->ndim() == 3 && remote->dim(0) == R &&
                remote->dim(1) == hkv && remote->dim(2) == host_tables.dim(2))
        << "SelectBlocks remote " << remote->ToString();
    OASIS_CHECK(remote_out != nullptr && remote_out->dtype() == DType::kI32 &&
                remote_out->ndim() == 3 && remote_out->dim(0) == R && remote_out->dim(1) == hkv)
        << "SelectBlocks remote_out";
    p.remote = remote->data<uint8_t>();
    p.remote_out = remote_out->data<int32_t>();
    p.cr = static_cast<int>(remote_out->dim(2));
  }
  if (fetch_cap != nullptr) {
    CheckDev(*fetch_cap, DType::kI32, "SelectBlocks fetch_cap");
    OASIS_CHECK_EQ(fetch_cap->numel(), hkv) << "SelectBlocks fetch_cap " << fetch_cap->ToString();
    p.fetch_cap = Ptr<int32_t>(*fetch_cap);
  }
  OASIS_CHECK(k <= kernels::kSelectMaxK && p.c <= k)
      << "SelectBlocks: K " << k << " (at most " << kernels::kSelectMaxK << "), C " << p.c;
  OASIS_CUDA_CHECK(kernels::LaunchSelectBlocks(p, stream()));
}

// The UVA gather's kernel and CTAs (OASIS_GATHER_KERNEL, OASIS_GATHER_CTAS): few CTAs, so the
// gather fills PCIe while the step's kernels keep the other SMs (DESIGN.md §5).
namespace {
const Tuning& GatherTuning() {
  const Tuning& t = GetTuning();
  OASIS_CHECK(t.gather_error.empty()) << t.gather_error;
  return t;
}
}  // namespace

int CudaBackend::GatherCtas() { return GatherTuning().gather_ctas; }

kernels::GatherKernel CudaBackend::GatherKernelChoice() { return GatherTuning().gather_kernel; }

void CudaBackend::CopyBlocks(const LayerKvPool& src, const Tensor& src_slots, LayerKvPool& dst,
                             const Tensor& dst_slots) {
  CheckPool(src, "CopyBlocks src");
  CheckPool(dst, "CopyBlocks dst");
  CheckDev(src_slots, DType::kI32, "CopyBlocks src_slots");
  CheckDev(dst_slots, DType::kI32, "CopyBlocks dst_slots");
  OASIS_CHECK_EQ(src_slots.numel(), dst_slots.numel()) << "CopyBlocks entry counts";
  OASIS_CHECK_EQ(src.k.dim(2), dst.k.dim(2)) << "CopyBlocks head_dim";
  OASIS_CHECK(src.k.dtype() == dst.k.dtype())
      << "CopyBlocks between pools of different dtypes: " << src.k.ToString() << " -> "
      << dst.k.ToString();
  OASIS_CUDA_CHECK(kernels::LaunchCopyBlockBytes(src.k.raw(), src.v.raw(), Ptr<int32_t>(src_slots),
                                                 dst.k.raw(), dst.v.raw(), Ptr<int32_t>(dst_slots),
                                                 src_slots.numel(), RowBytes(src, "CopyBlocks"),
                                                 GatherCtas(), stream(), GatherKernelChoice()));
}

void CudaBackend::CopyTokens(const LayerKvPool& src, const Tensor& src_index, LayerKvPool& dst,
                             const Tensor& dst_index) {
  CheckPool(src, "CopyTokens src");
  CheckPool(dst, "CopyTokens dst");
  CheckDev(src_index, DType::kI64, "CopyTokens src_index");
  CheckDev(dst_index, DType::kI64, "CopyTokens dst_index");
  OASIS_CHECK_EQ(src_index.numel(), dst_index.numel()) << "CopyTokens entry counts";
  OASIS_CHECK_EQ(src.k.dim(2), dst.k.dim(2)) << "CopyTokens head_dim";
  OASIS_CHECK(src.k.dtype() == dst.k.dtype())
      << "CopyTokens between pools of different dtypes: " << src.k.ToString() << " -> "
      << dst.k.ToString();
  OASIS_CUDA_CHECK(kernels::LaunchCopyTokenBytes(
      src.k.raw(), src.v.raw(), Ptr<int64_t>(src_index), dst.k.raw(), dst.v.raw(),
      Ptr<int64_t>(dst_index), src_index.numel(), RowBytes(src, "CopyTokens"), stream()));
}

void CudaBackend::AssembleSparseTables(const Tensor& seq_rows, const Tensor& resident_slots,
                                       const Tensor& num_resident, const Tensor& tail_slots,
                                       const Tensor& tail_lens, AttentionMetadata& meta) {
  CheckDev(seq_rows, DType::kI32, "AssembleSparseTables seq_rows");
  CheckDev(tail_lens, DType::kI32, "AssembleSparseTables tail_lens");
  CheckDev(num_resident, DType::kI32, "AssembleSparseTables num_resident");
  const int64_t S = seq_rows.numel(), hkv = resident_slots.dim(1);
  CheckState(resident_slots, resident_slots.dim(0), hkv, "AssembleSparseTables resident_slots");
  CheckState(tail_slots, S, hkv, "AssembleSparseTables tail_slots");
  CheckDev(meta.block_tables, DType::kI32, "AssembleSparseTables block_tables");
  CheckDev(meta.kv_lens, DType::kI32, "AssembleSparseTables kv_lens");
  OASIS_CHECK(meta.kv_lens.dim(0) == S && meta.kv_lens.dim(1) == hkv && tail_slots.dim(2) == 2)
      << "AssembleSparseTables kv_lens " << meta.kv_lens.ToString();
  const int64_t width = meta.block_tables.dim(2);
  OASIS_CHECK_GE(width, resident_slots.dim(2) + 2)
      << "AssembleSparseTables: table width " << width << " cannot hold K + 2 tail blocks";
  kernels::AssembleTablesParams p;
  p.seq_rows = Ptr<int32_t>(seq_rows);
  p.resident_slots = Ptr<int32_t>(resident_slots);
  p.num_resident = Ptr<int32_t>(num_resident);
  p.tail_slots = Ptr<int32_t>(tail_slots);
  p.tail_lens = Ptr<int32_t>(tail_lens);
  p.block_tables = Ptr<int32_t>(meta.block_tables);
  p.kv_lens = Ptr<int32_t>(meta.kv_lens);
  p.num_seqs = static_cast<int>(S);
  p.num_kv_heads = static_cast<int>(hkv);
  p.k = static_cast<int>(resident_slots.dim(2));
  p.width = static_cast<int>(width);
  OASIS_CUDA_CHECK(kernels::LaunchAssembleSparseTables(p, stream()));
}

void CudaBackend::FetchOverlap(const Tensor& fetch_dst, const Tensor& ws_slots,
                               const Tensor& ws_blocks, const Tensor& actual, const Tensor& rows,
                               Tensor& counts) {
  CheckDev(rows, DType::kI32, "FetchOverlap rows");
  const int64_t R = rows.numel(), hkv = ws_slots.dim(1), k = ws_slots.dim(2);
  CheckState(fetch_dst, R, hkv, "FetchOverlap fetch_dst");
  CheckState(ws_slots, R, hkv, "FetchOverlap ws_slots");
  CheckState(ws_blocks, R, hkv, "FetchOverlap ws_blocks");
  CheckState(actual, R, hkv, "FetchOverlap actual");
  OASIS_CHECK(ws_blocks.dim(2) == k && actual.dim(2) == k) << "FetchOverlap widths";
  CheckState(counts, R, hkv, "FetchOverlap counts");
  OASIS_CHECK_EQ(counts.dim(2), 2) << "FetchOverlap counts";
  OASIS_CUDA_CHECK(kernels::LaunchFetchOverlap(
      Ptr<int32_t>(fetch_dst), Ptr<int32_t>(ws_slots), Ptr<int32_t>(ws_blocks),
      Ptr<int32_t>(actual), Ptr<int32_t>(rows), Ptr<int32_t>(counts), static_cast<int>(R),
      static_cast<int>(hkv), static_cast<int>(k), static_cast<int>(fetch_dst.dim(2)), stream()));
}

void CudaBackend::TopKOverlap(const Tensor& predicted, const Tensor& actual, const Tensor& rows,
                              Tensor& counts) {
  CheckDev(rows, DType::kI32, "TopKOverlap rows");
  const int64_t R = rows.numel(), hkv = predicted.dim(1), k = predicted.dim(2);
  CheckState(predicted, R, hkv, "TopKOverlap predicted");
  CheckState(actual, R, hkv, "TopKOverlap actual");
  OASIS_CHECK_EQ(actual.dim(2), k) << "TopKOverlap widths";
  CheckState(counts, R, hkv, "TopKOverlap counts");
  OASIS_CHECK_EQ(counts.dim(2), 2) << "TopKOverlap counts";
  OASIS_CUDA_CHECK(kernels::LaunchTopKOverlap(
      Ptr<int32_t>(predicted), Ptr<int32_t>(actual), Ptr<int32_t>(rows), Ptr<int32_t>(counts),
      static_cast<int>(R), static_cast<int>(hkv), static_cast<int>(k), stream()));
}

}  // namespace oasis
