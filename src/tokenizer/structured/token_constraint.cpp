#include "tokenizer/structured/token_constraint.h"

#include <algorithm>
#include <numeric>

namespace oasis::structured {
namespace {

constexpr size_t kCachedMasks = 32;  // allowed sets kept per sequence
constexpr size_t kCutsBeforeSmallBudget = 4;

}  // namespace

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromBytes(std::vector<std::string> bytes,
                                                                  int64_t vocab_size) {
  auto v = std::make_shared<TokenVocabulary>();
  v->vocab_size_ = vocab_size;
  if (static_cast<int64_t>(bytes.size()) > vocab_size)
    bytes.resize(static_cast<size_t>(vocab_size));
  v->bytes_ = std::move(bytes);
  for (size_t i = 0; i < v->bytes_.size(); ++i) {
    if (!v->bytes_[i].empty()) v->sorted_.push_back(static_cast<int32_t>(i));
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(),
            [&](int32_t a, int32_t b) { return v->bytes_[a] < v->bytes_[b]; });
  v->shared_.assign(v->sorted_.size(), 0);
  for (size_t i = 1; i < v->sorted_.size(); ++i) {
    const std::string& p = v->bytes_[v->sorted_[i - 1]];
    const std::string& q = v->bytes_[v->sorted_[i]];
    const size_t n = std::min(p.size(), q.size());
    size_t k = 0;
    while (k < n && p[k] == q[k]) ++k;
    v->shared_[i] = static_cast<int32_t>(k);
  }
  return v;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::Build(const tokenizer::Tokenizer& tokenizer,
                                                              int64_t vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max<int64_t>(vocab_size, 0)));
  const int64_t n = std::min(vocab_size, tokenizer.vocab_size());
  for (int64_t id = 0; id < n; ++id) {
    const auto i = static_cast<int32_t>(id);
    if (!tokenizer.IsKnown(i) || tokenizer.IsAdded(i)) continue;
    bytes[static_cast<size_t>(id)] = std::string(tokenizer.DecodedBytes(i));
  }
  return FromBytes(std::move(bytes), vocab_size);
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const TokenVocabulary> vocabulary,
                                     std::vector<int32_t> eos_ids, ReasoningGate gate,
                                     uint64_t max_walk_work)
    : vocab_(std::move(vocabulary)),
      eos_(std::move(eos_ids)),
      gate_(gate),
      max_walk_work_(max_walk_work),
      shared_(std::make_shared<Shared>(std::move(grammar))) {
  std::sort(eos_.begin(), eos_.end());
  eos_.erase(std::unique(eos_.begin(), eos_.end()), eos_.end());
}

size_t GrammarConstraint::num_states() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->matcher.num_states();
}

std::shared_ptr<GrammarConstraint> GrammarConstraint::Sibling() const {
  std::lock_guard<std::mutex> lock(shared_->mu);  // (this one's path is copied, then dropped)
  std::shared_ptr<GrammarConstraint> c(new GrammarConstraint(*this));
  c->path_tokens_.clear();
  c->path_states_.clear();
  c->path_begin_ = 0;
  ++shared_->siblings;
  return c;
}

uint64_t GrammarConstraint::work() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->matcher.work();
}

size_t GrammarConstraint::num_walks() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->walks;
}

size_t GrammarConstraint::num_cut_walks() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->cut_walks;
}

int32_t GrammarConstraint::Feed(int32_t state, int32_t token) const {
  const std::string_view b = vocab_->bytes(token);
  if (b.empty()) return GrammarMatcher::kDead;  // an added token, EOS: not grammar text
  return shared_->matcher.Next(state, b);
}

int64_t GrammarConstraint::GrammarBegin(std::span<const int32_t> output,
                                        std::span<const int32_t> draft) const {
  if (!gate_.enabled) return 0;
  const size_t n = output.size() + draft.size();
  auto at = [&](size_t i) { return i < output.size() ? output[i] : draft[i - output.size()]; };
  size_t from = 0;
  if (!gate_.open_at_start) {
    if (n == 0 || at(0) != gate_.think_start) return 0;
    from = 1;
  }
  for (size_t i = from; i < n; ++i) {
    if (at(i) == gate_.think_end) return static_cast<int64_t>(i) + 1;
  }
  return -1;
}

int32_t GrammarConstraint::StateAfter(std::span<const int32_t> output, size_t begin) const {
  // The committed part, through the cached path.
  const size_t committed_begin = std::min(begin, output.size());
  if (path_begin_ != committed_begin) {
    path_tokens_.clear();
    path_states_.clear();
    path_begin_ = committed_begin;
  }
  const std::span<const int32_t> committed = output.subspan(committed_begin);
  size_t same = 0;
  while (same < path_tokens_.size() && same < committed.size() &&
         path_tokens_[same] == committed[same]) {
    ++same;
  }
  path_tokens_.resize(same);
  path_states_.resize(same);
  int32_t state = same == 0 ? shared_->matcher.start() : path_states_.back();
  for (size_t i = same; i < committed.size(); ++i) {
    state = state < 0 ? GrammarMatcher::kDead : Feed(state, committed[i]);
    path_tokens_.push_back(committed[i]);
    path_states_.push_back(state);
  }
  return state;
}

const GrammarConstraint::Bits& GrammarConstraint::AllowedBits(int32_t state) const {
  Shared& sh = *shared_;
  auto hit = sh.bits_index.find(state);
  if (hit != sh.bits_index.end()) {
    sh.bits.splice(sh.bits.begin(), sh.bits, hit->second);
    return sh.bits.front().second;
  }
  const TokenVocabulary& v = *vocab_;
  ++sh.walks;
  Bits bits(static_cast<size_t>((v.vocab_size_ + 63) / 64), 0);
  sh.walk.assign(1, state);
  size_t computed = 0;  // walk[0..computed] hold the states after the previous token's bytes
  bool any = false;
  // A request whose walks were cut kCutsBeforeSmallBudget times has a grammar this walk cannot
  // cover anyway (its answers follow the walk's byte order): a 32nd of the budget from then on,
  // so it costs the other requests' steps a few milliseconds, not a hundred, for the rest of its
  // answer.
  const uint64_t budget =
      sh.cut_walks >= kCutsBeforeSmallBudget ? max_walk_work_ / 32 : max_walk_work_;
  const uint64_t work_end = sh.matcher.work() + budget;
  for (size_t i = 0; i < v.sorted_.size(); ++i) {
    if (sh.matcher.work() > work_end) {  // the rest stay masked
      ++sh.cut_walks;
      break;
    }
    const int32_t id = v.sorted_[i];
    const std::string& b = v.bytes_[static_cast<size_t>(id)];
    size_t at = std::min(static_cast<size_t>(v.shared_[i]), computed);
    if (sh.walk.size() < b.size() + 1) sh.walk.resize(b.size() + 1, GrammarMatcher::kDead);
    int32_t s = sh.walk[at];
    while (s >= 0 && at < b.size()) {
      s = sh.matcher.Next(s, static_cast<uint8_t>(b[at]));
      sh.walk[++at] = s;
    }
    computed = at;
    if (s >= 0) {
      bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
      any = true;
    }
  }
  // EOS where the text is complete — and where no token can go on (the matcher's bounds cut
  // the grammar there: its states and frames, 160 frames deep, the walk's work): a request is
  // never left without a token, and its text ends where it must.
  if (sh.matcher.Accepting(state) || !any) {
    for (int32_t id : eos_) {
      if (id >= 0 && id < v.vocab_size_)
        bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
  }
  sh.bits.emplace_front(state, std::move(bits));
  sh.bits_index[state] = sh.bits.begin();
  if (sh.bits.size() > kCachedMasks * sh.siblings) {
    sh.bits_index.erase(sh.bits.back().first);
    sh.bits.pop_back();
  }
  return sh.bits.front().second;
}

void GrammarConstraint::Masked(std::span<const int32_t> output, std::span<const int32_t> draft,
                               std::vector<int32_t>* masked) const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  const int64_t begin = GrammarBegin(output, draft);
  if (begin < 0) return;  // thinking: free text
  const int64_t vocab = vocab_->vocab_size_;
  const int32_t committed = StateAfter(output, static_cast<size_t>(begin));
  if (committed < 0) {
    // Committed tokens outside the grammar (not generated under this constraint): only the
    // end of the sequence may follow.
    for (int64_t id = 0; id < vocab; ++id) {
      if (!std::binary_search(eos_.begin(), eos_.end(), static_cast<int32_t>(id)))
        masked->push_back(static_cast<int32_t>(id));
    }
    return;
  }
  // The draft tokens from the committed state (the grammar may start inside them).
  int32_t state = committed;
  const size_t draft_begin =
      static_cast<size_t>(begin) > output.size() ? static_cast<size_t>(begin) - output.size() : 0;
  for (size_t i = draft_begin; i < draft.size() && state >= 0; ++i) state = Feed(state, draft[i]);
  if (state < 0) return;  // a refused draft token: this row's result is not used
  const Bits& bits = AllowedBits(state);
  const bool think_first = gate_.enabled && !gate_.open_at_start && output.empty() && draft.empty();
  masked->reserve(masked->size() + static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    const bool allowed = ((bits[static_cast<size_t>(id) / 64] >> (id % 64)) & 1) != 0 ||
                         (think_first && id == gate_.think_start);
    if (!allowed) masked->push_back(static_cast<int32_t>(id));
  }
}

bool GrammarConstraint::Complete(std::span<const int32_t> tokens) const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  const int64_t begin = GrammarBegin(tokens, {});
  if (begin < 0) return false;
  std::span<const int32_t> rest = tokens;
  // (EOS ends the text: it is not fed.)
  while (!rest.empty() && std::binary_search(eos_.begin(), eos_.end(), rest.back())) {
    rest = rest.first(rest.size() - 1);
  }
  if (static_cast<size_t>(begin) > rest.size()) return false;
  int32_t s = shared_->matcher.start();
  for (size_t i = static_cast<size_t>(begin); i < rest.size() && s >= 0; ++i) s = Feed(s, rest[i]);
  return s >= 0 && shared_->matcher.Accepting(s);
}

std::vector<int32_t> GrammarConstraint::Allowed(std::span<const int32_t> tokens) const {
  std::vector<int32_t> masked;
  Masked(tokens, {}, &masked);
  std::vector<int32_t> all(static_cast<size_t>(vocab_->vocab_size_));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> out;
  std::set_difference(all.begin(), all.end(), masked.begin(), masked.end(),
                      std::back_inserter(out));
  return out;
}

}  // namespace oasis::structured
