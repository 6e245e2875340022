// OpenSafetensorsWeights: single files, directories, sharded checkpoints, Load/LoadSlice.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "loader/weights.h"
#include "safetensors_builder.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::testing;
using Catch::Matchers::Contains;

namespace {

std::vector<float> Iota(int n, float scale = 1.0f) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<float>(i) * scale);
  return v;
}

std::vector<float> ToFloats(const Tensor& t) {
  Tensor f = t.ToFloat();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// Shard 1: embed [4, 3] F32 (0..11), norm [3] BF16. Shard 2: proj [2, 3, 2] BF16 (0..11 / 4),
// ids [3] I64.
void WriteShardedCheckpoint(const std::filesystem::path& dir) {
  WriteBinaryFile(dir / "model-00001-of-00002.safetensors",
                  BuildSafetensors({{"embed", "F32", {4, 3}, BytesOf(Iota(12))},
                                    {"norm", "BF16", {3}, Bf16BytesOf({1.0f, 0.5f, -2.0f})}}));
  WriteBinaryFile(dir / "model-00002-of-00002.safetensors",
                  BuildSafetensors({{"proj", "BF16", {2, 3, 2}, Bf16BytesOf(Iota(12, 0.25f))},
                                    {"ids", "I64", {3}, BytesOf<int64_t>({7, -8, 9})}}));
}

nlohmann::json ShardedIndex() {
  return {{"metadata", {{"total_size", 1234}}},
          {"weight_map",
           {{"embed", "model-00001-of-00002.safetensors"},
            {"norm", "model-00001-of-00002.safetensors"},
            {"proj", "model-00002-of-00002.safetensors"},
            {"ids", "model-00002-of-00002.safetensors"}}}};
}

void WriteIndex(const std::filesystem::path& dir, const nlohmann::json& index) {
  WriteBinaryFile(dir / "model.safetensors.index.json", index.dump(2));
}

void ExpectOpenError(const std::filesystem::path& dir, StatusCode code,
                     const std::vector<std::string>& fragments) {
  auto opened = OpenSafetensorsWeights(dir);
  REQUIRE_FALSE(opened.ok());
  INFO(opened.status().ToString());
  CHECK(opened.status().code() == code);
  for (const auto& f : fragments) CHECK_THAT(opened.status().message(), Contains(f));
}

}  // namespace

TEST_CASE("weights: single file, Load with dtype conversion", "[loader][weights]") {
  const auto dir = MakeTempDir("w-single");
  // bf16 values chosen to be exact in bf16 (and therefore in f32 and f16).
  const std::vector<float> values = {1.0f, -2.5f, 0.15625f, 3.0e38f, -0.0f, 1.0e-30f};
  WriteBinaryFile(dir / "model.safetensors",
                  BuildSafetensors({{"w", "BF16", {2, 3}, Bf16BytesOf(values)},
                                    {"f", "F32", {3}, BytesOf<float>({0.1f, 1.0f / 3, 65504.0f})},
                                    {"d", "F64", {2}, BytesOf<double>({0.5, -4.0})},
                                    {"mask", "BOOL", {2}, std::string("\x01\x00", 2)}}));
  auto source = OpenSafetensorsWeights(dir);
  REQUIRE(source.ok());
  const WeightSource& w = **source;
  CHECK(w.Names() == std::vector<std::string>{"d", "f", "mask", "w"});
  CHECK(w.Has("w"));
  CHECK_FALSE(w.Has("x"));
  CHECK_THAT(w.Describe(), Contains("model.safetensors"));
  auto info = w.Info("w");
  REQUIRE(info.ok());
  CHECK(info->dtype == DType::kBF16);
  CHECK(info->shape == std::vector<int64_t>{2, 3});

  SECTION("bf16 -> f32 is exact") {
    auto t = w.Load("w", DType::kF32);
    REQUIRE(t.ok());
    CHECK(t->dtype() == DType::kF32);
    CHECK(t->shape() == std::vector<int64_t>{2, 3});
    for (size_t i = 0; i < values.size(); ++i) {
      CHECK(t->data<float>()[i] == Bf16BitsToFloat(FloatToBf16Bits(values[i])));
    }
    CHECK(std::signbit(t->data<float>()[4]));
  }
  SECTION("bf16 -> bf16 keeps the bits") {
    auto t = w.Load("w", DType::kBF16);
    REQUIRE(t.ok());
    for (size_t i = 0; i < values.size(); ++i) CHECK(t->data<uint16_t>()[i] == FloatToBf16Bits(values[i]));
  }
  SECTION("f32 -> bf16 rounds to nearest even, f32 -> f16") {
    auto t = w.Load("f", DType::kBF16);
    REQUIRE(t.ok());
    CHECK(t->data<uint16_t>()[0] == FloatToBf16Bits(0.1f));
    CHECK(t->data<uint16_t>()[1] == FloatToBf16Bits(1.0f / 3));
    auto h = w.Load("f", DType::kF16);
    REQUIRE(h.ok());
    CHECK(F16BitsToFloat(h->data<uint16_t>()[2]) == 65504.0f);
  }
  SECTION("f64 -> f32") {
    auto t = w.Load("d", DType::kF32);
    REQUIRE(t.ok());
    CHECK(ToFloats(*t) == std::vector<float>{0.5f, -4.0f});
  }
  SECTION("bool only as bool") {
    auto t = w.Load("mask", DType::kBool);
    REQUIRE(t.ok());
    CHECK(t->data<uint8_t>()[0] == 1);
    CHECK(t->data<uint8_t>()[1] == 0);
    auto bad = w.Load("mask", DType::kF32);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.status().message(), Contains("'mask'"));
  }
  SECTION("float tensors cannot become integers") {
    auto bad = w.Load("w", DType::kI32);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("unknown tensor is NotFound naming it") {
    auto bad = w.Load("nope", DType::kF32);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kNotFound);
    CHECK_THAT(bad.status().message(), Contains("'nope'"));
    CHECK(w.Info("nope").status().code() == StatusCode::kNotFound);
  }
  SECTION("a file path works as well as its directory") {
    auto file_source = OpenSafetensorsWeights(dir / "model.safetensors");
    REQUIRE(file_source.ok());
    CHECK((*file_source)->Names().size() == 4);
  }
}

TEST_CASE("weights: unaligned tensor data converts correctly", "[loader][weights]") {
  const auto dir = MakeTempDir("w-unaligned");
  // A 1-byte tensor first puts the f32 tensor at an odd data offset.
  WriteBinaryFile(dir / "x.safetensors",
                  BuildSafetensors({{"a", "U8", {1}, "z"},
                                    {"b", "F32", {3}, BytesOf<float>({1.5f, -2.0f, 1e-3f})},
                                    {"c", "BF16", {2}, Bf16BytesOf({4.0f, 8.0f})}}));
  auto w = OpenSafetensorsWeights(dir);
  REQUIRE(w.ok());
  auto b = (*w)->Load("b", DType::kBF16);
  REQUIRE(b.ok());
  CHECK(ToFloats(*b) == std::vector<float>{1.5f, -2.0f, Bf16BitsToFloat(FloatToBf16Bits(1e-3f))});
  auto c = (*w)->Load("c", DType::kF32);
  REQUIRE(c.ok());
  CHECK(ToFloats(*c) == std::vector<float>{4.0f, 8.0f});
}

TEST_CASE("weights: LoadSlice rows, columns and dim 0 of any rank", "[loader][weights]") {
  const auto dir = MakeTempDir("w-slice");
  WriteShardedCheckpoint(dir);
  WriteIndex(dir, ShardedIndex());
  auto opened = OpenSafetensorsWeights(dir);
  REQUIRE(opened.ok());
  const WeightSource& w = **opened;

  SECTION("rows of a 2-D tensor") {
    auto t = w.LoadSlice("embed", 0, 1, 3, DType::kF32);
    REQUIRE(t.ok());
    CHECK(t->shape() == std::vector<int64_t>{2, 3});
    CHECK(ToFloats(*t) == std::vector<float>{3, 4, 5, 6, 7, 8});
  }
  SECTION("columns of a 2-D tensor, converted") {
    auto t = w.LoadSlice("embed", 1, 1, 3, DType::kBF16);
    REQUIRE(t.ok());
    CHECK(t->shape() == std::vector<int64_t>{4, 2});
    CHECK(ToFloats(*t) == std::vector<float>{1, 2, 4, 5, 7, 8, 10, 11});
  }
  SECTION("slices equal the same part of the full tensor") {
    auto full = w.Load("embed", DType::kF32);
    REQUIRE(full.ok());
    for (int64_t b = 0; b <= 4; ++b) {
      for (int64_t e = b; e <= 4; ++e) {
        auto part = w.LoadSlice("embed", 0, b, e, DType::kF32);
        REQUIRE(part.ok());
        std::vector<float> expect(full->data<float>() + b * 3, full->data<float>() + e * 3);
        CHECK(ToFloats(*part) == expect);
      }
    }
  }
  SECTION("dim 0 of a 3-D tensor and dim 1 of a 3-D tensor") {
    auto t = w.LoadSlice("proj", 0, 1, 2, DType::kF32);
    REQUIRE(t.ok());
    CHECK(t->shape() == std::vector<int64_t>{1, 3, 2});
    CHECK(ToFloats(*t) == std::vector<float>{1.5f, 1.75f, 2.0f, 2.25f, 2.5f, 2.75f});
    auto m = w.LoadSlice("proj", 1, 2, 3, DType::kF32);
    REQUIRE(m.ok());
    CHECK(m->shape() == std::vector<int64_t>{2, 1, 2});
    CHECK(ToFloats(*m) == std::vector<float>{1.0f, 1.25f, 2.5f, 2.75f});
  }
  SECTION("1-D and integer slices") {
    auto t = w.LoadSlice("ids", 0, 1, 3, DType::kI64);
    REQUIRE(t.ok());
    CHECK(t->data<int64_t>()[0] == -8);
    CHECK(t->data<int64_t>()[1] == 9);
    auto empty = w.LoadSlice("norm", 0, 2, 2, DType::kF32);
    REQUIRE(empty.ok());
    CHECK(empty->numel() == 0);
  }
  SECTION("bad slices") {
    auto past = w.LoadSlice("embed", 0, 2, 5, DType::kF32);
    REQUIRE_FALSE(past.ok());
    CHECK(past.status().code() == StatusCode::kOutOfRange);
    CHECK_THAT(past.status().message(), Contains("'embed'"));
    CHECK(w.LoadSlice("embed", 0, 3, 2, DType::kF32).status().code() == StatusCode::kOutOfRange);
    CHECK(w.LoadSlice("embed", 0, -1, 2, DType::kF32).status().code() == StatusCode::kOutOfRange);
    CHECK(w.LoadSlice("embed", 2, 0, 1, DType::kF32).status().code() == StatusCode::kInvalidArgument);
    CHECK(w.LoadSlice("norm", 1, 0, 1, DType::kF32).status().code() == StatusCode::kInvalidArgument);
    CHECK(w.LoadSlice("embed", -1, 0, 1, DType::kF32).status().code() == StatusCode::kInvalidArgument);
    CHECK(w.LoadSlice("nope", 0, 0, 1, DType::kF32).status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("weights: sharded checkpoint through the index", "[loader][weights]") {
  const auto dir = MakeTempDir("w-sharded");
  WriteShardedCheckpoint(dir);

  SECTION("good index") {
    WriteIndex(dir, ShardedIndex());
    auto opened = OpenSafetensorsWeights(dir);
    REQUIRE(opened.ok());
    CHECK((*opened)->Names() == std::vector<std::string>{"embed", "ids", "norm", "proj"});
    CHECK_THAT((*opened)->Describe(), Contains("model.safetensors.index.json"));
    auto norm = (*opened)->Load("norm", DType::kF32);
    REQUIRE(norm.ok());
    CHECK(ToFloats(*norm) == std::vector<float>{1.0f, 0.5f, -2.0f});
  }
  SECTION("only tensors named in the map are exposed") {
    nlohmann::json index = ShardedIndex();
    index["weight_map"].erase("ids");
    WriteIndex(dir, index);
    auto opened = OpenSafetensorsWeights(dir);
    REQUIRE(opened.ok());
    CHECK_FALSE((*opened)->Has("ids"));
    CHECK((*opened)->Names().size() == 3);
  }
  SECTION("an index that is /dev/zero is an error, not an endless read") {
    std::filesystem::create_symlink("/dev/zero", dir / "model.safetensors.index.json");
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"index.json", "is not a regular file"});
  }
  SECTION("missing shard") {
    nlohmann::json index = ShardedIndex();
    index["weight_map"]["proj"] = "model-00003-of-00002.safetensors";
    WriteIndex(dir, index);
    ExpectOpenError(dir, StatusCode::kNotFound, {"model-00003-of-00002.safetensors", "index.json"});
  }
  SECTION("index names a tensor its shard lacks") {
    nlohmann::json index = ShardedIndex();
    index["weight_map"]["lm_head"] = "model-00002-of-00002.safetensors";
    WriteIndex(dir, index);
    ExpectOpenError(dir, StatusCode::kNotFound, {"'lm_head'", "model-00002-of-00002.safetensors"});
  }
  SECTION("index places a tensor in the wrong shard") {
    nlohmann::json index = ShardedIndex();
    index["weight_map"]["embed"] = "model-00002-of-00002.safetensors";
    WriteIndex(dir, index);
    ExpectOpenError(dir, StatusCode::kNotFound, {"'embed'"});
  }
  SECTION("a corrupt shard is reported with its name") {
    WriteIndex(dir, ShardedIndex());
    WriteBinaryFile(dir / "model-00002-of-00002.safetensors", Le64(100) + "{}");
    ExpectOpenError(dir, StatusCode::kDataLoss, {"model-00002-of-00002.safetensors"});
  }
  SECTION("malformed index files") {
    WriteBinaryFile(dir / "model.safetensors.index.json", "{\"weight_map\": ");
    ExpectOpenError(dir, StatusCode::kDataLoss, {"index.json", "not valid JSON"});
    WriteIndex(dir, {{"metadata", {}}});
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"weight_map"});
    WriteIndex(dir, {{"weight_map", {{"embed", 3}}}});
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"'embed'"});
    WriteIndex(dir, {{"weight_map", {{"embed", "../model-00001-of-00002.safetensors"}}}});
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"'embed'"});
    WriteIndex(dir, {{"weight_map", nlohmann::json::object()}});
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"empty"});
  }
}

TEST_CASE("weights: directory without an index", "[loader][weights]") {
  const auto dir = MakeTempDir("w-dir");
  SECTION("all *.safetensors files are merged") {
    WriteShardedCheckpoint(dir);
    WriteBinaryFile(dir / "notes.txt", "not a checkpoint");
    auto opened = OpenSafetensorsWeights(dir);
    REQUIRE(opened.ok());
    CHECK((*opened)->Names() == std::vector<std::string>{"embed", "ids", "norm", "proj"});
    auto proj = (*opened)->Load("proj", DType::kF32);
    REQUIRE(proj.ok());
    CHECK(proj->data<float>()[11] == 2.75f);
  }
  SECTION("duplicate names across files") {
    WriteShardedCheckpoint(dir);
    WriteBinaryFile(dir / "extra.safetensors",
                    BuildSafetensors({{"norm", "BF16", {3}, Bf16BytesOf({1, 1, 1})}}));
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"'norm'", "extra.safetensors", "model-00001"});
  }
  SECTION("no checkpoint files") {
    ExpectOpenError(dir, StatusCode::kNotFound, {dir.string()});
  }
  SECTION("missing directory") {
    ExpectOpenError(dir / "absent", StatusCode::kNotFound, {"absent"});
  }
  SECTION("one bad file fails the whole directory") {
    WriteShardedCheckpoint(dir);
    WriteBinaryFile(dir / "broken.safetensors",
                    RawImage(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')));
    ExpectOpenError(dir, StatusCode::kInvalidArgument, {"broken.safetensors", "'t'", "needs 12 bytes"});
  }
}

TEST_CASE("weights: a transformers-written checkpoint loads", "[loader][weights]") {
  const auto path = FixturePath("models/llama-tiny-rope-scaling/model.safetensors");
  REQUIRE(std::filesystem::exists(path));
  auto opened = OpenSafetensorsWeights(path);
  REQUIRE(opened.ok());
  const WeightSource& w = **opened;
  auto info = w.Info("model.layers.0.self_attn.k_proj.weight");
  REQUIRE(info.ok());
  CHECK(info->shape == std::vector<int64_t>{64, 128});  // 2 KV heads x head_dim 32, hidden 128
  auto full = w.Load("model.layers.0.self_attn.k_proj.weight", DType::kF32);
  auto cols = w.LoadSlice("model.layers.0.self_attn.k_proj.weight", 1, 64, 128, DType::kF32);
  REQUIRE(full.ok());
  REQUIRE(cols.ok());
  bool any_nonzero = false;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      REQUIRE(cols->data<float>()[r * 64 + c] == full->data<float>()[r * 128 + 64 + c]);
      any_nonzero |= cols->data<float>()[r * 64 + c] != 0.0f;
    }
  }
  CHECK(any_nonzero);
  auto norm = w.Load("model.norm.weight", DType::kF32);
  REQUIRE(norm.ok());
  CHECK(norm->numel() == 128);
}
