#include "kvcache/prefix_cache.h"

#include <algorithm>

#include "common/check.h"
#include "oasis/sampling_noise.h"  // Mix64

namespace oasis {
namespace {

// Hashes are 63-bit: the all-ones value marks "no entry" in PrefixCache.
constexpr uint64_t kHashMask = ~(uint64_t{1} << 63);

}  // namespace

uint64_t PrefixCacheRoot(uint64_t salt) { return Mix64(salt ^ 0x6f617369734b5621ULL) & kHashMask; }

uint64_t HashPrefixBlock(uint64_t parent, std::span<const int32_t> tokens) {
  OASIS_CHECK_EQ(tokens.size(), static_cast<size_t>(kBlockSize)) << "hashing a partial block";
  uint64_t h = Mix64(parent + 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = Mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 1));
  return h & kHashMask;
}

std::vector<uint64_t> HashPrefixBlocks(uint64_t root, std::span<const int32_t> tokens) {
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / kBlockSize);
  for (size_t b = 0; (b + 1) * kBlockSize <= tokens.size(); ++b) {
    root = HashPrefixBlock(root, tokens.subspan(b * kBlockSize, kBlockSize));
    out.push_back(root);
  }
  return out;
}

PrefixCache::PrefixCache(int32_t num_slots, int32_t num_kv_heads)
    : num_kv_heads_(num_kv_heads), entry_of_(static_cast<size_t>(num_slots), kNone) {
  OASIS_CHECK_GT(num_kv_heads, 0) << "a prefix cache needs at least one KV head";
}

const std::vector<int32_t>* PrefixCache::Find(uint64_t hash, uint64_t parent,
                                              std::span<const int32_t> tokens) const {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return nullptr;
  const Entry& e = it->second;
  if (e.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end()))
    return nullptr;
  return &e.slots;
}

bool PrefixCache::Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                         const std::vector<int32_t>& slots) {
  OASIS_CHECK_EQ(slots.size(), static_cast<size_t>(num_kv_heads_)) << "one slot per KV head";
  OASIS_CHECK_EQ(tokens.size(), static_cast<size_t>(kBlockSize)) << "caching a partial block";
  OASIS_CHECK_NE(hash, kNone) << "reserved hash value";
  if (entries_.count(hash)) return false;
  for (int32_t s : slots) OASIS_CHECK(!IsCached(s)) << "slot " << s << " cached twice";
  Entry& e = entries_[hash];
  e.parent = parent;
  std::copy(tokens.begin(), tokens.end(), e.tokens.begin());
  e.slots = slots;
  for (int32_t s : slots) entry_of_[static_cast<size_t>(s)] = hash;
  return true;
}

bool PrefixCache::IsParked(int32_t slot) const {
  OASIS_CHECK(IsCached(slot)) << "slot " << slot << " is not cached";
  return entries_.at(entry_of_[static_cast<size_t>(slot)]).evictable;
}

void PrefixCache::Park(int32_t slot) {
  OASIS_CHECK(IsCached(slot)) << "parking uncached slot " << slot;
  Entry& e = entries_.at(entry_of_[static_cast<size_t>(slot)]);
  OASIS_CHECK_LT(e.num_parked, static_cast<int32_t>(e.slots.size())) << "slot parked twice";
  if (++e.num_parked < static_cast<int32_t>(e.slots.size())) return;
  e.evictable = true;
  e.lru_pos = lru_.insert(lru_.end(), entry_of_[static_cast<size_t>(slot)]);
  num_evictable_slots_ += static_cast<int64_t>(e.slots.size());
}

void PrefixCache::Unpark(int32_t slot) {
  OASIS_CHECK(IsCached(slot)) << "unparking uncached slot " << slot;
  Entry& e = entries_.at(entry_of_[static_cast<size_t>(slot)]);
  OASIS_CHECK_GT(e.num_parked, 0) << "unparking slot " << slot << " of an entry in use";
  if (e.evictable) {
    lru_.erase(e.lru_pos);
    e.evictable = false;
    num_evictable_slots_ -= static_cast<int64_t>(e.slots.size());
  }
  --e.num_parked;
}

std::optional<PrefixCache::Evicted> PrefixCache::EvictEntry() {
  if (lru_.empty()) return std::nullopt;
  const uint64_t hash = lru_.front();
  lru_.pop_front();
  auto it = entries_.find(hash);
  OASIS_CHECK(it != entries_.end() && it->second.evictable) << "LRU names a missing entry";
  Evicted out{.hash = hash,
              .parent = it->second.parent,
              .tokens = it->second.tokens,
              .slots = std::move(it->second.slots)};
  entries_.erase(it);
  for (int32_t s : out.slots) entry_of_[static_cast<size_t>(s)] = kNone;
  num_evictable_slots_ -= static_cast<int64_t>(out.slots.size());
  ++evictions_total_;
  return out;
}

std::vector<int32_t> PrefixCache::EvictOne() {
  std::optional<Evicted> e = EvictEntry();
  return e ? std::move(e->slots) : std::vector<int32_t>{};
}

}  // namespace oasis
