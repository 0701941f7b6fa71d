// Seeded round trips through SafetensorsWriter -> SafetensorsFile: whole tensors and random
// sub-boxes (both the direct-pread and the bounce-buffer paths) against a naive element-by-element
// extraction; writer layout (sizes, padding, __metadata__); reader refusing bad sub-boxes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "formats/safetensors/st_reader.h"
#include "formats/safetensors/st_writer.h"
#include "tests/temp_dir.h"

namespace ckpt::safetensors {
namespace {

namespace fs = std::filesystem;

std::string tmpdir(const std::string& name) {
  return ckpt::testing::fresh_temp_dir("st_" + name).string();
}

struct T {
  TensorMeta meta;
  std::vector<uint8_t> bytes;
};

std::vector<T> random_tensors(std::mt19937_64& rng) {
  std::vector<T> ts;
  std::vector<std::pair<DType, Shape>> specs = {
      {DType::kF32, {37, 53}},  {DType::kBF16, {3, 5, 300}}, {DType::kU8, {7}},      {DType::kF64, {}},
      {DType::kI64, {0, 4}},   {DType::kF16, {2, 3, 4, 5}},  {DType::kBool, {9}},    {DType::kF32, {1, 70000}},
      {DType::kI32, {4096, 3}}, {DType::kF8E4M3, {5, 5}}};
  int i = 0;
  for (auto& [dt, shape] : specs) {
    T t;
    t.meta = TensorMeta{"t" + std::to_string(i++) + ".w", dt, shape};
    int64_t n = 1;
    for (auto d : shape) n *= d;
    t.bytes.resize(static_cast<size_t>(n) * dtype_size(dt));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    ts.push_back(std::move(t));
  }
  return ts;
}

// Naive extraction of `sub` from a dense row-major tensor.
std::vector<uint8_t> naive_box(const T& t, const Box& sub) {
  size_t es = dtype_size(t.meta.dtype);
  const auto& s = t.meta.shape;
  std::vector<uint8_t> out;
  int64_t n = sub.numel();
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t flat = 0;
    for (size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + sub.offset[d] + idx[d];
    out.insert(out.end(), t.bytes.begin() + flat * es, t.bytes.begin() + (flat + 1) * es);
    for (size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < sub.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Status write_all(const std::string& path, const std::vector<T>& ts, WriterOptions wo = {}) {
  SafetensorsWriter w(path, wo);
  std::vector<TensorMeta> metas;
  std::vector<Piece> pieces;
  for (const auto& t : ts) {
    metas.push_back(t.meta);
    pieces.push_back(Piece{t.meta.name, Region{Box::whole(t.meta.shape)}, t.meta.dtype});
  }
  CKPT_RETURN_IF_ERROR(w.begin(metas, pieces, nlohmann::json::object()));
  // Interleave pieces in two halves each, to exercise streaming in order per piece.
  for (int half = 0; half < 2; ++half)
    for (size_t i = 0; i < ts.size(); ++i) {
      int64_t n = static_cast<int64_t>(ts[i].bytes.size() / dtype_size(ts[i].meta.dtype));
      int64_t a = half ? n / 2 : 0, b = half ? n : n / 2;
      CKPT_RETURN_IF_ERROR(w.write(i, ts[i].bytes.data() + a * dtype_size(ts[i].meta.dtype), b - a));
    }
  return w.commit();
}

TEST(SafetensorsReader, RoundTripWholeAndSubBoxes) {
  std::mt19937_64 rng(1234);
  auto ts = random_tensors(rng);
  std::string dir = tmpdir("rt");
  std::string path = dir + "/a.safetensors";
  ASSERT_TRUE(write_all(path, ts).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto& file = **f;
  ASSERT_EQ(file.tensors().size(), ts.size());
  EXPECT_EQ(file.header().metadata.at("format"), "pt");
  EXPECT_EQ(file.header().header_size % 8, 0u);
  for (size_t p = 0; p < file.tensors().size(); ++p) {
    const auto& m = file.tensors()[p];
    const T* t = nullptr;
    for (const auto& x : ts)
      if (x.meta.name == m.name) t = &x;
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(m, t->meta);
    EXPECT_EQ((file.header().data_start() + file.header().tensors[p].begin) % dtype_size(m.dtype), 0u) << m.name;
    std::vector<uint8_t> whole(t->bytes.size());
    ASSERT_TRUE(file.read(p, Box::whole(m.shape), whole.data()).ok());
    EXPECT_EQ(whole, t->bytes) << m.name;
    for (int trial = 0; trial < 30; ++trial) {
      Box sub{Shape(m.shape.size()), Shape(m.shape.size())};
      for (size_t d = 0; d < m.shape.size(); ++d) {
        if (m.shape[d] == 0) continue;
        int64_t a = static_cast<int64_t>(rng() % m.shape[d]);
        int64_t b = a + static_cast<int64_t>(rng() % (m.shape[d] - a + 1));
        if (trial % 3 == 0) { a = 0; b = m.shape[d]; }  // full dims sometimes
        sub.offset[d] = a;
        sub.extent[d] = b - a;
      }
      std::vector<uint8_t> got(static_cast<size_t>(sub.numel()) * dtype_size(m.dtype), 0xAB);
      Status st = file.read(p, sub, got.data());
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(got, naive_box(*t, sub)) << m.name << " " << sub.to_string();
    }
  }
  fs::remove_all(dir);
}

TEST(SafetensorsReader, RejectsBadSubBox) {
  std::mt19937_64 rng(7);
  auto ts = random_tensors(rng);
  std::string dir = tmpdir("bad");
  ASSERT_TRUE(write_all(dir + "/a.safetensors", ts).ok());
  auto f = SafetensorsFile::open(dir + "/a.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<uint8_t> buf(1 << 20);
  size_t p = 0;
  while ((*f)->tensors()[p].shape.size() != 2 || (*f)->tensors()[p].shape[0] == 0) ++p;
  const Shape& s = (*f)->tensors()[p].shape;
  EXPECT_EQ((*f)->read(p, Box{{0, 0}, {s[0] + 1, 1}}, buf.data()).code(), "SliceOutOfRange");
  EXPECT_EQ((*f)->read(p, Box{{-1, 0}, {1, 1}}, buf.data()).code(), "SliceOutOfRange");
  EXPECT_EQ((*f)->read(p, Box{{0, 0, 0}, {1, 1, 1}}, buf.data()).code(), "TooManySlices");
  EXPECT_FALSE((*f)->read(999, Box{}, buf.data()).ok());
  fs::remove_all(dir);
}

TEST(SafetensorsReader, FileLevelErrorsNameTheFile) {
  std::string dir = tmpdir("files");
  auto nf = SafetensorsFile::open(dir + "/missing.safetensors");
  EXPECT_EQ(nf.status().kind(), ErrorKind::kNotFound);
  {
    std::ofstream(dir + "/small.safetensors") << "abc";
  }
  auto sm = SafetensorsFile::open(dir + "/small.safetensors");
  ASSERT_FALSE(sm.ok());
  EXPECT_EQ(sm.status().code(), "HeaderTooSmall");
  EXPECT_EQ(sm.status().file(), dir + "/small.safetensors");
  EXPECT_NE(sm.status().to_string().find("small.safetensors"), std::string::npos);
  auto d = SafetensorsFile::open(dir);
  EXPECT_FALSE(d.ok());
  fs::remove_all(dir);
}

TEST(SafetensorsWriter, RefusesBadDeclarationsAndIncompleteData) {
  std::string dir = tmpdir("w");
  std::string path = dir + "/x.safetensors";
  TensorMeta m{"w", DType::kF32, {4, 4}};
  {
    SafetensorsWriter w(path);
    EXPECT_FALSE(w.begin({m}, {Piece{"w", Region{Box{{0, 0}, {2, 4}}}, DType::kF32}}, {}).ok());  // not whole
  }
  {
    SafetensorsWriter w(path);
    EXPECT_FALSE(w.begin({m}, {}, {}).ok());  // tensor without a piece
  }
  {
    SafetensorsWriter w(path);
    ASSERT_TRUE(w.begin({m}, {Piece{"w", Region{Box::whole(m.shape)}, DType::kBF16}}, {}).ok());
    std::vector<uint16_t> d(16, 1);
    EXPECT_FALSE(w.write(0, d.data(), 17).ok());  // overrun
    ASSERT_TRUE(w.write(0, d.data(), 8).ok());
    EXPECT_FALSE(w.commit().ok());  // incomplete
    w.abort();
  }
  // Nothing was left behind, neither the file nor its temporary.
  EXPECT_TRUE(fs::is_empty(dir)) << fs::begin(fs::directory_iterator(dir))->path();
  fs::remove_all(dir);
}

TEST(SafetensorsWriter, NoMetadataAndEmptyFile) {
  std::string dir = tmpdir("e");
  WriterOptions wo;
  wo.write_metadata = false;
  ASSERT_TRUE(write_all(dir + "/e.safetensors", {}, wo).ok());
  std::ifstream in(dir + "/e.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ckpt::safetensors
