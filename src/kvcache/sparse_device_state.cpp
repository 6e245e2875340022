#include "kvcache/sparse_device_state.h"

#include "common/check.h"

namespace oasis {
namespace {

Tensor Filled(Backend& b, std::vector<int64_t> shape, int32_t value) {
  Tensor host = Tensor::Empty(shape, DType::kI32);
  std::fill(host.data<int32_t>(), host.data<int32_t>() + host.numel(), value);
  Tensor t = b.Empty(std::move(shape), DType::kI32);
  b.UploadBytes(t, 0, host.raw(), host.nbytes());
  return t;
}

}  // namespace

SparseDeviceState::SparseDeviceState(Backend& b, int64_t rows, int64_t kv_heads, int64_t topk,
                                     int64_t max_fetch, int64_t max_blocks, int64_t num_layers,
                                     int64_t first_sparse_layer, int64_t remote_cap)
    : backend_(b),
      rows_(rows),
      kv_heads_(kv_heads),
      topk_(topk),
      max_fetch_(max_fetch),
      max_blocks_(max_blocks),
      first_sparse_layer_(first_sparse_layer),
      remote_cap_(remote_cap) {
  OASIS_CHECK(rows > 0 && kv_heads > 0 && topk > 0 && max_fetch > 0 && max_blocks > 0)
      << "sparse state sizes " << rows << " " << kv_heads << " " << topk << " " << max_fetch << " "
      << max_blocks;
  ws_slots = Filled(b, {rows, kv_heads, topk}, -1);
  scores = b.Empty({rows, kv_heads, max_blocks}, DType::kF32);
  scores_actual = b.Empty({rows, kv_heads, max_blocks}, DType::kF32);
  for (int64_t l = first_sparse_layer; l < num_layers; ++l) {
    SparseLayerState s;
    s.host_tables = Filled(b, {rows, kv_heads, max_blocks}, -1);
    s.ws_blocks = Filled(b, {rows, kv_heads, topk}, -1);
    s.ws_age = Filled(b, {rows, kv_heads, topk}, 0);
    s.resident_slots = Filled(b, {rows, kv_heads, topk}, -1);
    s.num_resident = Filled(b, {rows, kv_heads}, 0);
    s.topk = Filled(b, {rows, kv_heads, topk}, -1);
    s.topk_actual = Filled(b, {rows, kv_heads, topk}, -1);
    s.fetch_src = Filled(b, {rows, kv_heads, max_fetch}, -1);
    s.fetch_dst = Filled(b, {rows, kv_heads, max_fetch}, -1);
    s.select_stats = Filled(b, {rows, kv_heads, 3}, 0);
    s.agree_stats = Filled(b, {rows, kv_heads, 2}, 0);
    s.fetch_use_stats = Filled(b, {rows, kv_heads, 2}, 0);
    s.fetch_cap = Filled(b, {kv_heads}, static_cast<int32_t>(max_fetch));
    if (remote_cap > 0) {
      s.remote = b.EmptyHost({rows, kv_heads, max_blocks}, DType::kU8);
      std::fill(s.remote.data<uint8_t>(), s.remote.data<uint8_t>() + s.remote.numel(), uint8_t{0});
      s.remote_out = b.EmptyHost({rows, kv_heads, remote_cap}, DType::kI32);
      std::fill(s.remote_out.data<int32_t>(), s.remote_out.data<int32_t>() + s.remote_out.numel(),
                -1);
    }
    layers_.push_back(std::move(s));
  }
}

SparseLayerState& SparseDeviceState::layer(int64_t l) {
  return const_cast<SparseLayerState&>(static_cast<const SparseDeviceState&>(*this).layer(l));
}

const SparseLayerState& SparseDeviceState::layer(int64_t l) const {
  OASIS_CHECK(l >= first_sparse_layer_ &&
              l - first_sparse_layer_ < static_cast<int64_t>(layers_.size()))
      << "layer " << l << " is not sparse";
  return layers_[static_cast<size_t>(l - first_sparse_layer_)];
}

void SparseDeviceState::WriteRow(Tensor& t, int64_t r, const std::vector<int32_t>& values) {
  OASIS_CHECK(t.dtype() == DType::kI32 && t.dim(0) == rows_ && r >= 0 && r < rows_)
      << "WriteRow " << t.ToString();
  const int64_t row_elems = t.numel() / rows_;
  OASIS_CHECK_EQ(static_cast<int64_t>(values.size()), row_elems)
      << "WriteRow size for " << t.ToString();
  backend_.UploadBytes(t, static_cast<size_t>(r * row_elems) * sizeof(int32_t), values.data(),
                       values.size() * sizeof(int32_t));
}

void SparseDeviceState::SetFetchCap(int64_t l, int32_t cap) {
  Tensor& t = layer(l).fetch_cap;
  const std::vector<int32_t> values(static_cast<size_t>(kv_heads_), cap);
  backend_.UploadBytes(t, 0, values.data(), values.size() * sizeof(int32_t));
}

void SparseDeviceState::ZeroStats() {
  for (SparseLayerState& s : layers_) {
    std::vector<int32_t> zeros(static_cast<size_t>(s.select_stats.numel()), 0);
    backend_.UploadBytes(s.select_stats, 0, zeros.data(), zeros.size() * sizeof(int32_t));
    zeros.assign(static_cast<size_t>(s.agree_stats.numel()), 0);
    backend_.UploadBytes(s.agree_stats, 0, zeros.data(), zeros.size() * sizeof(int32_t));
    backend_.UploadBytes(s.fetch_use_stats, 0, zeros.data(), zeros.size() * sizeof(int32_t));
  }
}

}  // namespace oasis
