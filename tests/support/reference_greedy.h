// Greedy generation checked against a fixture's transformers reference (reference.safetensors
// of tools/gen_model_fixtures.py and its kin: prompt{i}.ids / greedy / greedy_margin), shared by
// the CPU and CUDA shape tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "engine/generator.h"
#include "loader/safetensors.h"
#include "test_support.h"

namespace oasis::testing {

// Runs the reference's three prompts greedily on `gen`; where the tokens leave transformers'
// greedy ones, the reference's top-1/top-2 margin there must be below `max_margin` (a near-tie
// the backend's arithmetic may flip). `label` names the backend and fixture in the warning.
inline void CheckGreedyAgainstReference(Generator& gen, const SafetensorsFile& ref,
                                        const std::string& label, float max_margin) {
  for (int p = 0; p < 3; ++p) {
    const std::string pre = "prompt" + std::to_string(p);
    auto ids64 = TensorVector<int64_t>(ref, pre + ".ids");
    auto want = TensorVector<int64_t>(ref, pre + ".greedy");
    auto margins = TensorVector<float>(ref, pre + ".greedy_margin");
    GenerationRequest r;
    r.prompt.assign(ids64.begin(), ids64.end());
    r.max_tokens = static_cast<int>(want.size());
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    auto g = gen.Generate({r});
    REQUIRE(g.ok());
    const auto& got = (*g)[0].tokens;
    REQUIRE(got.size() == want.size());
    size_t first = 0;
    while (first < got.size() && got[first] == want[first]) ++first;
    if (first < got.size()) {
      WARN(label << " " << pre << ": greedy diverges from transformers at step " << first
                 << " (top-1/top-2 margin there " << margins[first] << ")");
      CHECK(margins[first] < max_margin);  // only a near-tie may flip
    }
  }
}

}  // namespace oasis::testing
