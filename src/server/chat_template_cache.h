// ChatTemplateCache: the per-request chat templates (vLLM's `chat_template` request field),
// parsed once and kept for reuse. A bounded LRU keyed by the template's source text: clients
// usually send the same few templates, and a parse costs far more than a lookup.
//
// Owns the parsed templates (each shared with the callers that rendered with it). Thread-safe:
// Get may be called from any request thread.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "oasis/status.h"
#include "tokenizer/jinja/chat_template.h"

namespace oasis::server {

class ChatTemplateCache {
 public:
  explicit ChatTemplateCache(size_t capacity = 16) : capacity_(capacity) {}

  // The parsed template of `source`, from the cache or parsed now (and cached). A syntax error
  // is an InvalidArgument naming the line and column (not cached).
  StatusOr<std::shared_ptr<const ChatTemplate>> Get(const std::string& source);

  size_t size() const;

 private:
  struct Entry {
    std::string source;
    std::shared_ptr<const ChatTemplate> parsed;
  };

  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string_view, std::list<Entry>::iterator> index_;  // views into lru_
};

}  // namespace oasis::server
