#include "kvcache/store_prefix_cache.h"

#include <algorithm>
#include <iterator>

#include "common/check.h"

namespace oasis {

StorePrefixCache::StorePrefixCache(HostKvStore& store, int64_t num_kv_heads, Unit unit)
    : store_(store),
      unit_(unit),
      first_layer_(store.first_sparse_layer()),
      num_sparse_layers_(store.num_sparse_layers()),
      num_kv_heads_(num_kv_heads) {
  OASIS_CHECK_GT(num_kv_heads, 0) << "store prefix cache: KV heads";
  store_.add_evictor(this);
}

StorePrefixCache::~StorePrefixCache() { store_.remove_evictor(this); }

bool StorePrefixCache::Matches(const Entry& e, const PrefixBlockKey& key) const {
  return e.parent == key.parent &&
         std::equal(e.tokens.begin(), e.tokens.end(), key.tokens.begin(), key.tokens.end());
}

std::vector<int32_t> StorePrefixCache::Present(std::span<const int32_t> cells) {
  std::vector<int32_t> out;
  std::copy_if(cells.begin(), cells.end(), std::back_inserter(out),
               [](int32_t c) { return c >= 0; });
  return out;
}

template <typename OnSlots, typename OnLayer>
void StorePrefixCache::Apply(std::span<const int32_t> cells, OnSlots on_slots, OnLayer on_layer) {
  if (unit_ == Unit::kSlots) {
    on_slots(Present(cells));
    return;
  }
  for (int64_t i = 0; i < num_sparse_layers_; ++i) {
    std::vector<int32_t> layer;
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t c = cells[static_cast<size_t>(i * num_kv_heads_ + h)];
      if (c >= 0) layer.push_back(c);
    }
    if (!layer.empty()) on_layer(first_layer_ + i, layer);
  }
}

void StorePrefixCache::ParkAll(std::span<const int32_t> cells) {
  Apply(
      cells, [&](const std::vector<int32_t>& ids) { store_.ParkSlots(ids); },
      [&](int64_t l, const std::vector<int32_t>& ids) { store_.ParkCells(l, ids); });
}

void StorePrefixCache::UnparkAll(std::span<const int32_t> cells) {
  Apply(
      cells, [&](const std::vector<int32_t>& ids) { store_.UnparkSlots(ids); },
      [&](int64_t l, const std::vector<int32_t>& ids) { store_.UnparkCells(l, ids); });
}

void StorePrefixCache::FreeAll(std::span<const int32_t> cells) {
  Apply(
      cells, [&](const std::vector<int32_t>& ids) { store_.Free(ids); },
      [&](int64_t l, const std::vector<int32_t>& ids) { store_.FreeCells(l, ids); });
}

std::optional<std::vector<int32_t>> StorePrefixCache::Acquire(const PrefixBlockKey& key) {
  auto it = entries_.find(key.hash);
  if (it == entries_.end() || !Matches(it->second, key)) return std::nullopt;
  Entry& e = it->second;
  if (e.holders++ == 0) {  // parked until now: in use again, not room
    UnparkAll(e.cells);
    lru_.erase(e.lru);
  }
  return e.cells;
}

void StorePrefixCache::Release(const PrefixBlockKey& key, std::span<const int32_t> own, bool held) {
  OASIS_CHECK(own.empty() || static_cast<int64_t>(own.size()) == cells_per_block())
      << "store prefix cache: cells of one block";
  auto it = entries_.find(key.hash);
  if (it != entries_.end() && !Matches(it->second, key)) {
    OASIS_CHECK(!held) << "store prefix cache: releasing a block it does not hold";
    if (!own.empty()) FreeAll(own);  // a hash collision with another prefix: that entry stays
    return;
  }
  if (it == entries_.end()) {
    OASIS_CHECK(!held) << "store prefix cache: releasing a block it does not hold";
    Entry e;
    e.parent = key.parent;
    e.tokens.assign(key.tokens.begin(), key.tokens.end());
    e.cells.assign(static_cast<size_t>(cells_per_block()), -1);
    it = entries_.emplace(key.hash, std::move(e)).first;
  } else if (it->second.holders == 0) {
    lru_.erase(it->second.lru);  // parked: goes back to the end below
  }
  Entry& e = it->second;
  OASIS_CHECK(!held || e.holders > 0) << "store prefix cache: a release without a holder";
  // The cells the entry lacks join it (in use, like the entry's own while held); the rest go.
  std::vector<int32_t> added(static_cast<size_t>(cells_per_block()), -1);
  std::vector<int32_t> extra(static_cast<size_t>(cells_per_block()), -1);
  for (size_t j = 0; j < own.size(); ++j) {
    if (own[j] < 0) continue;
    if (e.cells[j] < 0) {
      e.cells[j] = added[j] = own[j];
      ++num_cells_;
    } else if (e.cells[j] != own[j]) {
      extra[j] = own[j];
    }
  }
  FreeAll(extra);
  if (held) --e.holders;
  if (e.holders > 0) return;
  // No holder: parked (the cells that were held now, and the new ones).
  if (std::all_of(e.cells.begin(), e.cells.end(), [](int32_t c) { return c < 0; })) {
    entries_.erase(it);  // nothing local: not worth an entry
    return;
  }
  ParkAll(held ? std::span<const int32_t>(e.cells) : std::span<const int32_t>(added));
  lru_.push_back(key.hash);
  e.lru = std::prev(lru_.end());
}

bool StorePrefixCache::Publish(const PrefixBlockKey& key, std::span<const int32_t> own) {
  OASIS_CHECK_EQ(static_cast<int64_t>(own.size()), cells_per_block())
      << "store prefix cache: cells of one block";
  const auto n = std::count_if(own.begin(), own.end(), [](int32_t c) { return c >= 0; });
  if (n == 0 || entries_.count(key.hash)) return false;
  Entry e;
  e.parent = key.parent;
  e.tokens.assign(key.tokens.begin(), key.tokens.end());
  e.cells.assign(own.begin(), own.end());
  e.holders = 1;
  entries_.emplace(key.hash, std::move(e));
  num_cells_ += n;
  return true;
}

bool StorePrefixCache::Contains(const PrefixBlockKey& key) const {
  auto it = entries_.find(key.hash);
  return it != entries_.end() && Matches(it->second, key);
}

bool StorePrefixCache::EvictOldest() {
  if (lru_.empty()) return false;
  auto it = entries_.find(lru_.front());
  lru_.pop_front();
  std::vector<int32_t> cells = std::move(it->second.cells);
  entries_.erase(it);
  UnparkAll(cells);
  FreeAll(cells);
  num_cells_ -= std::count_if(cells.begin(), cells.end(), [](int32_t c) { return c >= 0; });
  ++evictions_total_;
  return true;
}

}  // namespace oasis
