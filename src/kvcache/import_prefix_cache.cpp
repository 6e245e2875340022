#include "kvcache/import_prefix_cache.h"

#include <algorithm>

#include "common/check.h"

namespace oasis {

ImportPrefixCache::ImportPrefixCache(HostKvStore& store, int64_t num_kv_heads)
    : store_(store),
      first_layer_(store.first_sparse_layer()),
      num_sparse_layers_(store.num_sparse_layers()),
      num_kv_heads_(num_kv_heads) {
  OASIS_CHECK_GT(num_kv_heads, 0) << "import prefix cache: KV heads";
  store_.set_cell_evictor(this);
}

ImportPrefixCache::~ImportPrefixCache() { store_.set_cell_evictor(nullptr); }

bool ImportPrefixCache::Matches(const Entry& e, uint64_t parent,
                                std::span<const int32_t> tokens) const {
  return e.parent == parent && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(),
                                          tokens.end());
}

std::vector<std::vector<int32_t>> ImportPrefixCache::ByLayer(std::span<const int32_t> cells) const {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(num_sparse_layers_));
  for (int64_t i = 0; i < num_sparse_layers_; ++i) {
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t c = cells[static_cast<size_t>(i * num_kv_heads_ + h)];
      if (c >= 0) out[static_cast<size_t>(i)].push_back(c);
    }
  }
  return out;
}

void ImportPrefixCache::FreeAll(std::span<const int32_t> cells) {
  const auto by_layer = ByLayer(cells);
  for (int64_t i = 0; i < num_sparse_layers_; ++i) {
    if (!by_layer[static_cast<size_t>(i)].empty())
      store_.FreeCells(first_layer_ + i, by_layer[static_cast<size_t>(i)]);
  }
}

void ImportPrefixCache::Park(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                             std::span<const int32_t> cells) {
  OASIS_CHECK_EQ(static_cast<int64_t>(cells.size()), cells_per_block())
      << "import prefix cache: cells of one block";
  auto it = entries_.find(hash);
  if (it != entries_.end() && !Matches(it->second, parent, tokens)) {
    FreeAll(cells);  // a hash collision with another prefix: the entry there stays
    return;
  }
  if (it == entries_.end()) {
    Entry e;
    e.parent = parent;
    e.tokens.assign(tokens.begin(), tokens.end());
    e.cells.assign(static_cast<size_t>(cells_per_block()), -1);
    lru_.push_back(hash);
    e.lru = std::prev(lru_.end());
    it = entries_.emplace(hash, std::move(e)).first;
  } else {
    lru_.splice(lru_.end(), lru_, it->second.lru);  // most recently parked
  }
  Entry& e = it->second;
  std::vector<int32_t> parked(static_cast<size_t>(cells_per_block()), -1);
  std::vector<int32_t> extra(static_cast<size_t>(cells_per_block()), -1);
  for (size_t j = 0; j < e.cells.size(); ++j) {
    if (cells[j] < 0) continue;
    if (e.cells[j] < 0) {
      e.cells[j] = parked[j] = cells[j];
    } else {
      extra[j] = cells[j];  // the entry holds this head-block already
    }
  }
  FreeAll(extra);
  const auto by_layer = ByLayer(parked);
  for (int64_t i = 0; i < num_sparse_layers_; ++i) {
    if (!by_layer[static_cast<size_t>(i)].empty())
      store_.ParkCells(first_layer_ + i, by_layer[static_cast<size_t>(i)]);
  }
  num_cells_ += std::count_if(parked.begin(), parked.end(), [](int32_t c) { return c >= 0; });
  if (std::all_of(e.cells.begin(), e.cells.end(), [](int32_t c) { return c < 0; })) {
    lru_.erase(e.lru);
    entries_.erase(it);  // nothing local: not worth an entry
  }
}

std::vector<int32_t> ImportPrefixCache::Remove(std::unordered_map<uint64_t, Entry>::iterator it) {
  std::vector<int32_t> cells = std::move(it->second.cells);
  const auto by_layer = ByLayer(cells);
  for (int64_t i = 0; i < num_sparse_layers_; ++i) {
    if (!by_layer[static_cast<size_t>(i)].empty())
      store_.UnparkCells(first_layer_ + i, by_layer[static_cast<size_t>(i)]);
  }
  num_cells_ -= std::count_if(cells.begin(), cells.end(), [](int32_t c) { return c >= 0; });
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return cells;
}

std::optional<std::vector<int32_t>> ImportPrefixCache::Take(uint64_t hash, uint64_t parent,
                                                            std::span<const int32_t> tokens) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || !Matches(it->second, parent, tokens)) return std::nullopt;
  return Remove(it);
}

bool ImportPrefixCache::Contains(uint64_t hash, uint64_t parent,
                                 std::span<const int32_t> tokens) const {
  auto it = entries_.find(hash);
  return it != entries_.end() && Matches(it->second, parent, tokens);
}

bool ImportPrefixCache::EvictOldest() {
  if (lru_.empty()) return false;
  FreeAll(Remove(entries_.find(lru_.front())));
  ++evictions_total_;
  return true;
}

}  // namespace oasis
