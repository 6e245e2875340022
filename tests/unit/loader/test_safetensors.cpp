// Safetensors header validation (from memory) and SafetensorsFile (mmap).
#include <catch2/catch.hpp>

#include <string>

#include "loader/safetensors.h"
#include "safetensors_builder.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::testing;
using Catch::Matchers::Contains;

namespace {

StatusOr<SafetensorsHeader> Parse(const std::string& image) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size(),
                                "bad.safetensors");
}

// A one-tensor header: {"w": {"dtype": D, "shape": S, "data_offsets": O}}.
std::string OneTensor(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

void ExpectError(const std::string& image, StatusCode code, const std::string& fragment) {
  auto parsed = Parse(image);
  INFO("expected " << StatusCodeName(code) << " containing '" << fragment << "'");
  REQUIRE_FALSE(parsed.ok());
  INFO(parsed.status().ToString());
  CHECK(parsed.status().code() == code);
  CHECK_THAT(parsed.status().message(), Contains("bad.safetensors"));
  CHECK_THAT(parsed.status().message(), Contains(fragment));
}

std::string GoodImage() {
  return BuildSafetensors(
      {{"a.weight", "F32", {2, 3}, BytesOf<float>({1, 2, 3, 4, 5, 6})},
       {"b.bias", "BF16", {4}, Bf16BytesOf({0.5f, -1.0f, 2.0f, 3.25f})},
       {"c.empty", "I64", {0, 7}, ""},
       {"d.ids", "I32", {}, BytesOf<int32_t>({42})}},
      {{"format", "pt"}});
}

}  // namespace

TEST_CASE("safetensors: a good header parses with every field", "[loader][safetensors]") {
  const std::string image = GoodImage();
  auto parsed = Parse(image);
  REQUIRE(parsed.ok());
  const SafetensorsHeader& h = *parsed;
  CHECK(h.data_offset == 8 + h.header_size);
  CHECK(h.data_size == 24 + 8 + 0 + 4);
  CHECK(h.tensors.size() == 4);
  CHECK(h.metadata.at("format") == "pt");
  const SafetensorsEntry* a = h.Find("a.weight");
  REQUIRE(a != nullptr);
  CHECK(a->dtype == DType::kF32);
  CHECK(a->shape == std::vector<int64_t>{2, 3});
  CHECK(a->numel() == 6);
  CHECK(a->nbytes() == 24);
  const SafetensorsEntry* b = h.Find("b.bias");
  REQUIRE(b != nullptr);
  CHECK(b->dtype == DType::kBF16);
  CHECK(b->begin == 24);
  CHECK(b->end == 32);
  const SafetensorsEntry* scalar = h.Find("d.ids");
  REQUIRE(scalar != nullptr);
  CHECK(scalar->shape.empty());
  CHECK(scalar->numel() == 1);
  CHECK(h.Find("c.empty")->nbytes() == 0);
  CHECK(h.Find("missing") == nullptr);
}

TEST_CASE("safetensors: edge cases that are valid", "[loader][safetensors]") {
  SECTION("empty header object") {
    auto parsed = Parse(RawImage("{}"));
    REQUIRE(parsed.ok());
    CHECK(parsed->tensors.empty());
  }
  SECTION("trailing spaces and trailing unused data bytes") {
    auto parsed = Parse(RawImage(OneTensor("U8", "[3]", "[0,3]") + "     ", "abcXYZ"));
    REQUIRE(parsed.ok());
    CHECK(parsed->data_size == 6);
  }
  SECTION("every dtype name") {
    for (const char* d : {"BF16", "F16", "F32", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
      size_t size = DTypeSize(*DTypeFromName(d));
      auto parsed = Parse(RawImage(OneTensor(d, "[2]", "[0," + std::to_string(2 * size) + "]"),
                                   std::string(2 * size, '\0')));
      INFO(d);
      REQUIRE(parsed.ok());
      CHECK(DTypeName(parsed->tensors[0].dtype) == d);
    }
  }
  SECTION("zero-sized tensors at the same offset do not overlap") {
    auto parsed = Parse(RawImage(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                 R"("y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                                 std::string(4, '\0')));
    REQUIRE(parsed.ok());
    CHECK(parsed->tensors.size() == 3);
  }
}

TEST_CASE("safetensors: structural damage is DataLoss", "[loader][safetensors]") {
  SECTION("file shorter than 8 bytes") { ExpectError("\x05\x00\x00", StatusCode::kDataLoss, "too short"); }
  SECTION("empty file") { ExpectError("", StatusCode::kDataLoss, "too short"); }
  SECTION("header length beyond the file") {
    ExpectError(Le64(1000) + "{}", StatusCode::kDataLoss, "past the end");
  }
  SECTION("header length near 2^64 does not wrap") {
    ExpectError(Le64(~0ull) + "{}", StatusCode::kDataLoss, "past the end");
  }
  SECTION("non-JSON header") { ExpectError(RawImage("{not json"), StatusCode::kDataLoss, "not valid JSON"); }
  SECTION("empty header") { ExpectError(RawImage(""), StatusCode::kDataLoss, "not valid JSON"); }
  SECTION("header is a JSON array") { ExpectError(RawImage("[1,2]"), StatusCode::kDataLoss, "not a JSON object"); }
  SECTION("header nested 100,000 deep") {
    ExpectError(RawImage("{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}"), StatusCode::kDataLoss,
                "deeper than 256 levels");
  }
  SECTION("offsets outside the data section") {
    ExpectError(RawImage(OneTensor("F32", "[2]", "[0,8]"), std::string(4, '\0')), StatusCode::kDataLoss,
                "outside the data section");
  }
  SECTION("offsets near 2^64") {
    ExpectError(RawImage(OneTensor("U8", "[1]", "[18446744073709551614,18446744073709551615]"), "x"),
                StatusCode::kDataLoss, "'w'");
  }
  SECTION("every truncation of a good file fails cleanly") {
    const std::string image = GoodImage();
    for (size_t n = 0; n < image.size(); ++n) {
      auto parsed = Parse(image.substr(0, n));
      INFO("prefix of " << n << " bytes");
      // A cut inside the (back-to-back) data section always loses the last tensor's bytes.
      CHECK_FALSE(parsed.ok());
    }
    CHECK(Parse(image).ok());
  }
}

TEST_CASE("safetensors: bad entries are InvalidArgument naming the tensor", "[loader][safetensors]") {
  const std::string four(4, '\0');
  SECTION("unknown dtype") {
    ExpectError(RawImage(OneTensor("F6_E3M2", "[4]", "[0,4]"), four), StatusCode::kInvalidArgument,
                "unknown dtype \"F6_E3M2\"");
  }
  SECTION("shape and byte count disagree") {
    ExpectError(RawImage(OneTensor("F32", "[2,3]", "[0,20]"), std::string(24, '\0')),
                StatusCode::kInvalidArgument, "needs 24 bytes");
  }
  SECTION("begin after end") {
    ExpectError(RawImage(OneTensor("U8", "[0]", "[4,2]"), four), StatusCode::kInvalidArgument, "begin > end");
  }
  SECTION("negative dimension") {
    ExpectError(RawImage(OneTensor("U8", "[-1,4]", "[0,4]"), four), StatusCode::kInvalidArgument,
                "negative dimension");
  }
  SECTION("non-integer dimension") {
    ExpectError(RawImage(OneTensor("U8", "[2.5]", "[0,4]"), four), StatusCode::kInvalidArgument,
                "non-integer");
    ExpectError(RawImage(OneTensor("U8", "[\"4\"]", "[0,4]"), four), StatusCode::kInvalidArgument,
                "non-integer");
  }
  SECTION("huge dimensions overflow") {
    ExpectError(RawImage(OneTensor("F32", "[4294967296,4294967296,16]", "[0,4]"), four),
                StatusCode::kInvalidArgument, "overflows");
    ExpectError(RawImage(OneTensor("BF16", "[4611686018427387904,2]", "[0,4]"), four),
                StatusCode::kInvalidArgument, "overflows");
    ExpectError(RawImage(OneTensor("U8", "[9223372036854775808]", "[0,4]"), four),
                StatusCode::kInvalidArgument, "too large");
    ExpectError(RawImage(OneTensor("U8", "[1e30]", "[0,4]"), four), StatusCode::kInvalidArgument,
                "non-integer");
  }
  SECTION("overflowing product that wraps to the right byte count is still rejected") {
    // 2^62 * 4 bytes wraps to 0 in 64 bits: must not pass as an empty tensor.
    ExpectError(RawImage(OneTensor("F32", "[4611686018427387904]", "[0,0]")),
                StatusCode::kInvalidArgument, "overflows");
  }
  SECTION("overlapping tensors") {
    ExpectError(RawImage(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, '\0')),
                StatusCode::kInvalidArgument, "'first' and 'second' overlap");
  }
  SECTION("the same range twice") {
    ExpectError(RawImage(R"({"p":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("q":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", four),
                StatusCode::kInvalidArgument, "overlap");
  }
  SECTION("duplicate tensor name") {
    ExpectError(RawImage(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                         R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", four),
                StatusCode::kInvalidArgument, "'w' appears twice");
  }
  SECTION("malformed entries") {
    ExpectError(RawImage(R"({"w": 3})"), StatusCode::kInvalidArgument, "'w': entry is not a JSON object");
    ExpectError(RawImage(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "x"), StatusCode::kInvalidArgument,
                "\"dtype\"");
    ExpectError(RawImage(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "x"), StatusCode::kInvalidArgument,
                "\"shape\"");
    ExpectError(RawImage(R"({"w":{"dtype":"U8","shape":[1]}})", "x"), StatusCode::kInvalidArgument,
                "data_offsets");
    ExpectError(RawImage(OneTensor("U8", "[1]", "[0,1,2]"), "xx"), StatusCode::kInvalidArgument, "data_offsets");
    ExpectError(RawImage(OneTensor("U8", "[1]", "[-1,0]"), "xx"), StatusCode::kInvalidArgument, "data_offsets");
  }
  SECTION("bad metadata") {
    ExpectError(RawImage(R"({"__metadata__":{"format":1}})"), StatusCode::kInvalidArgument, "'format'");
    ExpectError(RawImage(R"({"__metadata__":[]})"), StatusCode::kInvalidArgument, "__metadata__");
  }
}

TEST_CASE("SafetensorsFile: maps a file and views tensor bytes", "[loader][safetensors]") {
  const auto dir = MakeTempDir("st-file");
  WriteBinaryFile(dir / "m.safetensors", GoodImage());
  auto file = SafetensorsFile::Open(dir / "m.safetensors");
  REQUIRE(file.ok());
  CHECK(file->Names() == std::vector<std::string>{"a.weight", "b.bias", "c.empty", "d.ids"});
  CHECK(file->Has("b.bias"));
  CHECK(file->metadata().at("format") == "pt");
  auto bytes = file->TensorBytes("a.weight");
  REQUIRE(bytes.ok());
  REQUIRE(bytes->size() == 24);
  float values[6];
  std::memcpy(values, bytes->data(), 24);
  CHECK(values[0] == 1.0f);
  CHECK(values[5] == 6.0f);
  auto ids = file->TensorBytes("d.ids");
  REQUIRE(ids.ok());
  int32_t id;
  std::memcpy(&id, ids->data(), 4);
  CHECK(id == 42);

  auto missing = file->TensorBytes("nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("nope"));
  CHECK_THAT(missing.status().message(), Contains("m.safetensors"));

  // Moving keeps the mapping valid.
  SafetensorsFile moved = std::move(file).value();
  CHECK(moved.TensorBytes("b.bias")->size() == 8);
}

TEST_CASE("SafetensorsFile: open errors", "[loader][safetensors]") {
  const auto dir = MakeTempDir("st-open");
  auto missing = SafetensorsFile::Open(dir / "absent.safetensors");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("absent.safetensors"));

  WriteBinaryFile(dir / "empty.safetensors", "");
  auto empty = SafetensorsFile::Open(dir / "empty.safetensors");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(empty.status().message(), Contains("empty.safetensors"));

  auto directory = SafetensorsFile::Open(dir);
  REQUIRE_FALSE(directory.ok());
  CHECK(directory.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("SafetensorsFile: a checkpoint written by transformers", "[loader][safetensors]") {
  const auto path = FixturePath("models/qwen3-tiny/model.safetensors");
  REQUIRE(std::filesystem::exists(path));
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK(file->header().tensors.size() == 35);
  CHECK(file->metadata().at("format") == "pt");
  const SafetensorsEntry* embed = file->Find("model.embed_tokens.weight");
  REQUIRE(embed != nullptr);
  CHECK(embed->dtype == DType::kBF16);
  CHECK(embed->shape == std::vector<int64_t>{512, 64});
  const SafetensorsEntry* q = file->Find("model.layers.2.self_attn.q_proj.weight");
  REQUIRE(q != nullptr);
  CHECK(q->shape == std::vector<int64_t>{128, 64});  // 4 heads x head_dim 32, hidden 64
}
