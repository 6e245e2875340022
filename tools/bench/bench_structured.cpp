// bench_structured: the host cost of structured output (docs/structured_output.md) per step of
// one constrained sequence, with a real tokenizer: the mask of a new parser state (the
// vocabulary walked), of a cached one, and the row's logits entries built from it (what the
// logits processing hands the device). CPU only.
//
//   bench_structured --tokenizer .cache/test-data/qwen3/tokenizer.json [--vocab 151936]
//                    [--steps 400] [--seed 1] [--kind json|regex|gbnf] [--gbnf-file FILE]
//                    [--rows N --threads T]
//
// A generation is simulated: each step draws a random allowed token (short ones preferred, as a
// model's would be) until EOS may follow and 40 steps passed. The structure (--kind): a typical
// function-call JSON schema (strings, an enum, numbers, an array), an address-line regular
// expression, or a GBNF expression language (names, calls, lists, numbers). Prints medians and p90
// per kind of step, the share of steps that met a cached state, and the vocabulary walk's rate.
// --rows N: N independent sequences in lockstep instead, each step's masks built by RowEntriesOf
// (what the CUDA logits processor runs) on 1 and on T threads; prints the step's host time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/flags.h"
#include "runner/logits_processing.h"
#include "runner/sampler.h"
#include "tokenizer/structured/gbnf.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/regex.h"
#include "tokenizer/structured/token_constraint.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The ids in [0, vocab) that the ascending masked ids (token_at(0..n)) leave, at most `limit`.
template <typename TokenAt>
std::vector<int32_t> Unmasked(int64_t vocab, size_t n, TokenAt token_at,
                              size_t limit = static_cast<size_t>(-1)) {
  std::vector<int32_t> allowed;
  size_t m = 0;
  for (int32_t id = 0; id < vocab && allowed.size() < limit; ++id) {
    if (m < n && token_at(m) == id) {
      ++m;
    } else {
      allowed.push_back(id);
    }
  }
  return allowed;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path = ".cache/test-data/qwen3/tokenizer.json";
  int64_t vocab = 151936, steps = 400, seed = 1;
  std::string kind = "json";
  FlagParser flags("bench_structured");
  flags.AddString("kind", &kind, "the structure: json (a JSON schema), regex or gbnf");
  std::string gbnf_file;
  flags.AddString("gbnf-file", &gbnf_file, "a GBNF grammar to time instead of the built-in one");
  flags.AddString("tokenizer", &tokenizer_path, "tokenizer.json");
  flags.AddInt("vocab", &vocab, "the model's logits width");
  flags.AddInt("steps", &steps, "steps simulated in all (several generations)");
  flags.AddInt("seed", &seed, "random seed");
  int64_t rows_n = 1, threads = 8;
  flags.AddInt("rows", &rows_n, "sequences in lockstep (> 1: time a step's masks of them all)");
  flags.AddInt("threads", &threads, "--rows: the threads RowEntriesOf may use");
  if (Status st = flags.Parse(argc, argv); !st.ok() || flags.help_requested()) {
    if (flags.help_requested()) {
      std::printf("%s", flags.Usage().c_str());
      return 0;
    }
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto tok = tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 2;
  }
  auto t0 = Clock::now();
  auto v = structured::TokenVocabulary::Build(**tok, vocab);
  const double build_ms = Ms(Clock::now() - t0);
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer"}, "hours": {"type": "array", "items": {"type": "number"}, "maxItems": 8},
      "note": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]}},
      "required": ["city", "unit", "days"], "additionalProperties": false})");
  // (An address line; a small expression language with identifiers, calls and lists.)
  const char* regex =
      R"([A-Z][a-z]{2,15}( [A-Z][a-z]{2,15})?, [A-Z]{2} \d{5}(-\d{4})?( \(.{0,40}\))?)";
  const char* gbnf = R"G(root ::= expr (";" ws expr){0,4}
expr ::= term (ws ("+" | "-" | "*" | "/") ws term)*
term ::= number | name ("(" ws (expr ("," ws expr)*)? ")")? | "[" ws (expr ("," ws expr)*)? "]" | "(" expr ")"
number ::= "-"? [0-9]{1,6} ("." [0-9]{1,4})?
name ::= [a-z_] [a-z0-9_]{0,11}
ws ::= " "?)G";
  std::string gbnf_text = gbnf;
  if (!gbnf_file.empty()) {
    std::ifstream f(gbnf_file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "cannot read %s\n", gbnf_file.c_str());
      return 2;
    }
    gbnf_text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    kind = "gbnf";
  }
  t0 = Clock::now();
  auto grammar = kind == "regex"  ? structured::RegexGrammar(regex)
                 : kind == "gbnf" ? structured::GbnfGrammar(gbnf_text)
                                  : structured::JsonSchemaGrammar(schema);
  const double compile_ms = Ms(Clock::now() - t0);
  if (kind != "json" && kind != "regex" && kind != "gbnf") {
    std::fprintf(stderr, "--kind must be json, regex or gbnf\n");
    return 2;
  }
  if (!grammar.ok()) {
    std::fprintf(stderr, "%s\n", grammar.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> eos;
  for (const char* e : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"}) {
    if (auto id = (*tok)->TokenToId(e)) eos.push_back(*id);
  }
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  if (rows_n > 1) {
    // Lockstep: every step builds all rows' entries at once, as a batch's sampler does.
    std::printf(
        "| rows | threads | steps | median step ms | p90 step ms |\n|---:|---:|---:|---:|---:|\n");
    for (const size_t t : {size_t{1}, static_cast<size_t>(std::max<int64_t>(threads, 1))}) {
      std::mt19937_64 r_rng(static_cast<uint64_t>(seed));
      std::vector<std::vector<int32_t>> outs(static_cast<size_t>(rows_n));
      std::vector<SampleRow> rows(static_cast<size_t>(rows_n));
      for (SampleRow& row : rows) {
        SamplingParams params;
        params.constraint = std::make_shared<structured::GrammarConstraint>(*grammar, v, eos);
        row.processing = LogitsProcessing::For(params, 0, {});
      }
      std::vector<double> step_ms;
      for (int64_t step = 0; step < steps; ++step) {
        for (size_t i = 0; i < rows.size(); ++i) rows[i].output_tokens = outs[i];
        t0 = Clock::now();
        const std::vector<std::vector<LogitsEntry>> all = RowEntriesOf(rows, t);
        step_ms.push_back(Ms(Clock::now() - t0));
        for (size_t i = 0; i < rows.size(); ++i) {  // a random allowed token, EOS restarts
          const std::vector<int32_t> allowed = Unmasked(
              vocab, all[i].size(), [&](size_t k) { return all[i][k].token; }, 4096);
          const int32_t tok =
              allowed.empty()
                  ? eos.front()
                  : allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(r_rng)];
          if (std::find(eos.begin(), eos.end(), tok) != eos.end() || outs[i].size() > 300) {
            outs[i].clear();
          } else {
            outs[i].push_back(tok);
          }
        }
      }
      std::printf("| %lld | %zu | %zu | %.3f | %.3f |\n", static_cast<long long>(rows_n), t,
                  step_ms.size(), Quantile(step_ms, 0.5), Quantile(step_ms, 0.9));
    }
    return 0;
  }
  std::vector<double> fresh, cached, entries_ms, walk_work;
  int64_t done = 0, generations = 0;
  while (done < steps) {
    auto c = std::make_shared<structured::GrammarConstraint>(*grammar, v, eos);
    SamplingParams params;
    params.constraint = c;
    auto processing = LogitsProcessing::For(params, 0, {});
    std::vector<int32_t> out;
    ++generations;
    for (int step = 0; step < 400 && done < steps; ++step, ++done) {
      const size_t walks = c->num_walks();
      const uint64_t work0 = c->work();
      std::vector<int32_t> masked;
      t0 = Clock::now();
      c->Masked(out, {}, &masked);
      const double ms = Ms(Clock::now() - t0);
      (c->num_walks() > walks ? fresh : cached).push_back(ms);
      if (c->num_walks() > walks) walk_work.push_back(static_cast<double>(c->work() - work0));
      t0 = Clock::now();
      const std::vector<LogitsEntry> e = RowEntries(*processing, out, {});
      entries_ms.push_back(Ms(Clock::now() - t0));
      const std::vector<int32_t> allowed =
          Unmasked(vocab, masked.size(), [&](size_t k) { return masked[k]; });
      if (allowed.empty()) break;
      const bool can_end = std::any_of(eos.begin(), eos.end(), [&](int32_t id) {
        return std::binary_search(allowed.begin(), allowed.end(), id);
      });
      if (can_end && step >= 40) break;
      int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      for (int k = 0; k < 4 && v->bytes(t).size() > 2; ++k) {
        t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      }
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
      out.push_back(t);
    }
  }
  std::printf("vocabulary %lld ids (%s): built in %.1f ms; %s grammar compiled in %.3f ms\n",
              static_cast<long long>(vocab), tokenizer_path.c_str(), build_ms, kind.c_str(),
              compile_ms);
  std::printf("%lld steps over %lld generations\n", static_cast<long long>(done),
              static_cast<long long>(generations));
  std::printf("| step | steps | median ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|\n");
  auto row = [](const char* name, const std::vector<double>& x) {
    std::printf("| %s | %zu | %.3f | %.3f | %.3f |\n", name, x.size(), Quantile(x, 0.5),
                Quantile(x, 0.9), x.empty() ? 0.0 : *std::max_element(x.begin(), x.end()));
  };
  row("mask, vocabulary walked (a state not seen before)", fresh);
  row("mask, allowed set cached", cached);
  row("row entries (mask + merge, as the sampler builds them)", entries_ms);
  row("matcher work of a walk (frames fed and produced)", walk_work);
  const double walk = Quantile(fresh, 0.5);
  std::printf(
      "RESULT structured_%s_mask_new_ms=%.3f cached_ms=%.3f entries_ms=%.3f walk_rate=%.1f "
      "Mtok/s\n",
      kind.c_str(), walk, Quantile(cached, 0.5), Quantile(entries_ms, 0.5),
      walk > 0 ? static_cast<double>(vocab) / walk / 1e3 : 0.0);
  return 0;
}
