// MegatronSink keeps the TensorSink contract: pieces written in any order, interleaved, in any
// chunking give the same files byte for byte as export_megatron (the engine's order); padding rows
// are zeros; an incomplete sink commits nothing. The directory reads back (open_megatron_dir) to
// the canonical tensors it came from.
#include "converters/megatron/megatron_sink.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "converters/megatron/megatron_dir_source.h"
#include "converters/megatron/megatron_export.h"
#include "reshard/executor.h"
#include "reshard/memory_io.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

LlamaConfig config() {
  LlamaConfig c;
  c.vocab_size = 37;  // padded to 48 at tp=2 with divisor 8: rank 1 holds 13 rows + 11 of padding
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 2;
  c.attention_bias = true;
  return c;
}

MemorySource random_model(const LlamaConfig& c) {
  MemoryCheckpoint m;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const TensorMeta& t : llama_model_tensors(c, DType::kF32)) {
    m.tensors.push_back(t);
    m.pieces.push_back(Piece{t.name, Region{Box::whole(t.shape)}, DType::kF32});
    std::vector<float> v(static_cast<size_t>(Box::whole(t.shape).numel()));
    for (float& x : v) x = u(rng);
    m.data.emplace_back(reinterpret_cast<const uint8_t*>(v.data()),
                        reinterpret_cast<const uint8_t*>(v.data()) + v.size() * sizeof(float));
  }
  m.metadata = {{"model_config", c.to_json()}};
  return MemorySource(std::move(m));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class MegatronSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("megatron_sink_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    layout_ = *Layout::make(2, 2, 1, 0, 3, {2, 1});
    layout_.vocab_divisor = 8;
    for (int p = 0; p < 2; ++p)
      for (int r = 0; r < 2; ++r) ranks_.push_back(*megatron_rank_tensors(cfg_, layout_, r, p));
    for (const auto& rank : ranks_) dtypes_.emplace_back(rank.size(), DType::kF32);
  }
  void TearDown() override { fs::remove_all(root_); }

  MegatronSink make_sink(const std::string& name) {
    return MegatronSink((root_ / name).string(), layout_, ranks_, dtypes_, megatron_args(cfg_, layout_).dump(2) + "\n");
  }

  LlamaConfig cfg_ = config();
  MemorySource src_ = random_model(cfg_);
  fs::path root_;
  Layout layout_;
  std::vector<std::vector<MegatronTensor>> ranks_;
  std::vector<std::vector<DType>> dtypes_;
};

TEST_F(MegatronSinkTest, AnyPieceOrderGivesTheExportBytes) {
  MegatronExportOptions o;
  o.tp = 2;
  o.pp = 2;
  o.layers_per_stage = {2, 1};
  o.vocab_divisor = 8;
  ASSERT_TRUE(export_megatron(src_, (root_ / "engine").string(), o).ok());

  // Every piece read whole, then written backwards round robin, 3 elements per write.
  MegatronSink sink = make_sink("manual");
  const std::vector<Piece> pieces = sink.pieces();
  ASSERT_GT(pieces.size(), 20u);
  auto index = *SourceIndex::build(src_);
  std::vector<std::vector<float>> data(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    data[k].resize(static_cast<size_t>(pieces[k].region.box.numel()));
    ASSERT_TRUE(read_global_box(src_, index, pieces[k].tensor, pieces[k].region.box, DType::kF32, data[k].data()).ok());
  }
  ASSERT_TRUE(sink.begin(src_.tensors(), pieces, nlohmann::json::object()).ok());
  std::vector<size_t> done(pieces.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t k = pieces.size(); k-- > 0;) {
      const size_t n = std::min<size_t>(3, data[k].size() - done[k]);
      if (n == 0) continue;
      ASSERT_TRUE(sink.write(k, data[k].data() + done[k], static_cast<int64_t>(n)).ok());
      done[k] += n;
      more = true;
    }
  }
  ASSERT_TRUE(sink.commit().ok());

  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root_ / "engine")) {
    if (!e.is_regular_file()) continue;
    ++files;
    const fs::path rel = fs::relative(e.path(), root_ / "engine");
    EXPECT_EQ(slurp(e.path()), slurp(root_ / "manual" / rel)) << rel;
  }
  EXPECT_EQ(files, 5u);  // 4 rank files + megatron_args.json
  EXPECT_FALSE(fs::exists(root_ / "manual.partial"));
}

TEST_F(MegatronSinkTest, ReadsBackToTheCanonicalTensorsWithZeroPadding) {
  MegatronExportOptions o;
  o.tp = 2;
  o.pp = 2;
  o.layers_per_stage = {2, 1};
  o.vocab_divisor = 8;
  ASSERT_TRUE(export_megatron(src_, (root_ / "out").string(), o).ok());
  auto back = open_megatron_dir((root_ / "out").string());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  auto bi = *SourceIndex::build(**back);
  for (size_t i = 0; i < src_.tensors().size(); ++i) {
    const TensorMeta& t = src_.tensors()[i];
    std::vector<uint8_t> got(src_.checkpoint().data[i].size());
    ASSERT_TRUE(read_global_box(**back, bi, t.name, Box::whole(t.shape), DType::kF32, got.data()).ok()) << t.name;
    EXPECT_EQ(got, src_.checkpoint().data[i]) << t.name;
  }
  // Rank 1's embedding: rows 24..36 of the vocabulary, then 11 rows of zeros.
  auto f = safetensors::SafetensorsFile::open((root_ / "out/mp_rank_01_000/model.safetensors").string());
  ASSERT_TRUE(f.ok());
  size_t emb = 0;
  while ((*f)->pieces()[emb].tensor != "embedding.word_embeddings.weight") ++emb;
  std::vector<float> rows(24 * 8);
  ASSERT_TRUE((*f)->read(emb, Box::whole({24, 8}), rows.data()).ok());
  const auto& table = src_.checkpoint().data[0];  // model.embed_tokens.weight [37, 8]
  ASSERT_EQ(src_.tensors()[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(std::memcmp(rows.data(), table.data() + 24 * 8 * sizeof(float), 13 * 8 * sizeof(float)), 0);
  for (size_t i = 13 * 8; i < rows.size(); ++i) EXPECT_EQ(rows[i], 0.0f) << i;
}

TEST_F(MegatronSinkTest, IncompleteOrOverrunWritesCommitNothing) {
  MegatronSink sink = make_sink("bad");
  const std::vector<Piece> pieces = sink.pieces();
  ASSERT_TRUE(sink.begin(src_.tensors(), pieces, nlohmann::json::object()).ok());
  const std::vector<float> zeros(static_cast<size_t>(pieces[0].region.box.numel()) + 1, 0.0f);
  EXPECT_FALSE(sink.write(0, zeros.data(), static_cast<int64_t>(zeros.size())).ok());  // one element too many
  EXPECT_TRUE(sink.write(0, zeros.data(), static_cast<int64_t>(zeros.size()) - 1).ok());
  EXPECT_FALSE(sink.commit().ok());  // the other pieces are missing
  sink.abort();
  EXPECT_FALSE(fs::exists(root_ / "bad"));
  EXPECT_FALSE(fs::exists(root_ / "bad.partial"));
  // begin() refuses pieces other than the sink's own segments.
  MegatronSink other = make_sink("other");
  std::vector<Piece> wrong = other.pieces();
  wrong.pop_back();
  EXPECT_FALSE(other.begin(src_.tensors(), wrong, nlohmann::json::object()).ok());
}

}  // namespace
}  // namespace ckpt
