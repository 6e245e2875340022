// Structured output over a tokenizer's vocabulary: which tokens keep a grammar alive.
//
// TokenVocabulary (once per tokenizer): every token's bytes, sorted, with the length of the
// prefix each shares with the one before, so that a walk over all of them feeds the matcher
// each distinct prefix once. Added tokens (<|im_end|>, <think>) have no bytes here: a grammar
// never allows them, except the end-of-sequence ids once the grammar is complete.
//
// GrammarConstraint (once per request): oasis::TokenConstraint for one grammar. The allowed
// set of a matcher state is computed once and cached (most steps of a long string repeat a
// state); the states after the request's committed tokens are kept, so that a step feeds only
// its new token. With a reasoning parser the grammar starts after the thinking block (vLLM's
// behaviour): while the model thinks nothing is masked.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "oasis/token_constraint.h"
#include "tokenizer/structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace oasis::structured {

class TokenVocabulary {
 public:
  // `vocab_size`: the model's logits width (ids past the tokenizer's are never allowed).
  static std::shared_ptr<const TokenVocabulary> Build(const tokenizer::Tokenizer& tokenizer,
                                                      int64_t vocab_size);
  // Tests: explicit byte strings (empty: no bytes, never allowed by a grammar).
  static std::shared_ptr<const TokenVocabulary> FromBytes(std::vector<std::string> bytes,
                                                          int64_t vocab_size);
  int64_t vocab_size() const { return vocab_size_; }
  std::string_view bytes(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < bytes_.size() ? std::string_view(bytes_[id])
                                                              : std::string_view();
  }

 private:
  friend class GrammarConstraint;
  std::vector<std::string> bytes_;  // by id
  std::vector<int32_t> sorted_;     // ids with bytes, by their bytes
  std::vector<int32_t> shared_;     // bytes sorted_[i] shares with sorted_[i - 1]
  int64_t vocab_size_ = 0;
};

// Where the grammar starts when the server parses reasoning (--reasoning-parser).
struct ReasoningGate {
  bool enabled = false;
  bool open_at_start = false;  // the prompt ends inside <think>
  int32_t think_start = -1;    // <think>: allowed as the first token
  int32_t think_end = -1;      // </think>: the grammar starts after it
};

class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> eos_ids,
                    ReasoningGate gate = {}, uint64_t max_walk_work = kMaxWalkWork);

  void Masked(std::span<const int32_t> output, std::span<const int32_t> draft,
              std::vector<int32_t>* masked) const override;

  // The matcher work (GrammarMatcher::work, frames fed and produced) one walk of the vocabulary
  // may do: ~50-70 ms of the engine thread, five times the most a JSON schema, a regex or the
  // benchmark's GBNF language needed (bench_structured). A grammar that needs more (ambiguous
  // recursion: fifty times that) has the walk cut there — the tokens not reached are masked, so
  // what is allowed stays valid, and EOS is allowed where nothing else is — instead of stalling
  // every request's step for seconds. After four cut walks a request (its siblings included)
  // walks with a 32nd of it (a few ms). (The constructor takes another budget: the fuzzer's,
  // smaller, keeps its units fast under the sanitizers.)
  static constexpr uint64_t kMaxWalkWork = uint64_t{1} << 21;

  // Another sequence of the same request (n > 1, several prompts): the same grammar, vocabulary,
  // EOS ids, gate and budget, and the same matcher and allowed sets by state — computed once for
  // all the siblings (a state one reached is a table lookup for the others), under one memory
  // bound per request instead of one per sequence. Calls on siblings serialise on one lock.
  std::shared_ptr<GrammarConstraint> Sibling() const;

  // Whether `tokens` (a whole generation) leave the grammar complete (tests).
  bool Complete(std::span<const int32_t> tokens) const;
  // The allowed ids after `tokens` (tests).
  std::vector<int32_t> Allowed(std::span<const int32_t> tokens) const;
  size_t num_states() const;
  // The matcher's work so far (GrammarMatcher::work).
  uint64_t work() const;
  // Allowed sets computed by walking the vocabulary (the others came from the cache), and the
  // walks cut by kMaxWalkWork.
  size_t num_walks() const;
  size_t num_cut_walks() const;

 private:
  using Bits = std::vector<uint64_t>;
  // The matcher state after the committed `output` from `begin` on (none when begin is past
  // it), through the cached path. kDead when they break the grammar.
  int32_t StateAfter(std::span<const int32_t> output, size_t begin) const;
  int32_t Feed(int32_t state, int32_t token) const;
  const Bits& AllowedBits(int32_t state) const;
  // -1: nothing is masked (thinking); else where in output ++ draft the grammar starts.
  int64_t GrammarBegin(std::span<const int32_t> output, std::span<const int32_t> draft) const;

  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> eos_;
  ReasoningGate gate_;
  uint64_t max_walk_work_;

  // What a request's siblings share: the matcher, the allowed sets by matcher state (most
  // recently used first, kCachedMasks per sibling), the walk's scratch, the counters, and the
  // lock over all of it and over each sibling's path.
  struct Shared {
    explicit Shared(std::shared_ptr<const Grammar> grammar) : matcher(std::move(grammar)) {}
    std::mutex mu;
    GrammarMatcher matcher;
    std::unordered_map<int32_t, std::list<std::pair<int32_t, Bits>>::iterator> bits_index;
    std::list<std::pair<int32_t, Bits>> bits;
    std::vector<int32_t> walk;  // states by prefix length
    size_t walks = 0;
    size_t cut_walks = 0;
    size_t siblings = 1;
  };
  std::shared_ptr<Shared> shared_;
  // This sequence's committed tokens the path was fed (from the grammar's start) and the state
  // after each (under shared_->mu).
  mutable std::vector<int32_t> path_tokens_;
  mutable std::vector<int32_t> path_states_;
  mutable size_t path_begin_ = 0;
};

}  // namespace oasis::structured
