// The element type of a KV pool as the kernels see it (LayerKvPool in src/backend/backend.h).
#pragma once

namespace oasis::kernels {

// kBf16: the pools hold bf16 keys and values. kFp8E4M3: they hold OCP e4m3fn bytes, and a stored
// value x of KV head h stands for x · k_scale[h] (keys) or x · v_scale[h] (values); the kernels
// that read them take the per-head F32 scales, the kernels that write them store
// e4m3(value / scale[h]) (round to nearest even, saturating at ±448) and raise per-head amax.
enum class KvDtype { kBf16, kFp8E4M3 };

}  // namespace oasis::kernels
