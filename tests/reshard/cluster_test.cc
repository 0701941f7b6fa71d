// reshard/dist/cluster.h: cluster files (the fixtures parse to the values written by hand; every bad
// input is refused naming the key or entry) and check_cluster_layout (world sizes, and the
// device type of every rank of a stage that names one, rank order included).
#include "reshard/dist/cluster.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace ckpt {
namespace cluster_test {  // named, not anonymous: unique in a unity batch

// A path, not string concatenation: g++ 12 at -O2 warns (-Warray-bounds, a false positive) on
// std::string(literal) + literal + name once inlined in some unity batches.
std::string fixture(const std::string& name) { return (std::filesystem::path(CKPT_SOURCE_DIR) / "fixtures" / "clusters" / name).string(); }

Result<Cluster> parse(const std::string& text) { return Cluster::from_json(nlohmann::json::parse(text)); }

TEST(Cluster, FixtureParsesToItsValues) {
  auto c = Cluster::from_file(fixture("two_types.json"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->types.size(), 2u);
  EXPECT_EQ(c->types[0].name, "A800");
  EXPECT_EQ(c->types[0].vendor, "nvidia");
  EXPECT_EQ(c->types[0].memory_bytes, uint64_t{80} << 30);
  EXPECT_DOUBLE_EQ(c->types[0].peak_flops, 3.12e14);
  EXPECT_DOUBLE_EQ(c->types[0].link_bytes_per_s, 400e9);
  EXPECT_EQ(c->types[1].dtype, "fp16");
  EXPECT_EQ(c->types[1].memory_bytes, uint64_t{32} << 30);
  EXPECT_EQ(c->world_size(), 8);
  EXPECT_EQ(c->rank_type, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(c->device_of(5).name, "BI150");
  // to_json round trip (byte counts written as numbers).
  auto back = Cluster::from_json(c->to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rank_type, c->rank_type);
  EXPECT_EQ(back->types[1].memory_bytes, c->types[1].memory_bytes);
  EXPECT_EQ(back->types[1].link_bytes_per_s, c->types[1].link_bytes_per_s);
  ASSERT_TRUE(Cluster::from_file(fixture("three_types.json")).ok());
}

TEST(Cluster, DefaultsAndPlainByteCounts) {
  auto c = parse(R"({"device_types":[{"name":"X","memory":1048576}],"ranks":[{"type":"X","count":3}]})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->types[0].memory_bytes, 1048576u);
  EXPECT_EQ(c->types[0].dtype, "bf16");
  EXPECT_EQ(c->types[0].peak_flops, 0);
  EXPECT_EQ(c->world_size(), 3);
}

void expect_bad(const std::string& text, const std::string& needle) {
  auto c = parse(text);
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), "BadCluster") << c.status().message();
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

TEST(Cluster, BadFilesAreRefusedNamingTheProblem) {
  const std::string ranks = R"("ranks":[{"type":"X","count":1}])";
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","colour":1}],)" + ranks + "}", "unknown key 'colour'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"}],)" + ranks + R"(,"extra":1})", "unknown key 'extra'");
  expect_bad(R"({"device_types":[{"name":"X"}],)" + ranks + "}", "missing key 'memory'");
  expect_bad(R"({"device_types":[{"name":"X","memory":0}],)" + ranks + "}", "'memory' must be > 0");
  expect_bad(R"({"device_types":[{"name":"X","memory":"12 parsecs"}],)" + ranks + "}", "key 'memory'");
  expect_bad(R"({"device_types":[{"name":"X","memory":-5}],)" + ranks + "}", "byte count");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","dtype":"int8"}],)" + ranks + "}", "'dtype'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","peak_flops":"fast"}],)" + ranks + "}", "peak_flops");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","link_bandwidth":"fast"}],)" + ranks + "}",
             "link_bandwidth");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"},{"name":"X","memory":"2GiB"}],)" + ranks + "}",
             "'X' is defined twice");
  expect_bad(R"({"device_types":[{"memory":"1GiB"}],)" + ranks + "}", "needs a non-empty string 'name'");
  expect_bad(R"({"device_types":[],)" + ranks + "}", "non-empty array");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"}]})", "missing key 'ranks'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"}],"ranks":[{"type":"Y","count":1}]})",
             "names device type \"Y\"");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"}],"ranks":[{"type":"X","count":0}]})",
             "ranks[0] needs an integer 'count'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB"}],"ranks":[]})", "non-empty array");
  expect_bad(R"([1,2])", "must be a JSON object");
  // A missing file names it.
  auto m = Cluster::from_file(fixture("no_such_cluster.json"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().to_string().find("no_such_cluster.json"), std::string::npos) << m.status().to_string();
}

TEST(Cluster, ProfilePerDeviceType) {
  // A device type may name its stack's profile (checked against the built-in profiles by
  // trainer/train_profile.h, not here: reshard/ does not know them); the name's syntax is checked.
  auto c = parse(R"({"device_types":[{"name":"X","memory":"1GiB","profile":"megatron-mcore"},{"name":"Y","memory":"1GiB"}],)"
                 R"("ranks":[{"type":"X","count":1},{"type":"Y","count":1}]})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->types[0].profile, "megatron-mcore");
  EXPECT_EQ(c->types[1].profile, "");
  auto back = Cluster::from_json(c->to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->types[0].profile, "megatron-mcore");
  EXPECT_FALSE(c->to_json()["device_types"][1].contains("profile"));
  const std::string ranks = R"("ranks":[{"type":"X","count":1}])";
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","profile":5}],)" + ranks + "}", "key 'profile'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","profile":""}],)" + ranks + "}", "key 'profile'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","profile":"Megatron Core"}],)" + ranks + "}",
             "key 'profile'");
}

TEST(Cluster, NodesAndLinks) {
  auto c = Cluster::from_file(fixture("two_nodes.json"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->world_size(), 8);
  EXPECT_EQ(c->rank_type, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  ASSERT_EQ(c->num_nodes(), 2);
  EXPECT_EQ(c->node_of(3), 0);
  EXPECT_EQ(c->node_of(4), 1);
  EXPECT_DOUBLE_EQ(c->types[0].efficiency, 0.45);
  EXPECT_DOUBLE_EQ(Cluster::efficiency_of(c->types[1]), kDefaultEfficiency);
  EXPECT_DOUBLE_EQ(c->link(0, 3).bytes_per_s, 200e9);   // intra node n0
  EXPECT_DOUBLE_EQ(c->link(0, 3).latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(c->link(4, 7).bytes_per_s, 32e9);    // n1's own intra_node bandwidth
  EXPECT_DOUBLE_EQ(c->link(4, 7).latency_s, 5e-6);      // latency from the cluster's intra_node
  EXPECT_DOUBLE_EQ(c->link(0, 7).bytes_per_s, 25e9);    // inter node
  EXPECT_DOUBLE_EQ(c->slowest_link({0, 1, 2}).bytes_per_s, 200e9);
  EXPECT_DOUBLE_EQ(c->slowest_link({0, 1, 5}).bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(c->slowest_link({0, 1, 5}).latency_s, 20e-6);
  auto back = Cluster::from_json(c->to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->to_json(), c->to_json());
  EXPECT_EQ(back->rank_node, c->rank_node);
  // A "ranks" file is one node; links default to the device types' link_bandwidth.
  auto flat = Cluster::from_file(fixture("two_types.json"));
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->num_nodes(), 1);
  EXPECT_DOUBLE_EQ(flat->link(0, 7).bytes_per_s, 64e9);
  EXPECT_DOUBLE_EQ(flat->link(0, 7).latency_s, kDefaultIntraLatencyS);
}

TEST(Cluster, BadTopologyIsRefusedNamingTheProblem) {
  const std::string types = R"({"device_types":[{"name":"X","memory":"1GiB"}],)";
  expect_bad(types + R"("nodes":[{"name":"n0","devices":[]}]})", "cluster node 'n0' is empty");
  expect_bad(types + R"("nodes":[{"name":"n0","devices":[{"type":"Y","count":1}]}]})", "names device type \"Y\"");
  expect_bad(types + R"("nodes":[{"name":"n0","devices":[{"type":"X","count":1}]},{"name":"n0","devices":[{"type":"X","count":1}]}]})",
             "node 'n0' is defined twice");
  expect_bad(types + R"("nodes":[{"name":"n0"}]})", "missing key 'devices'");
  expect_bad(types + R"("nodes":[{"name":"n0","devices":[{"type":"X","count":2}]}],"ranks":[{"type":"X","count":1}]})",
             "disagree");
  expect_bad(types + R"("ranks":[{"type":"X","count":1}],"links":{"intra_node":{"bandwidth":"fast"}}})", "links.intra_node");
  expect_bad(types + R"("ranks":[{"type":"X","count":1}],"links":{"inter_node":{"latency":"soon"}}})", "latency");
  expect_bad(types + R"("ranks":[{"type":"X","count":1}],"links":{"outer":{}}})", "unknown key 'outer'");
  expect_bad(R"({"device_types":[{"name":"X","memory":"1GiB","efficiency":1.5}],"ranks":[{"type":"X","count":1}]})",
             "'efficiency' must be a number in (0, 1]");
  expect_bad(R"({"device_types":[{"name":"X","peak_flops":1e12}],"nodes":[{"devices":[{"type":"X","count":1}]}]})",
             "device type 'X' is missing key 'memory'");
}

Layout general(std::vector<PipelineSpec> pls) {
  auto r = Layout::from_pipelines(std::move(pls), 0);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : Layout{};
}

TEST(Cluster, CheckClusterLayoutMatchesEveryRanksDeviceType) {
  auto c = Cluster::from_file(fixture("two_types.json"));  // 4 x A800 then 4 x BI150
  ASSERT_TRUE(c.ok());
  // Stage 0 tp 2 on A800 in both pipelines (ranks 0..3), stage 1 tp 2 on BI150 (ranks 4..7).
  const Layout good = general({{1, {{2, 2, "A800"}, {2, 2, "BI150"}}}, {1, {{2, 2, "A800"}, {2, 2, "BI150"}}}});
  EXPECT_TRUE(check_cluster_layout(*c, good).ok());
  // Symmetric layouts name no device: only the rank count matters.
  auto sym = Layout::make(2, 2, 2, 0, 4);
  EXPECT_TRUE(check_cluster_layout(*c, *sym).ok());
  auto small = Layout::make(2, 1, 2, 0, 4);
  Status st = check_cluster_layout(*c, *small);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "ClusterMismatch");
  EXPECT_NE(st.message().find("the cluster file has 8 ranks"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("needs 4"), std::string::npos) << st.message();
  // Pipeline 1 puts BI150 on stage 0: ranks 2, 3 are A800 in the cluster.
  const Layout swapped = general({{1, {{2, 2, "A800"}, {2, 2, "BI150"}}}, {1, {{2, 2, "BI150"}, {2, 2, "A800"}}}});
  st = check_cluster_layout(*c, swapped);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "ClusterMismatch");
  EXPECT_NE(st.message().find("rank 2 (pipeline 1, stage 0, tp rank 0) is on device type 'BI150'"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("puts a 'A800' there"), std::string::npos) << st.message();
  // Unnamed stages match any type.
  const Layout partial = general({{1, {{2, 2, ""}, {2, 2, "BI150"}}}, {1, {{2, 2, "A800"}, {2, 2, ""}}}});
  EXPECT_TRUE(check_cluster_layout(*c, partial).ok());
}

TEST(Cluster, FlagScaleFixtureOnItsCluster) {
  auto l = Layout::from_file(std::string(CKPT_SOURCE_DIR) + "/fixtures/clusters/flagscale_two_meshes.json");
  ASSERT_TRUE(l.ok()) << l.status().message();
  auto c = parse(R"({"device_types":[{"name":"A800","memory":"80GiB"},{"name":"BI150","memory":"32GiB"}],
                    "ranks":[{"type":"A800","count":2},{"type":"BI150","count":1}]})");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(check_cluster_layout(*c, *l).ok());
}

}  // namespace cluster_test
}  // namespace ckpt
