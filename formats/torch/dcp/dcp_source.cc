// A DCP directory as a TensorSource (formats/torch/dcp/dcp.h): every non-empty chunk is one piece;
// embedded torch.save items are read through TorchFile (a few kept open, least recently used
// closed first), raw items with pread; both are offered to sinks as file extents (an item's
// stored storage entry, or the raw bytes) so the store copies them file to file.
#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "formats/base/file_io.h"
#include "formats/base/fs_util.h"
#include "formats/base/json_read.h"
#include "formats/torch/dcp/dcp.h"
#include "formats/torch/torch_file.h"

namespace ckpt::torch {

namespace dcp_src_detail {

namespace fs = std::filesystem;

constexpr size_t kMaxOpenItems = 8;  // embedded zips kept open at a time

// Reads the sub-box `sub` (chunk coordinates) of a raw row-major chunk of shape `shape` stored
// at byte `base` of `fd`: one pread per run of elements that are contiguous in the file.
Status read_raw_box(int fd, uint64_t base, const Shape& shape, const Box& sub, size_t esz, void* dst, const std::string& what) {
  const size_t nd = shape.size();
  if (sub.numel() == 0) return Status::Ok();
  if (nd == 0) return pread_full(fd, dst, esz, base, what);
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  size_t k = nd - 1;  // dimensions after k are taken whole: one run spans sub.extent[k] * stride[k]
  while (k > 0 && sub.offset[k] == 0 && sub.extent[k] == shape[k]) --k;
  const uint64_t run = static_cast<uint64_t>(sub.extent[k] * stride[k]) * esz;
  std::vector<int64_t> idx(k, 0);  // odometer over dimensions [0, k)
  auto* out = static_cast<char*>(dst);
  while (true) {
    int64_t first = sub.offset[k] * stride[k];
    for (size_t d = 0; d < k; ++d) first += (sub.offset[d] + idx[d]) * stride[d];
    CKPT_RETURN_IF_ERROR(pread_full(fd, out, run, base + static_cast<uint64_t>(first) * esz, what));
    out += run;
    size_t d = k;
    while (d > 0 && ++idx[d - 1] == sub.extent[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  return Status::Ok();
}

class DcpSource final : public TensorSource {
 public:
  static Result<std::unique_ptr<DcpSource>> open(const std::string& dir);

  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_json_; }
  std::string describe() const override { return dir_; }
  Status read(size_t piece, const Box& sub, void* dst) override;
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override;
  const DcpMetadata& dcp_metadata() const { return md_; }

  // Integrity (docs/DCP.md "Integrity"): tensor items written by torch.save are zips, every entry
  // with its CRC-32; raw items, bytes items and .metadata carry no checksum (read, not checked).
  IntegrityInfo integrity() const override;
  // Units: the items, pieces first (unit i = piece i), then the bytes items.
  CheckReport check(const CheckOptions& o) override;
  Status check_piece(size_t piece) override;

 private:
  struct Where {
    size_t tensor = 0, chunk = 0;
    TensorRef ref;  // zip items: the tensor the embedded pickle holds
  };
  struct OpenItem {
    std::string file;
    uint64_t offset = 0;
    std::unique_ptr<TorchFile> tf;
    uint64_t last_use = 0;
  };

  Status index(bool check_items);
  Status load_model_config();
  std::string path_of(const std::string& rel) const { return (fs::path(dir_) / rel).string(); }
  Result<TorchFile*> item(const DcpChunk& c);
  Result<int> raw_fd(const std::string& rel);
  const DcpChunk& chunk_of(size_t piece) const { return md_.tensors[where_[piece].tensor].chunks[where_[piece].chunk]; }

  std::string dir_;
  DcpMetadata md_;
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  std::vector<Where> where_;
  nlohmann::json meta_json_;
  std::vector<OpenItem> open_;
  uint64_t clock_ = 0;
  std::map<std::string, ScopedFd> raw_fds_;
  std::mutex checked_mu_;
  std::map<size_t, Status> checked_;  // piece -> outcome of its item's CRC check

  // Every zip entry of piece `piece`'s item (a torch.save zip) CRC-checked; raw items are read.
  void check_item(size_t piece, const CheckOptions& o, const std::function<void(uint64_t)>& on_bytes, CheckReport& rep);
  // Reads [offset, offset + length) of `rel` in bounded chunks (items without a checksum).
  Status read_through(const std::string& rel, uint64_t offset, uint64_t length, const std::function<void(uint64_t)>& on_bytes);
};

Result<TorchFile*> DcpSource::item(const DcpChunk& c) {
  for (auto& o : open_)
    if (o.offset == c.offset && o.file == c.file) {
      o.last_use = ++clock_;
      return o.tf.get();
    }
  auto tf = TorchFile::open(path_of(c.file), c.offset, c.length);
  if (!tf.ok()) return tf.take_status().with_file(path_of(c.file));
  if (open_.size() >= kMaxOpenItems) {
    auto lru = std::min_element(open_.begin(), open_.end(), [](const OpenItem& a, const OpenItem& b) { return a.last_use < b.last_use; });
    open_.erase(lru);
  }
  open_.push_back(OpenItem{c.file, c.offset, std::move(tf).value(), ++clock_});
  return open_.back().tf.get();
}

Result<int> DcpSource::raw_fd(const std::string& rel) {
  auto it = raw_fds_.find(rel);
  if (it != raw_fds_.end()) return it->second.get();
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path_of(rel), O_RDONLY, "DCP data file"));
  const int r = fd.get();
  raw_fds_.emplace(rel, std::move(fd));
  return r;
}

// Builds tensors and pieces; with `check_items` opens every embedded zip item once and checks
// that it holds one tensor of the chunk's sizes and the tensor's dtype.
Status DcpSource::index(bool check_items) {
  for (size_t ti = 0; ti < md_.tensors.size(); ++ti) {
    const DcpTensor& t = md_.tensors[ti];
    metas_.push_back(TensorMeta{t.fqn, t.dtype, t.size});
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      const DcpChunk& c = t.chunks[ci];
      const Box box{c.offsets, c.sizes};
      if (box.empty()) continue;
      Where w{ti, ci, {}};
      if (!c.raw && check_items) {
        CKPT_ASSIGN_OR_RETURN(TorchFile * tf, item(c));
        const PyObj* root = tf->root();
        const bool same = root && root->type == PyType::kTensor && Shape(root->tensor.size) == c.sizes && root->tensor.storage.dtype == t.dtype;
        if (!same) {
          const std::string found = root && root->type == PyType::kTensor
                                        ? "a tensor of shape " + shape_to_string(Shape(root->tensor.size)) + " in " +
                                              std::string(dtype_name(root->tensor.storage.dtype))
                                        : std::string(root ? py_type_name(root->type) : "nothing");
          return Status::Error("DcpItemMismatch", "DCP item '" + t.fqn + "' chunk at " + shape_to_string(c.offsets) +
                                                      ": expected a tensor of shape " + shape_to_string(c.sizes) + " in " +
                                                      std::string(dtype_name(t.dtype)) + ", the embedded torch.save holds " + found)
              .with_file(path_of(c.file))
              .with_tensor(t.fqn);
        }
        w.ref = root->tensor;
      }
      pieces_.push_back(Piece{t.fqn, Region{box}, t.dtype});
      where_.push_back(std::move(w));
    }
  }
  nlohmann::json bytes = nlohmann::json::array(), files = nlohmann::json::array();
  std::set<std::string> seen;
  for (const auto& b : md_.bytes) bytes.push_back(b.fqn);
  for (const auto& t : md_.tensors)
    for (const auto& c : t.chunks)
      if (seen.insert(c.file).second) files.push_back(c.file);
  meta_json_["dcp"] = {{"version", md_.version}, {"bytes", bytes}, {"files", files}};
  return Status::Ok();
}

// HF LLaMA keys (model.embed_tokens.weight, ...) and a config.json in the directory or its
// parent: the config becomes "model_config", as for a HuggingFace directory, so to-hf and
// reshard know the model.
Status DcpSource::load_model_config() {
  const bool hf = std::any_of(metas_.begin(), metas_.end(), [](const TensorMeta& m) { return m.name == "model.embed_tokens.weight"; });
  if (!hf) return Status::Ok();
  fs::path self = fs::absolute(fs::path(dir_)).lexically_normal();
  if (!self.has_filename()) self = self.parent_path();  // "dir/" -> "dir"
  for (const fs::path& d : {self, self.parent_path()}) {
    std::error_code ec;
    const fs::path cfg = d / "config.json";
    if (!fs::is_regular_file(cfg, ec)) continue;
    CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(cfg.string(), kConfigJsonLimits, "config.json"));
    if (!j.is_object()) return Status::Error("InvalidConfig", "config.json is not a JSON object").with_file(cfg.string());
    meta_json_["model_config"] = std::move(j);
    return Status::Ok();
  }
  return Status::Ok();
}

// A directory that is not a complete checkpoint of its kind is refused by name (docs/INTEGRITY.md):
// torch.distributed.checkpoint writes .metadata last (after every rank's data), Megatron-Core
// writes metadata.json last (after the DCP); without them the data is half a checkpoint, and a
// torch_dist read as a plain DCP would export Megatron-named tensors as if they were a model.
Status check_complete(const std::string& dir, const DcpMetadata* md) {
  std::error_code ec;
  const fs::path d(dir);
  const bool megatron_json = fs::is_regular_file(d / "metadata.json", ec);
  if (md == nullptr) {
    if (fs::is_regular_file(d / ".metadata", ec)) return Status::Ok();
    return Status::Error("IncompleteCheckpoint", "'" + dir + "' holds .distcp data files but no .metadata, which " +
                                                     (megatron_json ? std::string("Megatron-Core torch_dist (metadata.json is here)")
                                                                    : std::string("torch.distributed.checkpoint")) +
                                                     " writes after every rank's data: not a complete PyTorch DCP checkpoint")
        .with_file((d / ".metadata").string());
  }
  if (megatron_json) return Status::Ok();  // a torch_dist directory: opened as such above this source
  std::string marker;
  if (fs::is_regular_file(d / "common.pt", ec)) marker = "common.pt";
  for (const auto& b : md->bytes)
    if (marker.empty() && b.fqn.rfind("common_state", 0) == 0) marker = "the bytes item '" + b.fqn + "'";
  for (const auto& t : md->tensors)
    if (marker.empty() && t.fqn == "decoder.layers.self_attention.linear_qkv.weight" && t.size.size() == 3)
      marker = "stacked layers ('" + t.fqn + "' " + shape_to_string(t.size) + ")";
  if (marker.empty()) return Status::Ok();
  return Status::Error("IncompleteCheckpoint", "'" + dir + "' is a Megatron-Core torch_dist checkpoint (" + marker +
                                                   ") without metadata.json, which Megatron-Core writes last: the save did not complete")
      .with_file((d / "metadata.json").string());
}

Result<std::unique_ptr<DcpSource>> DcpSource::open(const std::string& dir) {
  std::unique_ptr<DcpSource> s(new DcpSource());
  s->dir_ = dir;
  CKPT_RETURN_IF_ERROR(check_complete(dir, nullptr));
  CKPT_ASSIGN_OR_RETURN(s->md_, read_dcp_metadata(dir));
  CKPT_RETURN_IF_ERROR(check_complete(dir, &s->md_));
  CKPT_RETURN_IF_ERROR(s->index(/*check_items=*/true));
  CKPT_RETURN_IF_ERROR(s->load_model_config());
  return s;
}

Status DcpSource::read(size_t piece, const Box& sub, void* dst) {
  if (piece >= pieces_.size()) return Status::InvalidArgument("DCP source '" + dir_ + "': no piece " + std::to_string(piece));
  const DcpChunk& c = chunk_of(piece);
  const Box box{c.offsets, c.sizes};
  if (sub.ndim() != box.ndim() || !box.contains(sub))
    return Status::InvalidArgument("DCP source '" + dir_ + "': " + sub.to_string() + " is not inside piece " + box.to_string())
        .with_tensor(pieces_[piece].tensor);
  Box local = sub;
  for (size_t d = 0; d < local.ndim(); ++d) local.offset[d] -= c.offsets[d];
  const DType dt = pieces_[piece].dtype;
  if (c.raw) {
    CKPT_ASSIGN_OR_RETURN(int fd, raw_fd(c.file));
    return read_raw_box(fd, c.offset, c.sizes, local, dtype_size(dt), dst, path_of(c.file));
  }
  CKPT_ASSIGN_OR_RETURN(TorchFile * tf, item(c));
  Status st = tf->read_tensor(where_[piece].ref, local, dst);
  if (!st.ok()) return std::move(st).with_file(path_of(c.file)).with_tensor(pieces_[piece].tensor);
  return Status::Ok();
}

std::optional<FileExtent> DcpSource::file_extent(size_t piece, const Box& sub) {
  if (piece >= pieces_.size()) return std::nullopt;
  const DcpChunk& c = chunk_of(piece);
  const Box box{c.offsets, c.sizes};
  if (sub.ndim() != box.ndim() || !box.contains(sub)) return std::nullopt;
  if (!c.raw) {
    // An embedded torch.save item: its stored storage entry, in the .distcp file. The descriptor
    // is the source's own (raw_fd), not the item's: items are closed when evicted.
    Box local = sub;
    for (size_t d = 0; d < local.ndim(); ++d) local.offset[d] -= c.offsets[d];
    auto tf = item(c);
    std::optional<FileExtent> e = tf.ok() ? (*tf)->tensor_extent(where_[piece].ref, local) : std::nullopt;
    if (!e) return std::nullopt;
    auto fd = raw_fd(c.file);
    if (!fd.ok()) return std::nullopt;
    e->fd = *fd;
    return e;
  }
  auto start = row_major_run_start(box, sub);
  if (!start) return std::nullopt;
  auto fd = raw_fd(c.file);
  if (!fd.ok()) return std::nullopt;
  const uint64_t esz = dtype_size(pieces_[piece].dtype);
  return FileExtent{*fd, c.offset + static_cast<uint64_t>(*start) * esz, static_cast<uint64_t>(sub.numel()) * esz};
}

IntegrityInfo DcpSource::integrity() const {
  bool zips = false, raw = false;
  for (const auto& t : md_.tensors)
    for (const auto& c : t.chunks) (c.raw ? raw : zips) = true;
  std::string cannot = "PyTorch DCP: .metadata (a pickle)";
  if (!md_.bytes.empty()) cannot += " and bytes items";
  if (raw) cannot += " and raw (not torch.save) tensor items";
  cannot += " have no checksums: read, not checkable";
  return {"PyTorch DCP", zips ? "zip CRC-32" : "", cannot};
}

Status DcpSource::read_through(const std::string& rel, uint64_t offset, uint64_t length, const std::function<void(uint64_t)>& on_bytes) {
  CKPT_ASSIGN_OR_RETURN(int fd, raw_fd(rel));
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(length, 1), 4ull << 20)));
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min<uint64_t>(length - done, buf.size());
    CKPT_RETURN_IF_ERROR(pread_full(fd, buf.data(), n, offset + done, path_of(rel)));
    done += n;
    if (on_bytes) on_bytes(n);
  }
  return Status::Ok();
}

void DcpSource::check_item(size_t piece, const CheckOptions& o, const std::function<void(uint64_t)>& on_bytes, CheckReport& rep) {
  const DcpChunk& c = chunk_of(piece);
  const std::string& fqn = pieces_[piece].tensor;
  const std::string file = path_of(c.file);
  const std::string where = "DCP item '" + fqn + "' chunk at " + shape_to_string(c.offsets) + " (bytes [" + std::to_string(c.offset) + ", " +
                            std::to_string(c.offset + c.length) + ") of '" + c.file + "')";
  if (c.raw) {
    ++rep.pieces;
    rep.bytes += c.length;
    Status st = read_through(c.file, c.offset, c.length, on_bytes);
    if (!st.ok()) rep.failures.push_back({piece, std::move(st).with_context(where).with_tensor(fqn), fqn, file, ""});
    return;
  }
  auto tf = item(c);
  if (!tf.ok()) {
    ++rep.pieces;
    rep.failures.push_back({piece, tf.take_status().with_context(where).with_tensor(fqn), fqn, file, ""});
    return;
  }
  // Units inside the item are its entries; the share was decided per item by the caller.
  CheckOptions all = o;
  all.share = 0;
  all.shares = 1;
  uint64_t unit = 0;
  torch::check_zip_entries(**tf, all, &unit, file, where, [&](const std::string&) { return ZipEntryOwner{piece, fqn}; }, on_bytes, rep);
}

CheckReport DcpSource::check(const CheckOptions& o) {
  CheckReport rep;
  const uint64_t shares = static_cast<uint64_t>(std::max(1, o.shares));
  auto mine = [&](uint64_t u) { return u % shares == static_cast<uint64_t>(o.share); };
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (mine(i)) total += chunk_of(i).length;
  for (size_t b = 0; b < md_.bytes.size(); ++b)
    if (mine(pieces_.size() + b)) total += md_.bytes[b].length;
  auto on_bytes = [&](uint64_t n) {
    done += n;
    if (o.progress) o.progress(std::min(done, total), total);
  };
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (!mine(i)) continue;
    const size_t before = rep.failures.size();
    const uint64_t units = rep.pieces;
    check_item(i, o, on_bytes, rep);
    rep.pieces = units + 1;  // the item is the unit (its entries are checked inside it)
    if (!chunk_of(i).raw) {
      std::lock_guard<std::mutex> g(checked_mu_);
      checked_[i] = rep.failures.size() == before ? Status::Ok() : rep.failures[before].status;
    }
  }
  for (size_t b = 0; b < md_.bytes.size(); ++b) {
    if (!mine(pieces_.size() + b)) continue;
    const DcpBytesItem& it = md_.bytes[b];
    ++rep.pieces;
    rep.bytes += it.length;
    Status st = read_through(it.file, it.offset, it.length, on_bytes);
    if (!st.ok())
      rep.failures.push_back(
          {CheckFailure::kNoPiece, std::move(st).with_context("DCP bytes item '" + it.fqn + "'"), it.fqn, path_of(it.file), it.fqn});
  }
  return rep;
}

Status DcpSource::check_piece(size_t piece) {
  if (piece >= pieces_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
  if (chunk_of(piece).raw) return Status::Ok();  // nothing to check: integrity() says so
  std::lock_guard<std::mutex> g(checked_mu_);
  if (auto it = checked_.find(piece); it != checked_.end()) return it->second;
  CheckReport rep;
  check_item(piece, CheckOptions{}, nullptr, rep);
  return checked_[piece] = rep.ok() ? Status::Ok() : rep.failures.front().status;
}

}  // namespace dcp_src_detail

Result<std::unique_ptr<TensorSource>> open_dcp_dir(const std::string& dir) {
  CKPT_ASSIGN_OR_RETURN(auto s, dcp_src_detail::DcpSource::open(dir));
  return std::unique_ptr<TensorSource>(std::move(s));
}

const DcpMetadata* dcp_metadata_of(const TensorSource& src) {
  const auto* d = dynamic_cast<const dcp_src_detail::DcpSource*>(&src);
  return d ? &d->dcp_metadata() : nullptr;
}

Result<std::string> read_dcp_bytes(const std::string& dir, const DcpBytesItem& item, uint64_t max_bytes) {
  const std::string path = (std::filesystem::path(dir) / item.file).string();
  CKPT_RETURN_IF_ERROR(check_dcp_relative_path(item.file, item.fqn));
  if (item.length > max_bytes)
    return Status::Error("DcpTooLarge", "DCP bytes item '" + item.fqn + "' is " + std::to_string(item.length) + " bytes (at most " +
                                            std::to_string(max_bytes) + " read)")
        .with_file(path);
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_RDONLY, "DCP data file"));
  std::string out(item.length, '\0');
  Status st = pread_full(fd.get(), out.data(), item.length, item.offset, path);
  if (!st.ok()) return std::move(st).with_tensor(item.fqn);
  return out;
}

}  // namespace ckpt::torch
