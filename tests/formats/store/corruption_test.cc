// Damaged stores: each case gives a clear error with its rule code and the documented `ckpt verify`
// exit code (README: 1 verification failed, 3 corrupt input, 4 not found, 5 unsupported): a
// flipped bit in a shard (verify names the tensor), a truncated or deleted shard, manifests with
// overlapping pieces, a gap, an out-of-bounds region, a wrong dtype or shape, an unknown version,
// invalid JSON, an unknown digest algorithm. Every case runs with both piece digests (xxh3-128,
// sha256); a version 1 manifest (the sha256 store rewritten to v1 form) still loads and verifies,
// and its flipped bits are still found. Structural rules are checked on manifests resealed with
// their manifest checksum (version 3); an edit not resealed is ManifestChecksumMismatch. HDF5
// storage that disagrees with the manifest (layout, filters, storage size, chunk shape) is a
// named corruption at open. A ckpt killed by a signal, or a sanitizer report (exit code 86, set here for the
// child, or its stderr marker), fails the test whatever the exit code.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>

#include "formats/digest.h"
#include "formats/fs_util.h"
#include "formats/store/h5_handles.h"
#include "formats/store/h5_types.h"
#include "formats/store/zstd_filter.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt::store {
namespace {

using nlohmann::json;

class Corruption : public ::testing::TestWithParam<DigestAlgo> {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("corrupt");
    std::mt19937_64 rng(5);
    tensors_ = {testing::random_tensor("model.layers.0.mlp.up_proj.weight", DType::kBF16, {64, 32}, rng),
                testing::random_tensor("model.norm.weight", DType::kF32, {32}, rng)};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Two ranks: up_proj split by rows, norm whole on rank 1.
  std::string write(const std::string& name, Codec codec = Codec::kNone) {
    const std::string dst = dir_ + "/" + name;
    StoreOptions opts;
    opts.codec = codec;
    opts.digest = GetParam();
    opts.fsync = false;
    opts.chunk_bytes = 1024;
    EXPECT_TRUE(StoreWriter::prepare_partial(dst).ok());
    std::vector<TensorMeta> metas = {tensors_[0].meta, tensors_[1].meta};
    std::vector<std::vector<Piece>> per_rank = {
        {{tensors_[0].meta.name, Region{Box{{0, 0}, {32, 32}}, 0, -1}, DType::kBF16}},
        {{tensors_[0].meta.name, Region{Box{{32, 0}, {32, 32}}, 0, -1}, DType::kBF16},
         {tensors_[1].meta.name, Region{Box::whole({32}), 0, -1}, DType::kF32}}};
    std::vector<PieceRecord> all;
    for (int rank = 0; rank < 2; ++rank) {
      auto sw = StoreWriter::open_rank(StoreWriter::partial_dir(dst), rank, metas, per_rank[rank], opts);
      EXPECT_TRUE(sw.ok());
      for (size_t k = 0; k < per_rank[rank].size(); ++k) {
        const auto& p = per_rank[rank][k];
        auto bytes = testing::naive_piece(p.tensor == tensors_[0].meta.name ? tensors_[0] : tensors_[1], p.region);
        EXPECT_TRUE((*sw)->write(k, bytes.data(), p.region.numel()).ok());
      }
      auto recs = (*sw)->close();
      EXPECT_TRUE(recs.ok());
      all.insert(all.end(), recs->begin(), recs->end());
    }
    EXPECT_TRUE(StoreWriter::finalize(dst, metas, all, {{"profile", "reference"}}, opts).ok());
    return dst;
  }

  json manifest(const std::string& dst) {
    std::ifstream f(dst + "/manifest.json");
    return json::parse(f);
  }
  void put_manifest(const std::string& dst, const std::string& text) {
    std::ofstream f(dst + "/manifest.json", std::ios::trunc);
    f << text;
  }
  // `j` with its manifest checksum recomputed, as a writer would seal it.
  static json resealed(json j) {
    j.erase("manifest_digest");
    j["manifest_digest"] = digest_of(DigestAlgo::kXxh3_128, canonical_manifest_text(j).data(), canonical_manifest_text(j).size()).to_string();
    return j;
  }
  // Replaces `dataset` of `file` by a copy of its elements (same type and dims) created with `dcpl`.
  void rewrite_dataset(const std::string& file, const std::string& dataset, const std::function<void(hid_t)>& set_dcpl) {
    ASSERT_TRUE(register_zstd_filter().ok());
    auto lock = h5_lock();
    H5Id f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(f.valid());
    H5Id d = h5_dataset(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT));
    H5Id type = h5_type(H5Dget_type(d.get()));
    H5Id space = h5_space(H5Dget_space(d.get()));
    std::vector<char> data(H5Sget_simple_extent_npoints(space.get()) * H5Tget_size(type.get()));
    ASSERT_GE(H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    d.reset();
    ASSERT_GE(H5Ldelete(f.get(), dataset.c_str(), H5P_DEFAULT), 0);
    H5Id dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
    set_dcpl(dcpl.get());
    H5Id nd = h5_dataset(H5Dcreate2(f.get(), dataset.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    ASSERT_TRUE(nd.valid());
    ASSERT_GE(H5Dwrite(nd.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
  }
  Status open_status(const std::string& dst) {
    auto r = StoreReader::open(dst);
    return r.ok() ? Status::Ok() : r.status();
  }
  // Exit code of `ckpt verify dst` (the real binary). A signal or a sanitizer finding is a test
  // failure (and returns 128 + signal, or 86).
  int ckpt_verify(const std::string& dst, std::string* out = nullptr) {
    const std::string err_path = dir_ + "/verify.stderr", out_path = dir_ + "/verify.stdout";
    const pid_t pid = spawn_ckpt({"verify", dst}, err_path, out_path);
    int status = 0;
    if (pid <= 0 || waitpid(pid, &status, 0) != pid) {
      ADD_FAILURE() << "could not run " << CKPT_BIN;
      return -1;
    }
    std::ifstream ef(err_path);
    const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
    if (out) {
      std::ifstream of(out_path);
      *out = std::string((std::istreambuf_iterator<char>(of)), std::istreambuf_iterator<char>());
    }
    if (WIFSIGNALED(status)) {
      ADD_FAILURE() << "ckpt verify " << dst << " killed by signal " << WTERMSIG(status) << "\n" << err;
      return 128 + WTERMSIG(status);
    }
    const int code = WEXITSTATUS(status);
    for (std::string_view mark : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"})
      if (err.find(mark) != std::string::npos || code == kSanitizerExit) {
        ADD_FAILURE() << "sanitizer finding in ckpt verify " << dst << " (exit " << code << ")\n" << err;
        return kSanitizerExit;
      }
    return code;
  }
  // Starts CKPT_BIN with `args`, stdout to `out_path`, stderr to `err_path`, and sanitizer options
  // that end in exitcode=86 (later options win), the caller's others kept.
  static pid_t spawn_ckpt(const std::vector<std::string>& args, const std::string& err_path, const std::string& out_path) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::string_view(*e).rfind("ASAN_OPTIONS=", 0) != 0 && std::string_view(*e).rfind("UBSAN_OPTIONS=", 0) != 0)
        env.emplace_back(*e);
    const char* asan = std::getenv("ASAN_OPTIONS");
    const char* ubsan = std::getenv("UBSAN_OPTIONS");
    const std::string code = std::to_string(kSanitizerExit);
    env.push_back(std::string("ASAN_OPTIONS=") + (asan ? asan : "detect_leaks=0") + ":exitcode=" + code);
    env.push_back(std::string("UBSAN_OPTIONS=") + (ubsan ? ubsan : "print_stacktrace=1") + ":halt_on_error=1:exitcode=" + code);
    std::vector<std::string> argv_s = {CKPT_BIN};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    if (posix_spawn(&pid, CKPT_BIN, &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }
  static constexpr int kSanitizerExit = 86;
  void expect_every_flip_found(const std::string& clean, const std::string& tag);
  // File offset and size of the raw bytes of a contiguous dataset.
  std::pair<uint64_t, uint64_t> data_extent(const std::string& file, const std::string& dataset) {
    auto lock = h5_lock();
    H5Id f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Id d = h5_dataset(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT));
    return {H5Dget_offset(d.get()), H5Dget_storage_size(d.get())};
  }
  void flip_bit(const std::string& file, uint64_t byte, int bit) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(byte));
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ (1 << bit));
    f.seekp(static_cast<std::streamoff>(byte));
    f.write(&c, 1);
  }

  std::string dir_;
  std::vector<testing::DenseTensor> tensors_;
};

TEST_P(Corruption, CleanStoreVerifies) {
  auto dst = write("clean");
  const json m = manifest(dst);
  EXPECT_EQ(m["version"], 3);
  EXPECT_EQ(m["manifest_digest"].get<std::string>().rfind(std::string(digest_algo_name(GetParam())) + ":", 0), 0u) << m.dump();
  const std::string prefix = std::string(digest_algo_name(GetParam())) + ":";
  for (const auto& p : m["pieces"]) EXPECT_EQ(p["digest"].get<std::string>().rfind(prefix, 0), 0u) << p.dump();
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE((*r)->verify().ok());
  std::string out;
  EXPECT_EQ(ckpt_verify(dst, &out), 0);
  EXPECT_NE(out.find("ckpt-native v3"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string("checked (") + digest_algo_name(GetParam()) + ")"), std::string::npos) << out;
}

// Flips one random bit in the data of every piece of `clean` in turn (a copy each) and checks that
// verify() and `ckpt verify` name exactly that piece, its tensor, file and dataset, and the
// algorithm of its digest.
void Corruption::expect_every_flip_found(const std::string& clean, const std::string& tag) {
  std::mt19937_64 rng(9);
  auto m = manifest(clean);
  for (size_t i = 0; i < m["pieces"].size(); ++i) {
    const std::string dst = dir_ + "/" + tag + std::to_string(i);
    std::filesystem::copy(clean, dst, std::filesystem::copy_options::recursive);
    const auto& p = m["pieces"][i];
    const std::string file = dst + "/" + p["file"].get<std::string>();
    auto [off, size] = data_extent(file, p["dataset"]);
    ASSERT_GT(size, 0u);
    flip_bit(file, off + rng() % size, static_cast<int>(rng() % 8));
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto rep = (*r)->verify(nullptr, 1 + static_cast<int>(i % 3));  // 1..3 hashing threads
    ASSERT_EQ(rep.failures.size(), 1u);
    EXPECT_EQ(rep.failures[0].piece, i);
    const Status& st = rep.failures[0].status;
    EXPECT_EQ(st.code(), "ChecksumMismatch");
    EXPECT_EQ(st.kind(), ErrorKind::kChecksum);
    EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
    EXPECT_NE(st.message().find(p["dataset"].get<std::string>()), std::string::npos) << st.message();
    EXPECT_NE(st.file().find(p["file"].get<std::string>()), std::string::npos);
    EXPECT_NE(st.message().find(std::string(digest_algo_name(GetParam())) + " expected"), std::string::npos) << st.message();
    EXPECT_EQ(ckpt_verify(dst), 1);
  }
}

TEST_P(Corruption, FlippedBitInEveryPieceIsFoundAndNamed) { expect_every_flip_found(write("flip_src"), "flip"); }

// A version 1 manifest: "sha256": "<hex>" per piece, no "digest". The sha256 store rewritten so
// loads, verifies and still finds every flipped bit; the xxh3-128 one cannot be written as v1
// (its digests are not SHA-256): BadField.
TEST_P(Corruption, Version1ManifestStillReads) {
  const std::string dst = write("v1");
  json m = manifest(dst);
  m["version"] = 1;
  m.erase("manifest_digest");  // version 3's field
  for (auto& p : m["pieces"]) {
    const std::string d = p["digest"];
    p.erase("digest");
    p["sha256"] = d.substr(d.find(':') + 1);
  }
  put_manifest(dst, m.dump(1));
  if (GetParam() != DigestAlgo::kSha256) {
    EXPECT_EQ(open_status(dst).code(), "BadField");
    EXPECT_EQ(ckpt_verify(dst), 3);
    return;
  }
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->manifest().version, 1);
  EXPECT_TRUE((*r)->verify().ok());
  std::string out;
  EXPECT_EQ(ckpt_verify(dst, &out), 0);
  EXPECT_NE(out.find("ckpt-native v1"), std::string::npos) << out;
  expect_every_flip_found(dst, "v1flip");
}

TEST_P(Corruption, FlippedBitInCompressedChunkFails) {
  auto dst = write("flipz", Codec::kShuffleZstd);
  auto m = manifest(dst);
  const auto& p = m["pieces"][0];
  const std::string file = dst + "/" + p["file"].get<std::string>();
  // Chunked: find the first chunk's address through the chunk index (H5Dget_chunk_info is
  // 1.10.5+); flip a byte in the middle of it.
  haddr_t addr;
  hsize_t csize;
  {
    auto lock = h5_lock();
    H5Id f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Id d = h5_dataset(H5Dopen2(f.get(), p["dataset"].get<std::string>().c_str(), H5P_DEFAULT));
    H5Id sp = h5_space(H5Dget_space(d.get()));
    hsize_t offs[2];
    unsigned mask;
    ASSERT_GE(H5Dget_chunk_info(d.get(), sp.get(), 0, offs, &mask, &addr, &csize), 0);
  }
  flip_bit(file, addr + csize / 2, 3);
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok());
  auto rep = (*r)->verify();
  ASSERT_EQ(rep.failures.size(), 1u);
  const Status& st = rep.failures[0].status;
  EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
  // A chunk zstd cannot decode is corrupt input (3); one that decodes to other bytes fails its
  // checksum (1).
  EXPECT_EQ(ckpt_verify(dst), st.kind() == ErrorKind::kChecksum ? 1 : 3) << st.to_string();
}

TEST_P(Corruption, TruncatedShard) {
  auto dst = write("trunc");
  const std::string f = dst + "/shards/r00001.h5";
  std::filesystem::resize_file(f, std::filesystem::file_size(f) / 2);
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "BadShard") << st.to_string();
  EXPECT_NE(st.file().find("r00001.h5"), std::string::npos);
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(Corruption, DeletedShard) {
  auto dst = write("deleted");
  std::filesystem::remove(dst + "/shards/r00000.h5");
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "ShardMissing") << st.to_string();
  EXPECT_EQ(st.kind(), ErrorKind::kNotFound);
  EXPECT_EQ(ckpt_verify(dst), 4);
}

TEST_P(Corruption, ManifestRules) {
  auto clean = write("mf");
  const json good = manifest(clean);
  struct Edit {
    const char* code;
    std::function<void(json&)> apply;
    int exit = 3;  // corrupt input, unless the rule says otherwise
  };
  std::vector<Edit> edits = {
      {"PieceOverlap", [](json& j) { j["pieces"][1]["region"]["offset"] = {31, 0}; }},
      {"PieceGap", [](json& j) { j["pieces"][1]["region"]["offset"] = {33, 0}, j["pieces"][1]["region"]["extent"] = {31, 32}, j["pieces"][1]["bytes"] = 31 * 32 * 2; }},
      {"RegionOutOfBounds", [](json& j) { j["pieces"][1]["region"]["offset"] = {40, 0}; }},
      {"UnsupportedVersion", [](json& j) { j["version"] = 7; }, 5},
      {"BadByteCount", [](json& j) { j["pieces"][0]["dtype"] = "F32"; }},
      {"DTypeMismatch", [](json& j) { j["pieces"][0]["dtype"] = "I16"; }},  // same size, other HDF5 type
      {"ShapeMismatch",
       [](json& j) {  // consistent manifest, but the dataset holds 32x32 not 16x64
         j["tensors"][0]["shape"] = {32, 64};
         j["pieces"][0]["region"] = {{"offset", {0, 0}}, {"extent", {16, 64}}};
         j["pieces"][1]["region"] = {{"offset", {16, 0}}, {"extent", {16, 64}}};
       }},
      {"BadFileName", [](json& j) { j["pieces"][0]["file"] = "../escape.h5"; }},
      {"MissingDataset", [](json& j) { j["pieces"][0]["dataset"] = "/nope"; }},
      {"UnknownDigest", [](json& j) { j["pieces"][1]["digest"] = "md5:0123456789abcdef0123456789abcdef"; }, 5},
      {"BadField", [](json& j) { j["pieces"][1]["sha256"] = std::string(64, '0'); }},  // v1's field in v3
      {"ManifestChecksumMissing", [](json& j) { j.erase("manifest_digest"); }},
  };
  for (const auto& e : edits) {
    json j = good;
    e.apply(j);
    // Resealed: the rule itself must catch it (a writer's bug seals a bad manifest too).
    put_manifest(clean, (std::string(e.code) == "ManifestChecksumMissing" || std::string(e.code) == "UnsupportedVersion" ? j : resealed(j)).dump());
    Status st = open_status(clean);
    EXPECT_EQ(st.code(), e.code) << st.to_string();
    EXPECT_EQ(ckpt_verify(clean), e.exit) << e.code;
    if (std::string(e.code) == "ManifestChecksumMissing" || std::string(e.code) == "UnsupportedVersion") continue;
    // Not resealed: the manifest checksum finds the edit first (kind checksum, exit 1).
    put_manifest(clean, j.dump());
    st = open_status(clean);
    EXPECT_EQ(st.code(), "ManifestChecksumMismatch") << e.code << ": " << st.to_string();
    EXPECT_NE(st.file().find("manifest.json"), std::string::npos);
    EXPECT_EQ(ckpt_verify(clean), 1) << e.code;
  }
  put_manifest(clean, good.dump().substr(0, 100));
  EXPECT_EQ(open_status(clean).code(), "InvalidJson");
  EXPECT_EQ(ckpt_verify(clean), 3);
  put_manifest(clean, good.dump());
  EXPECT_TRUE(open_status(clean).ok());
}

// A relabelled dtype of the same size (BF16 -> F16, both stored as 16-bit words) passes every
// structural rule; only the manifest checksum finds it.
TEST_P(Corruption, RelabelledDtypeIsChecksumMismatch) {
  auto dst = write("relabel");
  json j = manifest(dst);
  for (auto& p : j["pieces"])
    if (p["dtype"] == "BF16") p["dtype"] = "F16";
  for (auto& t : j["tensors"])
    if (t["dtype"] == "BF16") t["dtype"] = "F16";
  put_manifest(dst, j.dump(1));
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "ManifestChecksumMismatch") << st.to_string();
  EXPECT_EQ(st.kind(), ErrorKind::kChecksum);
  EXPECT_EQ(ckpt_verify(dst), 1);
  put_manifest(dst, resealed(j).dump(1));  // the same edit, resealed: opens (the bytes are 16-bit words either way)
  EXPECT_TRUE(open_status(dst).ok());
}

// HDF5 metadata that disagrees with the manifest: named at open, never a slower read path.
TEST_P(Corruption, StorageSizeInLayoutMessageIsNamed) {
  auto dst = write("size");
  const json m = manifest(dst);
  const auto& p = m["pieces"][0];  // up_proj rows 0..31, 2048 bytes, contiguous
  const std::string file = dst + "/" + p["file"].get<std::string>();
  auto [addr, size] = data_extent(file, p["dataset"]);
  ASSERT_EQ(size, p["bytes"].get<uint64_t>());
  // The layout message holds the data address then its size, 8 bytes each, little-endian.
  std::string bytes = testing::read_file_bytes(file);
  std::string needle(16, '\0');
  for (int b = 0; b < 8; ++b) needle[b] = static_cast<char>(addr >> (8 * b)), needle[8 + b] = static_cast<char>(size >> (8 * b));
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos);
  const uint64_t lower = size - 768;
  for (int b = 0; b < 8; ++b) bytes[at + 8 + b] = static_cast<char>(lower >> (8 * b));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "StorageSizeMismatch") << st.to_string();
  EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
  EXPECT_NE(st.message().find(std::to_string(lower) + " bytes, expected " + std::to_string(size)), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(p["dataset"].get<std::string>()), std::string::npos) << st.message();
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(Corruption, ChunkedDatasetForCodecNoneIsLayoutMismatch) {
  auto dst = write("layout");
  const json m = manifest(dst);
  const auto& p = m["pieces"][0];
  rewrite_dataset(dst + "/" + p["file"].get<std::string>(), p["dataset"], [](hid_t dcpl) {
    const hsize_t chunk[2] = {8, 32};
    H5Pset_chunk(dcpl, 2, chunk);
  });
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "LayoutMismatch") << st.to_string();
  EXPECT_NE(st.message().find("chunked, expected contiguous"), std::string::npos) << st.message();
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(Corruption, CompressedDatasetRules) {
  struct Case {
    const char* code;
    const char* words;
    std::function<void(hid_t)> dcpl;
  };
  const unsigned level[1] = {1};
  const std::vector<Case> cases = {
      {"LayoutMismatch", "contiguous, expected chunked", [](hid_t dcpl) { H5Pset_layout(dcpl, H5D_CONTIGUOUS); }},
      {"FilterMismatch", "expected [shuffle (2), zstd (32015)]",  // zstd without the shuffle the codec names
       [&](hid_t dcpl) {
         const hsize_t chunk[2] = {16, 32};
         H5Pset_chunk(dcpl, 2, chunk);
         H5Pset_filter(dcpl, kZstdFilterId, H5Z_FLAG_MANDATORY, 1, level);
       }},
      {"ChunkShapeMismatch", "chunk dims [32, 16]",  // not whole rows: not the writer's chunking
       [&](hid_t dcpl) {
         const hsize_t chunk[2] = {32, 16};
         H5Pset_chunk(dcpl, 2, chunk);
         H5Pset_shuffle(dcpl);
         H5Pset_filter(dcpl, kZstdFilterId, H5Z_FLAG_MANDATORY, 1, level);
       }},
  };
  for (const auto& c : cases) {
    auto dst = write(std::string("z_") + c.code, Codec::kShuffleZstd);
    const json m = manifest(dst);
    const auto& p = m["pieces"][0];  // BF16 up_proj rows, shuffle+zstd
    ASSERT_EQ(p["codec"], "shuffle+zstd");
    rewrite_dataset(dst + "/" + p["file"].get<std::string>(), p["dataset"], c.dcpl);
    Status st = open_status(dst);
    EXPECT_EQ(st.code(), c.code) << st.to_string();
    EXPECT_NE(st.message().find(c.words), std::string::npos) << st.message();
    EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
    EXPECT_EQ(ckpt_verify(dst), 3) << c.code;
  }
}

INSTANTIATE_TEST_SUITE_P(Digests, Corruption, ::testing::Values(DigestAlgo::kXxh3_128, DigestAlgo::kSha256),
                         [](const ::testing::TestParamInfo<DigestAlgo>& i) {
                           return std::string(i.param == DigestAlgo::kSha256 ? "Sha256" : "Xxh3_128");
                         });

}  // namespace
}  // namespace ckpt::store
