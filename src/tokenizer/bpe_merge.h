// The BPE merge loop: repeatedly merges the adjacent pair with the lowest merge rank (leftmost on
// ties) until no adjacent pair has a rule. This is exactly the order HF tokenizers' heap-based
// Word::merge_all produces (a stale heap entry can never alias a live pair, see bpe_merge.cpp).
// Free functions; they only read the MergeTable, so they are thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/merge_table.h"

namespace oasis::tokenizer {

// Merges `ids` (the symbols of one word, in order) in place. Picks the quadratic scan for short
// words and the heap for long ones.
void ApplyMerges(const MergeTable& merges, std::vector<int32_t>* ids);

// The two implementations, exposed so tests can check they agree.
void ApplyMergesQuadratic(const MergeTable& merges, std::vector<int32_t>* ids);
void ApplyMergesHeap(const MergeTable& merges, std::vector<int32_t>* ids);

}  // namespace oasis::tokenizer
