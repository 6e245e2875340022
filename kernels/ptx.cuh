// The PTX primitives every kernel file uses, defined once: shared-memory addresses, cp.async
// copies, ldmatrix / mma.sync / movmatrix fragments, ex2, named barriers, programmatic dependent
// launch, mbarriers and TMA bulk copies, setmaxnreg and the wgmma (sm_90a) instructions.
// Every wrapper that orders memory (copies, waits, fences, barriers, fragment loads from shared
// memory) is `asm volatile` with a "memory" clobber, so the compiler neither reorders shared or
// global accesses across it nor caches values in registers over it. Pure arithmetic (mma.sync,
// ex2) is plain `asm`: the compiler may schedule it like any other instruction.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace oasis::kernels {

// ---- addresses and packing ---------------------------------------------------------------------
// The shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two floats rounded to a bf16x2 word, `lo` in the low half (.x).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- cp.async (sm_80): per-thread global -> shared copies in commit groups ----------------------
// 16 bytes, L1 bypassed. No L2 prefetch-size qualifier: with .L2::256B every 512-byte warp copy
// of the decode attention made the L2 serve 25% more sectors (docs/benchmarks.md).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16 bytes, L1 bypassed; src_bytes = 0 writes zeros without reading `src` (which must still be a
// valid address expression), 16 copies them.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// 4 bytes through L1; src_bytes = 0 writes zeros without reading `src`.
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- warp-level matrix fragments (mma.sync m16n8k16, bf16 in, f32 accumulate) ------------------
__device__ __forceinline__ void Ldmatrix4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void Ldmatrix4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// acc += A · B for one m16n8k16 tile: A (16×16, row) in a0..a3, B (16×8, col) in b0, b1.
__device__ __forceinline__ void Mma(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void Mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  Mma(acc, a[0], a[1], a[2], a[3], b0, b1);
}

// Transposes an 8×8 bf16 matrix fragment across the warp.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 2^x, approximate, flushing denormals; 2^-inf = 0.
__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- barriers and fences
// ------------------------------------------------------------------------- Named barrier `id`
// (1..15; 0 is __syncthreads') over `threads` threads (a multiple of 32).
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later
// async-proxy accesses (wgmma operand reads, bulk copies) that other threads make after
// synchronising.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Makes mbarrier.init visible to the async proxy and the other threads (after the inits, before
// the barrier that publishes them).
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Programmatic dependent launch (Hopper). A kernel launched with LaunchPdl may be scheduled
// while the kernel before it in the stream is still finishing, so every such kernel calls
// GridDependencyWait() before it reads anything an earlier kernel writes or writes anything
// an earlier kernel may read (work on constant data — weights — may come first). Calling
// AllowDependentLaunch() lets the next PDL kernel be scheduled early; it is harmless when
// the next kernel is launched normally. Both are no-ops without a PDL launch.
__device__ __forceinline__ void GridDependencyWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void AllowDependentLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// mbarriers and 1-D bulk copies through the TMA (sm_90). `bar` and shared-memory operands are
// shared-state-space addresses (__cvta_generic_to_shared); bulk sizes and addresses are
// multiples of 16 bytes. Global operands may be mapped host memory.
__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {  // release, CTA scope
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and adds `bytes` to the phase's expected transaction count (the bulk loads' bytes).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the phase with parity `parity` of the barrier has completed (acquire, CTA scope).
// On a fresh barrier, parity 1 names the phase "before" the first and returns at once.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// global -> shared, completing `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// shared -> global, in the current bulk group (BulkCommit, BulkWaitRead / BulkWait).
__device__ __forceinline__ void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Every committed bulk store has read its shared memory (which may then be overwritten).
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Every committed bulk store is complete.
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// ---- warp specialisation and wgmma (sm_90a)
// ------------------------------------------------------- Lowers (Dec) or raises (Inc) this
// warpgroup's register budget to N per thread.
template <int N>
__device__ __forceinline__ void SetMaxNRegDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void SetMaxNRegInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers at a point of the program, so the compiler neither moves their
// reads/writes across the asynchronous wgmma window nor copies them while a wgmma owns them.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void FenceRegs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle. Byte offsets are encoded >> 4.
__device__ __forceinline__ uint64_t MakeDesc(uint32_t smem_addr, uint32_t lead_bytes,
                                             uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lead_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
// The descriptor of an operand `byte_offset` bytes further (stays inside the 14-bit field:
// shared addresses are below 256 KiB).
__device__ __forceinline__ uint64_t DescAt(uint64_t desc, uint32_t byte_offset) {
  return desc + (byte_offset >> 4);
}

// The wgmma shapes the prefill kernel uses, with bf16 operands (kF16 = false) or f16 ones
// (kF16: the FP8 KV path, K/V widened to f16 and Q / P converted to f16); one asm text each,
// the operand types spliced in.
#define OASIS_WGMMA_SS_N128(TYPES)                                                                 \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES                                         \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, "                                                     \
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "  \
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, " \
      "%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#define OASIS_WGMMA_RS_N128(TYPES)                                                                 \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES                                         \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, "                                                     \
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "  \
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, " \
      "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#define OASIS_WGMMA_RS_N64(TYPES)                                                                  \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES                                          \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, "                                                     \
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "  \
      "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                      \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));

// d[0..64) (+)= A(smem, K-major) · B(smem, K-major); scale_d = 0 overwrites d.
template <bool kF16 = false>
__device__ __forceinline__ void WgmmaSS_N128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
  if constexpr (kF16) {
    OASIS_WGMMA_SS_N128("f16.f16");
  } else {
    OASIS_WGMMA_SS_N128("bf16.bf16");
  }
}

// d[0..64) += A(registers, 4 x bf16x2 or f16x2) · B(smem, MN-major: imm-trans-b = 1).
template <bool kF16 = false>
__device__ __forceinline__ void WgmmaRS_N128(float (&d)[64], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kF16) {
    OASIS_WGMMA_RS_N128("f16.f16");
  } else {
    OASIS_WGMMA_RS_N128("bf16.bf16");
  }
}

// d[0..32) += A(registers, 4 x bf16x2 or f16x2) · B(smem, MN-major: imm-trans-b = 1).
template <bool kF16 = false>
__device__ __forceinline__ void WgmmaRS_N64(float (&d)[32], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kF16) {
    OASIS_WGMMA_RS_N64("f16.f16");
  } else {
    OASIS_WGMMA_RS_N64("bf16.bf16");
  }
}

#undef OASIS_WGMMA_SS_N128
#undef OASIS_WGMMA_RS_N128
#undef OASIS_WGMMA_RS_N64

}  // namespace oasis::kernels
