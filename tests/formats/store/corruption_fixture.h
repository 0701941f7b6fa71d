// The Corruption fixture of the store corruption tests (corruption_test.cc: digests, shards,
// manifest rules; storage_corruption_test.cc: HDF5 storage against the manifest): a two-rank
// store of a bf16 and an f32 tensor written with each piece digest, and the tools to damage it.
#pragma once

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

#include "formats/base/fs_util.h"
#include "formats/digest/digest.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/h5/h5_types.h"
#include "formats/store/h5/zstd_filter.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt::store {
namespace corruption_test {

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

}  // namespace corruption_test
}  // namespace ckpt::store
