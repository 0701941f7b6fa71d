// Megatron-Core 0.19 torch_dist common state and integrity.json (converters/megatron/dist/
// megatron_dist_common.h, megatron_integrity.h) on the committed fixtures written by megatron-core
// 0.19.2 itself (fixtures/megatron_core_019): the common_state item read through the restricted
// unpickler; hostile item offsets and lengths (outside the file, not a zip, absent) and tampered,
// missing or malformed integrity manifests fail with named errors.
#include "converters/megatron/dist/megatron_dist_common.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "converters/megatron/dist/megatron_integrity.h"
#include "formats/torch/dcp/dcp.h"
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& name) {
  return std::string(CKPT_SOURCE_DIR) + "/fixtures/megatron_core_019/" + name + "/iter_0000010";
}

torch::DcpBytesItem* common_item(torch::DcpMetadata& md) {
  for (auto& b : md.bytes)
    if (b.fqn == kMegatronCommonStateItem) return &b;
  return nullptr;
}

TEST(MegatronDistCommon019, ReadsTheCommonStateItem) {
  auto c = read_megatron_dist_common(fixture_dir("tp2"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->source, kMegatronCommonStateItem);
  EXPECT_EQ(c->args.value("num_layers", 0), 4);
  EXPECT_EQ(c->args.value("tensor_model_parallel_size", 0), 2);
  EXPECT_EQ(c->iteration, 10);
  EXPECT_EQ(c->sharding_type, "");
  auto f = read_megatron_dist_common(fixture_dir("distopt_fully_reshardable"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->sharding_type, "fully_reshardable");
  EXPECT_EQ(f->optimizer_step, 2);  // the step of param_groups
  auto d = read_megatron_dist_common(fixture_dir("distopt_dp_reshardable"));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->sharding_type, "dp_reshardable");
}

TEST(MegatronDistCommon019, ItemOutsideItsFileIsNamed) {
  const std::string dir = fixture_dir("tp2");
  auto md = torch::read_dcp_metadata(dir);
  ASSERT_TRUE(md.ok()) << md.status().message();
  torch::DcpBytesItem* it = common_item(*md);
  ASSERT_NE(it, nullptr);
  const uint64_t size = fs::file_size(fs::path(dir) / it->file);
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{size - 10, it->length}, {size + 1, 1}, {UINT64_MAX - 1, 16},
                                {it->offset, UINT64_MAX}, {it->offset, 0}}) {
    it->offset = offset;
    it->length = length;
    auto c = read_megatron_dist_common(dir, &*md);
    ASSERT_FALSE(c.ok()) << offset << "+" << length;
    EXPECT_EQ(c.status().code(), "BadMegatronCommonState") << c.status().message();
    EXPECT_NE(c.status().message().find("common_state"), std::string::npos) << c.status().message();
  }
}

TEST(MegatronDistCommon019, ItemThatIsNotAZipFails) {
  const std::string dir = fixture_dir("tp2");
  auto md = torch::read_dcp_metadata(dir);
  ASSERT_TRUE(md.ok());
  torch::DcpBytesItem* it = common_item(*md);
  ASSERT_NE(it, nullptr);
  it->offset += 1;  // one byte into the zip: not a zip there
  it->length -= 1;
  auto c = read_megatron_dist_common(dir, &*md);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("common_state"), std::string::npos) << c.status().message();
  it->file = "../x.distcp";
  auto p = read_megatron_dist_common(dir, &*md);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), "DcpBadPath") << p.status().message();
}

TEST(MegatronDistCommon019, MissingCommonStateIsNamed) {
  auto md = torch::read_dcp_metadata(fixture_dir("pp2"));
  ASSERT_TRUE(md.ok());
  std::erase_if(md->bytes, [](const torch::DcpBytesItem& b) { return b.fqn == kMegatronCommonStateItem; });
  auto c = read_megatron_dist_common(fixture_dir("pp2"), &*md);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), "MissingMegatronCommonState") << c.status().message();
}

class MegatronIntegrity019 : public testing::TempDirTest {
 protected:
  std::string copy() {
    const fs::path d = root_ / "iter";
    fs::copy(fixture_dir("vpp2_pp2"), d, fs::copy_options::recursive);
    return d.string();
  }
  static CheckReport check(const std::string& dir) {
    CheckReport rep;
    uint64_t unit = 0;
    check_megatron_integrity(dir, CheckOptions{}, &unit, nullptr, rep);
    return rep;
  }
};

TEST_F(MegatronIntegrity019, FixtureChecksAndTamperingIsCaught) {
  const std::string d = copy();
  ASSERT_TRUE(has_megatron_integrity(d));
  CheckReport ok = check(d);
  EXPECT_TRUE(ok.ok()) << ok.failures.front().status.message();
  EXPECT_EQ(ok.pieces, 6u);  // .metadata, 4 .distcp, metadata.json
  EXPECT_EQ(ok.bytes, megatron_integrity_bytes(d));
  {
    std::fstream f(d + "/__1_0.distcp", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(50);
    f.put('\x7f');
  }
  CheckReport bad = check(d);
  ASSERT_EQ(bad.failures.size(), 1u);
  EXPECT_EQ(bad.failures[0].status.code(), "MegatronIntegrityMismatch");
  EXPECT_NE(bad.failures[0].file.find("__1_0.distcp"), std::string::npos);
  fs::remove(d + "/__3_0.distcp");
  CheckReport missing = check(d);
  ASSERT_EQ(missing.failures.size(), 2u);
  EXPECT_EQ(missing.failures[1].status.code(), "MegatronIntegrityMissingFile");
}

TEST_F(MegatronIntegrity019, MalformedManifestsAreNamed) {
  const std::string d = copy();
  const std::string digest(64, 'a');
  for (const std::string& text : {std::string("[]"), std::string(R"({"algorithm": "sha256", "files": {"../x": ")") + digest + "\"}}",
                                  std::string(R"({"algorithm": "sha256", "files": {"a": "ABC"}})"),
                                  std::string(R"({"algorithm": "sha256", "files": {"integrity.json": ")") + digest + "\"}}"}) {
    std::ofstream(d + "/integrity.json", std::ios::trunc) << text;
    auto m = read_megatron_integrity(d);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), "BadMegatronIntegrity") << text << ": " << m.status().message();
    CheckReport rep = check(d);
    ASSERT_EQ(rep.failures.size(), 1u);
    EXPECT_EQ(rep.failures[0].status.code(), "BadMegatronIntegrity");
  }
  std::ofstream(d + "/integrity.json", std::ios::trunc) << R"({"algorithm": "md5", "files": {}})";
  auto m = read_megatron_integrity(d);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), "Unsupported");
}

}  // namespace
}  // namespace ckpt
