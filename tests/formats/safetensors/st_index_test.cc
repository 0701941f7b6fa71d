// Sharded HF checkpoints: index parsing rules (file names outside the directory, duplicates,
// types), HF's shard splitter, size parsing, the sharded sink's layout and atomic commit, and the
// directory source's whole-set checks (missing shard, tensor in the wrong shard, unlisted tensor).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "formats/safetensors/st_dir.h"
#include "tests/temp_dir.h"

namespace ckpt::safetensors {
namespace {

namespace fs = std::filesystem;

std::string index_code_of(const std::string& text) {
  auto r = parse_index(text);
  return r.ok() ? "OK" : r.status().code();
}
std::string wm(const std::string& file) { return "{\"metadata\":{\"total_size\":8},\"weight_map\":{\"a\":\"" + file + "\"}}"; }

TEST(SafetensorsIndex, FileNamesMustStayInTheDirectory) {
  EXPECT_EQ(index_code_of(wm("model-00001-of-00002.safetensors")), "OK");
  for (std::string bad : {"../x.safetensors", "/etc/x.safetensors", "sub/x.safetensors", "..", ".", "", "x.bin",
                          "..\\\\x.safetensors", "C:x.safetensors", ".safetensors"})
    EXPECT_EQ(index_code_of(wm(bad)), "IndexBadFileName") << bad;
}

TEST(SafetensorsIndex, StructureAndTypes) {
  EXPECT_EQ(index_code_of("{\"weight_map\":{}}"), "OK");
  EXPECT_EQ(index_code_of("{\"weight_map\":{\"a\":\"x.safetensors\",\"a\":\"y.safetensors\"}}"), "DuplicateKey");
  EXPECT_EQ(index_code_of("{\"metadata\":{}}"), "IndexInvalid");
  EXPECT_EQ(index_code_of("{\"weight_map\":[]}"), "IndexInvalid");
  EXPECT_EQ(index_code_of("{\"weight_map\":{\"a\":1}}"), "IndexInvalid");
  EXPECT_EQ(index_code_of("{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}"), "IndexInvalid");
  EXPECT_EQ(index_code_of("{\"metadata\":5,\"weight_map\":{}}"), "IndexInvalid");
  EXPECT_EQ(index_code_of("[]"), "IndexInvalid");
  EXPECT_EQ(index_code_of("{\"weight_map\":{}"), "InvalidJson");
  EXPECT_EQ(index_code_of(std::string("{\"weight_map\":{}}\0", 18)), "InvalidJson");
  EXPECT_EQ(index_code_of(std::string(100, '[') + std::string(100, ']')), "JsonTooDeep");
  auto r = parse_index("{\"weight_map\":{\"b\":\"2.safetensors\",\"a\":\"1.safetensors\",\"c\":\"1.safetensors\"}}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->files, (std::vector<std::string>{"1.safetensors", "2.safetensors"}));
}


struct Fixture {
  std::string root;
  std::vector<TensorMeta> metas;
  std::vector<std::vector<float>> data;
};

Fixture make_tensors(const std::string& name) {
  Fixture f;
  f.root = ckpt::testing::fresh_temp_dir("sti_" + name).string();
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  for (int i = 0; i < 5; ++i) {
    f.metas.push_back(TensorMeta{"layer." + std::to_string(i) + ".w", DType::kF32, {4, 5 + i}});
    std::vector<float> d(static_cast<size_t>(4 * (5 + i)));
    for (auto& x : d) x = nd(rng);
    f.data.push_back(d);
  }
  return f;
}

Status write_sharded(const Fixture& f, const std::string& out, uint64_t max_shard) {
  ShardedSinkOptions so;
  so.max_shard_size = max_shard;
  so.fsync = false;
  so.extra_files["config.json"] = "{}\n";
  ShardedSafetensorsSink sink(out, so);
  std::vector<Piece> pieces;
  for (const auto& m : f.metas) pieces.push_back(Piece{m.name, Region{Box::whole(m.shape)}, m.dtype});
  CKPT_RETURN_IF_ERROR(sink.begin(f.metas, pieces, {}));
  for (size_t i = 0; i < f.metas.size(); ++i) CKPT_RETURN_IF_ERROR(sink.write(i, f.data[i].data(), static_cast<int64_t>(f.data[i].size())));
  return sink.commit();
}

TEST(SafetensorsShardedSink, WritesShardsIndexAndReadsBack) {
  Fixture f = make_tensors("sink");
  std::string out = f.root + "/hf";
  // Sizes 80, 96, 112, 128, 144 bytes at a 200-byte limit: {0,1} {2} {3} {4}.
  Status st = write_sharded(f, out, 200);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_FALSE(fs::exists(out + ".partial"));
  auto idx = read_index(out + "/model.safetensors.index.json");
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  EXPECT_EQ(idx->files.size(), 4u);
  EXPECT_EQ(idx->weight_map.at("layer.0.w"), "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx->weight_map.at("layer.1.w"), "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx->weight_map.at("layer.4.w"), "model-00004-of-00004.safetensors");
  EXPECT_EQ(idx->metadata.at("total_size"), 80 + 96 + 112 + 128 + 144);
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  auto src = HfDirSource::open(out);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  ASSERT_EQ((*src)->tensors().size(), 5u);
  for (size_t p = 0; p < 5; ++p) {
    const auto& m = (*src)->tensors()[p];
    size_t i = static_cast<size_t>(m.name[6] - '0');
    std::vector<float> got(f.data[i].size());
    ASSERT_TRUE((*src)->read(p, Box::whole(m.shape), got.data()).ok());
    EXPECT_EQ(got, f.data[i]);
  }
  EXPECT_TRUE((*src)->metadata().contains("model_config"));
  // A second export to the same (non-empty) directory is refused before writing anything.
  EXPECT_EQ(write_sharded(f, out, 200).kind(), ErrorKind::kInvalidArgument);
  // One shard -> model.safetensors, no index.
  ASSERT_TRUE(write_sharded(f, f.root + "/one", 1u << 30).ok());
  EXPECT_TRUE(fs::exists(f.root + "/one/model.safetensors"));
  EXPECT_FALSE(fs::exists(f.root + "/one/model.safetensors.index.json"));
  fs::remove_all(f.root);
}

TEST(SafetensorsShardedSink, AbortLeavesNothing) {
  Fixture f = make_tensors("abort");
  std::string out = f.root + "/hf";
  {
    ShardedSinkOptions so;
    so.max_shard_size = 200;
    ShardedSafetensorsSink sink(out, so);
    std::vector<Piece> pieces;
    for (const auto& m : f.metas) pieces.push_back(Piece{m.name, Region{Box::whole(m.shape)}, m.dtype});
    ASSERT_TRUE(sink.begin(f.metas, pieces, {}).ok());
    ASSERT_TRUE(sink.write(0, f.data[0].data(), 20).ok());
    EXPECT_FALSE(sink.commit().ok());  // pieces missing
    sink.abort();
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
  fs::remove_all(f.root);
}

void rewrite_index(const std::string& dir, const std::string& text) {
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc) << text;
}

TEST(HfDirSource, WholeShardSetChecks) {
  Fixture f = make_tensors("dir");
  std::string out = f.root + "/hf";
  ASSERT_TRUE(write_sharded(f, out, 200).ok());
  auto idx = read_index(out + "/model.safetensors.index.json");
  ASSERT_TRUE(idx.ok());
  auto wmap = idx->weight_map;
  auto code = [&](std::map<std::string, std::string> m) {
    rewrite_index(out, index_to_json(0, m));
    auto s = HfDirSource::open(out);
    return s.ok() ? std::string("OK") : s.status().code();
  };
  EXPECT_EQ(code(wmap), "OK");
  auto m1 = wmap;
  m1.erase("layer.1.w");  // a shard holds a tensor the index does not list
  EXPECT_EQ(code(m1), "IndexMismatch");
  auto m2 = wmap;
  m2["layer.2.w"] = "model-00001-of-00004.safetensors";  // mapped to the wrong shard
  EXPECT_EQ(code(m2), "IndexMismatch");
  auto m3 = wmap;
  m3["ghost"] = "model-00001-of-00004.safetensors";  // listed, absent
  EXPECT_EQ(code(m3), "IndexMismatch");
  auto m4 = wmap;
  m4["ghost"] = "model-00009-of-00009.safetensors";  // listed file missing
  EXPECT_EQ(code(m4), "IndexMissingFile");
  auto m5 = wmap;
  m5["ghost"] = "../hf/model-00001-of-00004.safetensors";
  EXPECT_EQ(code(m5), "IndexBadFileName");
  fs::remove_all(f.root);
}

}  // namespace
}  // namespace ckpt::safetensors

namespace ckpt::safetensors {
namespace {

TEST(SafetensorsIndex, Splitter) {
  size_t n = 0;
  // HF: [3,3,3] at 5 -> {0},{1},{2}; a tensor above the limit gets its own shard in place.
  EXPECT_EQ(assign_shards({3, 3, 3}, 5, &n), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(assign_shards({2, 2, 9, 1}, 5, &n), (std::vector<size_t>{1, 1, 0, 1}));
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(assign_shards({2, 3, 1}, 5, &n), (std::vector<size_t>{0, 0, 1}));
  EXPECT_EQ(assign_shards({}, 5, &n).size(), 0u);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(hf_shard_file_name(0, 3), "model-00001-of-00003.safetensors");
}

}  // namespace
}  // namespace ckpt::safetensors
