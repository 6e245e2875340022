#include "disagg/kv_import.h"

#include <algorithm>

namespace oasis::disagg {

Status CheckDisaggregation(const SparseKvManager& m) {
  if (m.num_sides() != 1) {
    return FailedPrecondition("disaggregated prefill/decode with sparse KV over " +
                              std::to_string(m.num_sides()) +
                              " tensor-parallel ranks is not supported (one GPU per instance)");
  }
  if (m.config().dense_layers != 0) {
    return FailedPrecondition("disaggregated prefill/decode needs --sparse-dense-layers 0 (have " +
                              std::to_string(m.config().dense_layers) + ")");
  }
  return Status::Ok();
}

StatusOr<std::vector<std::vector<int32_t>>> HandoffBlocks(const SparseKvManager& m,
                                                          Backend& backend, uint64_t id) {
  OASIS_RETURN_IF_ERROR(CheckDisaggregation(m));
  const int64_t r = m.SparseRow(id);
  if (r < 0) return FailedPrecondition("request " + std::to_string(id) + " is not sparse");
  const int64_t hkv = m.shape().num_kv_heads, k = m.config().topk_blocks,
                first = m.config().dense_layers;
  const SparseDeviceState& st = m.state(0);
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>((m.shape().num_layers - first) * hkv));
  for (int64_t l = first; l < m.shape().num_layers; ++l) {
    const Tensor ws = backend.Download(st.layer(l).ws_blocks.Slice(r, r + 1));
    const Tensor topk = backend.Download(st.layer(l).topk.Slice(r, r + 1));
    for (int64_t h = 0; h < hkv; ++h) {
      std::vector<int32_t> blocks;
      const int32_t* w = ws.data<int32_t>() + h * k;
      const int32_t* p = topk.data<int32_t>() + h * k;
      for (int64_t j = 0; j < k; ++j) {
        if (w[j] >= 0) blocks.push_back(w[j]);
      }
      const auto resident = static_cast<std::ptrdiff_t>(blocks.size());
      for (int64_t j = 0; j < k; ++j) {
        if (p[j] >= 0 && std::find(blocks.begin(), blocks.begin() + resident, p[j]) ==
                             blocks.begin() + resident) {
          blocks.push_back(p[j]);
        }
      }
      out.push_back(std::move(blocks));
    }
  }
  return out;
}

LayeredHold PlanImportHold(const SparseKvManager& m, int64_t max_total_tokens, int64_t layer_blocks,
                           const std::vector<std::vector<int32_t>>* local,
                           const AdoptedPrefix* adopted) {
  const HostKvStore& store = m.host_store();
  const int64_t first = m.config().dense_layers;
  const int64_t hkv = m.shape().num_kv_heads, ls = m.shape().num_layers - first;
  const int64_t blocks = BlocksFor(max_total_tokens);
  layer_blocks = std::clamp<int64_t>(layer_blocks, 0, blocks);
  LayeredHold n;
  n.layer_blocks = layer_blocks;
  n.whole = hkv * (blocks - layer_blocks);
  n.cells.assign(static_cast<size_t>(ls), 0);
  n.rows.assign(static_cast<size_t>(ls), 0);
  n.num_local.assign(static_cast<size_t>(ls), 0);
  n.local.assign(static_cast<size_t>(ls * hkv),
                 std::vector<char>(static_cast<size_t>(layer_blocks), local == nullptr));
  const int64_t adopted_blocks =
      adopted == nullptr ? 0 : std::min<int64_t>(adopted->blocks, layer_blocks);
  for (int64_t i = 0; i < ls; ++i) {
    int64_t here = 0, kept = 0;
    for (int64_t h = 0; h < hkv; ++h) {
      auto& flags = n.local[static_cast<size_t>(i * hkv + h)];
      if (local != nullptr && static_cast<size_t>(i * hkv + h) < local->size()) {
        for (int32_t b : (*local)[static_cast<size_t>(i * hkv + h)]) {
          if (b >= 0 && b < layer_blocks) flags[static_cast<size_t>(b)] = 1;
        }
      }
      for (int64_t b = 0; b < adopted_blocks; ++b) {
        if (adopted->Cell(b, i, h, ls, hkv) < 0) continue;
        flags[static_cast<size_t>(b)] = 1;
        ++kept;
      }
      here += std::count(flags.begin(), flags.end(), char{1});
    }
    const int64_t remote = hkv * layer_blocks - here;
    const int64_t rows = std::min<int64_t>(remote, store.num_free_summary_rows(first + i));
    n.rows[static_cast<size_t>(i)] = rows;
    n.cells[static_cast<size_t>(i)] = here - kept + remote - rows;
    n.num_local[static_cast<size_t>(i)] = here;
  }
  return n;
}

HostAdmission ImportAdmission(const SparseKvManager& m, const LayeredHold& n) {
  const HostKvStore& store = m.host_store();
  // Never: more than the whole store even with every summary-only row free.
  int64_t most = 0, fresh = 0;
  for (size_t i = 0; i < n.cells.size(); ++i) {
    const int64_t l = m.config().dense_layers + static_cast<int64_t>(i);
    const int64_t remote = m.shape().num_kv_heads * n.layer_blocks - n.num_local[i];
    most = std::max<int64_t>(
        most, n.num_local[i] + std::max<int64_t>(0, remote - store.num_summary_rows()));
    fresh = std::max<int64_t>(fresh, store.FreshSlotsForCells(l, static_cast<int32_t>(n.cells[i])));
  }
  if (n.whole + most > store.num_slots()) return HostAdmission::kNever;
  return n.whole + fresh <= store.num_free() ? HostAdmission::kFits : HostAdmission::kWait;
}

HostAdmission CheckImportAdmission(const SparseKvManager& m, int64_t max_total_tokens,
                                   int64_t layer_blocks,
                                   const std::vector<std::vector<int32_t>>* local,
                                   const AdoptedPrefix* adopted) {
  if (max_total_tokens > m.config().max_seq_len) return HostAdmission::kNever;
  return ImportAdmission(m, PlanImportHold(m, max_total_tokens, layer_blocks, local, adopted));
}

std::vector<RemoteBlock> RemoteMisses(const SparseKvManager& m, uint64_t id) {
  std::vector<RemoteBlock> out;
  const int64_t r = m.SparseRow(id);
  if (r < 0 || RemoteBlocksLeft(m, id) == 0) return out;
  const SparseDeviceState& st = m.state(0);
  const int64_t hkv = m.shape().num_kv_heads, cr = st.remote_cap();
  for (int64_t l = m.config().dense_layers; l < m.shape().num_layers; ++l) {
    const int32_t* rout = st.layer(l).remote_out.data<int32_t>();
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t j = 0; j < cr; ++j) {
        const int32_t b = rout[(r * hkv + h) * cr + j];
        if (b < 0) break;
        out.push_back({static_cast<int32_t>(l), static_cast<int32_t>(h), b});
      }
    }
  }
  return out;
}

}  // namespace oasis::disagg
