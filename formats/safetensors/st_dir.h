// HuggingFace checkpoint directories: a TensorSource over model.safetensors.index.json + shards
// (or one model.safetensors), and a TensorSink that writes shards + index + extra files
// (config.json, tokenizer files) into `<out>.partial/` and renames the directory at commit, through
// SafetensorsDirWriter (the directory commit protocol, shared with the Megatron export).
// Source checks the whole shard set: each listed file present, every tensor exactly once, index
// and shard contents agreeing. Thread safety: source read() may run concurrently; sink: one thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/safetensors/st_index.h"
#include "formats/safetensors/st_reader.h"
#include "formats/safetensors/st_writer.h"

namespace ckpt::safetensors {

class HfDirSource final : public TensorSource {
 public:
  // `dir` holds model.safetensors.index.json (sharded) or model.safetensors. metadata() gets
  // "model_config" = config.json when the directory has one (parsed as JSON, max 16 MiB).
  static Result<std::unique_ptr<HfDirSource>> open(const std::string& dir);
  // A single file; config.json is looked up beside it.
  static Result<std::unique_ptr<HfDirSource>> open_file(const std::string& file);

  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override;
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override;
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return path_; }
  // safetensors has no checksums: check() reads every byte (structure only).
  IntegrityInfo integrity() const override {
    const bool file = path_.size() > 12 && path_.compare(path_.size() - 12, 12, ".safetensors") == 0;
    return {file ? "safetensors" : "huggingface safetensors directory", "",
            "safetensors has no checksums: structure validated and every byte read, content integrity not checkable", {}};
  }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // The file's name (no directory), its bytes stored raw (no codec).
  PieceStorage piece_storage(size_t piece) override;

 private:
  Status add_file(std::unique_ptr<SafetensorsFile> f);
  Status load_config(const std::string& dir);
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<size_t, size_t>> where_;  // piece -> (file, piece in file)
  nlohmann::json meta_ = nlohmann::json::object();
};

// The commit protocol of a directory of safetensors files and small side files: everything is
// built under `<out>.partial/` (files may sit one subdirectory deep), then files and directories
// are fsync'd and the directory renamed to `<out>`; abort() removes only what it created. Used by
// ShardedSafetensorsSink and MegatronSink. One thread at a time.
class SafetensorsDirWriter {
 public:
  SafetensorsDirWriter(std::string out_dir, bool fsync, IoMode io = IoMode::kAuto);  // io: of each file (WriterOptions)
  ~SafetensorsDirWriter();  // abort() unless committed
  SafetensorsDirWriter(const SafetensorsDirWriter&) = delete;
  SafetensorsDirWriter& operator=(const SafetensorsDirWriter&) = delete;

  // Creates `<out>.partial`. Fails if `out` exists and is not an empty directory, or
  // `<out>.partial` exists.
  Status create();
  // A safetensors file at `rel` ("name" or "subdir/name"; the subdirectory is created), begun with
  // `tensors` and `pieces` (SafetensorsWriter::begin). Owned by this writer; committed by commit().
  Result<SafetensorsWriter*> add_file(const std::string& rel, const std::vector<TensorMeta>& tensors,
                                      const std::vector<Piece>& pieces,
                                      const std::map<std::string, std::string>& header_metadata = {{"format", "pt"}});
  // Commits every file, writes `text_files` (name -> content) and copies `copy_files` (name ->
  // source path) beside them, fsyncs, replaces an empty `out` directory, renames.
  Status commit(const std::map<std::string, std::string>& text_files,
                const std::map<std::string, std::string>& copy_files);
  void abort();
  // Files added after this read their copies' sources through `blocks` (WriterOptions::read_ahead).
  void set_read_ahead(SourceBlocks* blocks) { read_ahead_ = blocks; }
  // ... and write through `pool` (WriterOptions::write_pool).
  void set_write_pool(WritePool* pool) { write_pool_ = pool; }

 private:
  PartialDir dir_;
  bool fsync_;
  IoMode io_;
  SourceBlocks* read_ahead_ = nullptr;
  WritePool* write_pool_ = nullptr;
  bool created_ = false, committed_ = false;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
  std::vector<std::string> subdirs_;  // relative paths of the subdirectories created
};

struct ShardedSinkOptions {
  uint64_t max_shard_size = 5'000'000'000ull;  // HF default "5GB"
  std::map<std::string, std::string> shard_metadata = {{"format", "pt"}};
  std::map<std::string, std::string> extra_files;  // name -> content (e.g. config.json)
  std::map<std::string, std::string> copy_files;   // name -> source path (tokenizer files)
  bool fsync = true;
  IoMode io = IoMode::kAuto;  // how shard bytes are written (formats/io/output_file.h)
  SourceBlocks* read_ahead = nullptr;  // WriterOptions::read_ahead of every shard; not owned
  WritePool* write_pool = nullptr;     // WriterOptions::write_pool of every shard; not owned
};

class ShardedSafetensorsSink final : public TensorSink {
 public:
  ShardedSafetensorsSink(std::string out_dir, ShardedSinkOptions opts);
  ~ShardedSafetensorsSink() override;
  // Pieces must be whole tensors; shards follow the order of `pieces` (HF's splitter). Fails if
  // `out_dir` exists and is not empty, or `<out_dir>.partial` exists.
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  bool accepts_file_extents() const override { return true; }
  std::vector<size_t> write_order() const override;  // shard by shard, by file offset
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override;
  bool gathers_file_runs() const override { return true; }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) override;
  Status commit() override;
  void abort() override;
  const std::vector<std::string>& shard_names() const { return names_; }

 private:
  ShardedSinkOptions opts_;
  SafetensorsDirWriter dir_;
  bool begun_ = false;
  std::vector<SafetensorsWriter*> writers_;  // owned by dir_
  std::vector<std::string> names_;
  std::vector<std::pair<size_t, size_t>> where_;  // piece -> (shard, local piece)
  std::map<std::string, std::string> weight_map_;
  uint64_t total_size_ = 0;
};

}  // namespace ckpt::safetensors
