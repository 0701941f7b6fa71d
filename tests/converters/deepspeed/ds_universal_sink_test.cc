// DsUniversalSink (converters/deepspeed/ds_universal_sink.h): each piece becomes its own torch file
// {'cat_dim': 0, 'param': F32 tensor}, read back through ckpt's torch reader (formats/torch/torch_file.h;
// tests/python/test_export_deepspeed.py reads them with torch itself); a file appears only when its
// piece is complete, an empty tensor's at commit, nothing after an abort; an overrun is refused.
#include "converters/deepspeed/ds_universal_sink.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "formats/torch/torch_file.h"
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using testing::TempDirTest;

class DsUniversalSinkTest : public TempDirTest {
 protected:
  std::vector<TensorMeta> tensors_{{"a", DType::kF32, {2, 3}}, {"b", DType::kF32, {0}}};
  std::vector<Piece> pieces_{{"a", Region{Box::whole({2, 3})}, DType::kF32}, {"b", Region{Box::whole({0})}, DType::kF32}};
  std::vector<std::string> paths() const { return {(root_ / "a.pt").string(), (root_ / "b.pt").string()}; }
};

TEST_F(DsUniversalSinkTest, WritesOneFilePerPieceWhenComplete) {
  DsUniversalSink sink(paths(), torch::TorchWriteOptions{});
  ASSERT_TRUE(sink.begin(tensors_, pieces_, {}).ok());
  std::vector<float> v(6);
  std::iota(v.begin(), v.end(), 1.0f);
  ASSERT_TRUE(sink.write(0, v.data(), 4).ok());
  EXPECT_FALSE(fs::exists(root_ / "a.pt"));  // under its temp name until the last element
  ASSERT_TRUE(sink.write(0, v.data() + 4, 2).ok());
  EXPECT_TRUE(fs::exists(root_ / "a.pt"));
  EXPECT_FALSE(fs::exists(root_ / "b.pt"));
  ASSERT_TRUE(sink.commit().ok());
  auto f = torch::TorchFile::open((root_ / "a.pt").string());
  ASSERT_TRUE(f.ok()) << f.status().message();
  const torch::PyObj* root = (*f)->root();
  ASSERT_TRUE(root->is(torch::PyType::kDict));
  ASSERT_NE(root->get("cat_dim"), nullptr);
  EXPECT_EQ(root->get("cat_dim")->i, 0);
  const torch::PyObj* t = root->get("param");
  ASSERT_TRUE(t != nullptr && t->is(torch::PyType::kTensor));
  EXPECT_EQ(t->tensor.size, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->tensor.stride, (std::vector<int64_t>{3, 1}));
  std::vector<float> back(6);
  ASSERT_TRUE((*f)->read_tensor(t->tensor, Box::whole({2, 3}), back.data()).ok());
  EXPECT_EQ(back, v);
  auto e = torch::TorchFile::open((root_ / "b.pt").string());  // the empty tensor's file
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->root()->get("param")->tensor.size, (std::vector<int64_t>{0}));
}

TEST_F(DsUniversalSinkTest, AbortLeavesNothing) {
  {
    DsUniversalSink sink(paths(), torch::TorchWriteOptions{});
    ASSERT_TRUE(sink.begin(tensors_, pieces_, {}).ok());
    std::vector<float> v(3, 1.0f);
    ASSERT_TRUE(sink.write(0, v.data(), 3).ok());
    sink.abort();
  }
  EXPECT_TRUE(fs::is_empty(root_));
}

TEST_F(DsUniversalSinkTest, OverrunAndIncompleteAreRefused) {
  DsUniversalSink sink(paths(), torch::TorchWriteOptions{});
  ASSERT_TRUE(sink.begin(tensors_, pieces_, {}).ok());
  std::vector<float> v(7, 1.0f);
  EXPECT_FALSE(sink.write(0, v.data(), 7).ok());
  ASSERT_TRUE(sink.write(0, v.data(), 5).ok());
  EXPECT_FALSE(sink.commit().ok());  // one element missing
}

TEST_F(DsUniversalSinkTest, RefusesPiecesThatAreNotDenseF32) {
  DsUniversalSink sink(paths(), torch::TorchWriteOptions{});
  std::vector<Piece> bf16 = pieces_;
  bf16[0].dtype = DType::kBF16;
  EXPECT_FALSE(sink.begin(tensors_, bf16, {}).ok());
  DsUniversalSink two({(root_ / "a.pt").string()}, torch::TorchWriteOptions{});
  EXPECT_FALSE(two.begin(tensors_, pieces_, {}).ok());  // a path per piece
}

}  // namespace
}  // namespace ckpt
