#include "server/chat_template_cache.h"

namespace oasis::server {

StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplateCache::Get(const std::string& source) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(source); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->parsed;
    }
  }
  // Parsed outside the lock: a long template does not hold up other requests.
  StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return parsed.status();
  auto shared = std::make_shared<const ChatTemplate>(std::move(parsed).value());
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.find(source) == index_.end() && capacity_ > 0) {
    lru_.push_front(Entry{source, shared});
    index_.emplace(lru_.front().source, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().source);
      lru_.pop_back();
    }
  }
  return shared;
}

size_t ChatTemplateCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace oasis::server
