// The byte grammars of structured output and their matcher.
//
// A Grammar is a graph of nodes (literals, sequences, alternatives, JSON strings, numbers,
// objects and arrays, bounded whitespace); nodes may refer to each other cyclically (JSON
// values nest). The GrammarMatcher runs it over bytes as a nondeterministic pushdown automaton:
// a state is a set of stacks of frames (a node and its progress), interned to a small integer,
// with the transition of every (state, byte) computed once and cached. A state with no stack
// is dead. Every state reached from the start without dying can still be completed (the
// grammars are built without dead ends), so a token whose bytes keep the state alive may be
// generated.
//
// Bounds that keep the state space finite and the output from running away: whitespace runs
// of at most kMaxWhitespace bytes with at most kMaxNewlines line breaks (none at all in a
// compact grammar), numbers of at most kMaxNumberBytes bytes, stacks of at most
// kMaxDepth frames (deeper nesting is refused at its opening bracket).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace oasis::structured {

inline constexpr int32_t kMaxWhitespace = 20;
inline constexpr int32_t kMaxNewlines = 2;
inline constexpr int32_t kMaxNumberBytes = 32;
inline constexpr int32_t kMaxDepth = 160;

enum class NodeKind : uint8_t {
  kLiteral,  // exactly `text`
  kSeq,      // `children` one after the other
  kAlt,      // one of `children`
  kWs,       // 0..kMaxWhitespace of ' ', '\t', '\n', '\r' (at most kMaxNewlines '\n')
  kString,   // a JSON string of min_count..max_count characters (max -1: unbounded)
  kNumber,   // a JSON number (`integer`: -?(0|[1-9][0-9]*))
  kObject,   // '{' members '}' (see ObjectMember)
  kArray,    // '[' items ']' of `item`, min_count..max_count of them
  kBytes,    // one byte of the set `bytes` (regular expressions' classes, as UTF-8)
  kRepeat,   // `children[0]`, min_count..max_count times (max -1: unbounded)
};

// An object's listed property: `member` is the node Seq('"name"', ws, ':', ws, value).
struct ObjectMember {
  int32_t member = -1;
  bool required = false;
};

struct Node {
  NodeKind kind = NodeKind::kLiteral;
  std::string text;
  std::vector<int32_t> children;
  int32_t min_count = 0;
  int32_t max_count = -1;
  bool integer = false;
  // Objects: the listed properties, in the order they must appear (optional ones may be
  // left out); then, when `additional` >= 0 (the node Seq(string, ws, ':', ws, value)), any
  // number of further members.
  std::vector<ObjectMember> members;
  int32_t additional = -1;
  int32_t item = -1;                // arrays
  std::array<uint64_t, 4> bytes{};  // kBytes: bit b of bytes[b / 64] is byte b
};

class Grammar {
 public:
  int32_t Add(Node node);
  int32_t Literal(std::string text);
  int32_t Seq(std::vector<int32_t> children);
  int32_t Alt(std::vector<int32_t> children);
  int32_t Ws();
  int32_t String(int32_t min_count = 0, int32_t max_count = -1);
  int32_t Number(bool integer);
  int32_t Array(int32_t item, int32_t min_count = 0, int32_t max_count = -1);
  // An object node whose members are filled in later (recursive schemas).
  int32_t Object();
  // Seq('"name"', ws, ':', ws, value) with `name` written as JSON.
  int32_t Member(const std::string& json_name, int32_t value);
  // Any JSON value (made once per grammar).
  int32_t AnyValue();
  // One byte in lo..hi.
  int32_t Bytes(uint8_t lo, uint8_t hi);
  int32_t Repeat(int32_t child, int32_t min_count, int32_t max_count);

  Node& node(int32_t id) { return nodes_[static_cast<size_t>(id)]; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t ws_node() const { return ws_; }
  // The whitespace between JSON tokens from now on (a whitespace pattern's node; set first).
  void SetWs(int32_t node) { ws_ = node; }
  // Whether a node can reach itself without a byte matched in between (the matcher would
  // recurse without end): such grammars are refused by whoever builds them.
  bool LeftRecursive() const;
  // For each node, whether it matches the empty text.
  std::vector<uint8_t> NullableNodes() const;
  // For each node, whether some finite text completes it (false: every way through it needs
  // itself again, as a rule with no way out).
  std::vector<uint8_t> EndingNodes() const;

  int32_t root = -1;
  bool compact = false;  // no whitespace between tokens (vLLM's disable_any_whitespace)

 private:
  // For each node: `leaf` of a node without children, else a sequence's all, alternatives'
  // any, a repetition of at least zero or of a child it holds for (a least fixed point).
  std::vector<uint8_t> Closure(bool (*leaf)(const Node&)) const;

  std::vector<Node> nodes_;
  int32_t any_value_ = -1;
  int32_t ws_ = -1;
};

// One frame of a stack: the node and its progress (meaning depends on the kind).
struct Frame {
  int32_t node = 0;
  int32_t a = 0;
  int32_t b = 0;
  int32_t c = 0;
  bool operator==(const Frame&) const = default;
};
using Stack = std::vector<Frame>;

// Runs one grammar. Not thread-safe (callers lock). States only grow: one matcher serves one
// request.
class GrammarMatcher {
 public:
  static constexpr int32_t kDead = -1;
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  int32_t start() const { return start_; }
  int32_t Next(int32_t state, uint8_t byte);
  int32_t Next(int32_t state, std::string_view bytes);
  // Whether the bytes so far are a whole match (may also continue).
  bool Accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Whether any byte may follow.
  bool CanContinue(int32_t state);
  size_t num_states() const { return states_.size(); }
  // Frames the matcher has fed and produced in all (its work: what copying, feeding, sorting
  // and keying cost).
  uint64_t work() const { return work_; }
  // At most this many stacks a state (ambiguous grammars: the rest are dropped, which only
  // narrows what may follow), and this many states and frames in them a matcher (a request's
  // text past them is dead: only the end of the sequence may follow). Together they bound a
  // request's memory (~120 MB: the frames, their keys, the transition tables); the time of a
  // step's mask is bounded by GrammarConstraint::kMaxWalkWork.
  static constexpr size_t kMaxStacks = 256;
  static constexpr size_t kMaxStates = 50000;
  static constexpr size_t kMaxStoredFrames = size_t{1} << 21;

 private:
  int32_t Intern(std::vector<Stack> stacks);
  void Feed(Stack st, uint8_t c, std::vector<Stack>& out) const;
  void FinishTop(Stack st, uint8_t c, std::vector<Stack>& out) const;
  void Push(Stack& st, int32_t node) const;
  void Settle(Stack& st) const;
  bool CanFinish(const Stack& st) const;
  bool Nullable(int32_t node) const { return nullable_[static_cast<size_t>(node)] != 0; }
  // Whether the node's frame, with the child it pushed completed, has nothing left that must
  // be matched (it can be popped now or later).
  bool RestNullable(const Frame& f) const;

  std::shared_ptr<const Grammar> g_;
  std::vector<uint8_t> nullable_;
  bool has_repeat_ = false;  // (JSON grammars have none: no repetition flags to clear)
  std::vector<std::vector<Stack>> states_;
  std::vector<uint8_t> accepting_;
  std::vector<std::unique_ptr<std::array<int32_t, 256>>> next_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t start_ = kDead;
  uint64_t work_ = 0;
  size_t stored_frames_ = 0;
};

}  // namespace oasis::structured
