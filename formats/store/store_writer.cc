#include "formats/store/store_writer.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <unordered_map>

#include "formats/base/fs_util.h"
#include "formats/base/thread_name.h"
#include "formats/base/thread_pool.h"
#include "formats/digest/digest.h"
#include "formats/dtype/dtype.h"
#include "formats/io/output_file.h"
#include "formats/store/chunk_writer.h"
#include "formats/store/direct_vfd.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/h5/h5_types.h"
#include "formats/store/h5/zstd_filter.h"
#include "formats/store/run_dir.h"

namespace ckpt::store {

namespace {

// A stale `<dst>.partial` (from a crashed run) is replaced; an existing `<dst>` is refused.
constexpr PartialDirPolicy kStoreDirPolicy{.replace_stale = true, .empty_target_ok = false};
constexpr size_t kInlineHashBytes = 256 << 10;  // smaller writes are hashed on the calling thread

Status write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type = h5_type(H5Tcopy(H5T_C_S1));
  if (!type.valid() || H5Tset_size(type.get(), std::max<size_t>(1, value.size())) < 0) return Status::Internal("H5Tset_size failed");
  H5Id space = h5_space(H5Screate(H5S_SCALAR));
  H5Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return Status::Io(std::string("cannot create HDF5 attribute ") + name);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.get(), type.get(), v.data()) < 0) return Status::Io(std::string("cannot write HDF5 attribute ") + name);
  return Status::Ok();
}

}  // namespace

struct ShardWriter::Impl {
  struct Slot {
    PieceRecord rec;
    std::vector<hsize_t> dims;
    H5Id ds;                          // open until the piece is complete
    int64_t raw_offset = -1;          // uncompressed: file offset of its contiguous data, else -1
    size_t chunk_stream = SIZE_MAX;   // compressed: its stream in `chunks`
    Digest hash;                      // opts.digest, set at open()
    int64_t numel = 0, written = 0;
    size_t esize = 0;
    // Copies from file extents not done yet: run in order on the pool, hashing the bytes on their
    // way (guarded by copy_mu).
    struct Copy {
      std::vector<FileExtent> runs;  // written back to back
      uint64_t dst_off;
    };
    std::deque<Copy> pending;
    bool draining = false;             // a pool job is draining `pending`
    Status copy_status;               // first error of the asynchronous copies
  };
  std::string path;  // absolute-ish path of the shard file
  std::string rel;   // "shards/r00003.h5"
  StoreOptions opts;
  H5Id file;
  OutputFile out;    // raw data of uncompressed pieces: written / copied at raw_offset (opts.io)
  std::vector<Slot> slots;
  std::mutex copy_mu;
  std::condition_variable copy_cv;
  std::atomic<bool> cancel{false};
  size_t queued = 0;                 // extents waiting or being copied (all slots; copy_mu)
  std::unique_ptr<ThreadPool> pool;  // copies and hashes extents; destroyed (joined) before the slots
  std::unique_ptr<ThreadPool> buffer_hasher;  // hashes a written buffer while it is written
  std::unique_ptr<ChunkWriter> chunks;        // compressed pieces: chunks compressed on `pool`
  bool closed = false;

  ~Impl() {
    cancel.store(true);
    pool.reset();
    buffer_hasher.reset();
  }
  // Copies and hashes the pending extents of `s` in order (a pool job; one per slot at a time).
  void drain(Slot& s) {
    for (;;) {
      Slot::Copy c;
      {
        std::lock_guard<std::mutex> l(copy_mu);
        if (s.pending.empty() || cancel.load() || !s.copy_status.ok()) {
          queued -= s.pending.size();
          s.pending.clear();
          s.draining = false;
          copy_cv.notify_all();
          return;
        }
        c = s.pending.front();
        s.pending.pop_front();
      }
      Status st = out.copy_runs(c.runs, c.dst_off, [&s](const void* p, size_t n) { s.hash.update(p, n); });
      std::lock_guard<std::mutex> l(copy_mu);
      --queued;
      copy_cv.notify_all();
      if (!st.ok()) s.copy_status = std::move(st).with_tensor(s.rec.piece.tensor).with_context("copying into " + rec_desc(s));
    }
  }
  // Blocks until no extent of `s` (or of any slot, for nullptr) waits to be copied and hashed;
  // the first error of those copies.
  Status wait_copied(Slot* only) {
    std::unique_lock<std::mutex> l(copy_mu);
    Status first;
    for (Slot& s : slots) {
      if (only && &s != only) continue;
      copy_cv.wait(l, [&s] { return !s.draining; });
      if (first.ok() && !s.copy_status.ok()) first = s.copy_status;
    }
    return first;
  }
  static std::string rec_desc(const Slot& s) { return "dataset " + s.rec.dataset + " of tensor '" + s.rec.piece.tensor + "'"; }
  // Checks a write of `count` elements to `piece` (index and room left).
  Result<Slot*> slot_for(size_t piece, int64_t count) {
    if (closed) return Status::InvalidArgument("write after close");
    if (piece >= slots.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    Slot& s = slots[piece];
    if (count < 0 || count > s.numel - s.written)
      return Status::InvalidArgument("write of " + std::to_string(count) + " elements to piece #" + std::to_string(piece) + " of tensor '" +
                                     s.rec.piece.tensor + "': only " + std::to_string(s.numel - s.written) + " left")
          .with_tensor(s.rec.piece.tensor);
    return &s;
  }
  Status advance(Slot& s, int64_t count) {
    s.written += count;
    if (s.written == s.numel) {
      if (s.chunk_stream != SIZE_MAX) return Status::Ok();  // chunks may be in flight: closed in close(), after a flush
      auto lock = h5_lock();
      if (!s.ds.reset()) return Status::Io("closing dataset " + s.rec.dataset + " failed").with_file(path).with_tensor(s.rec.piece.tensor);
    }
    return Status::Ok();
  }
};

ShardWriter::ShardWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardWriter::~ShardWriter() {
  if (impl_ && !impl_->closed) abort();
}

Result<std::unique_ptr<ShardWriter>> ShardWriter::open(const std::string& partial_dir, int rank,
                                                       const std::vector<TensorMeta>& tensors,
                                                       const std::vector<Piece>& pieces, const StoreOptions& opts) {
  if (rank < 0 || rank > 99999) return Status::InvalidArgument("rank " + std::to_string(rank) + " out of range [0, 99999]");
  if (opts.codec != Codec::kNone) CKPT_RETURN_IF_ERROR(register_zstd_filter());
  Status v = validate_pieces(tensors, pieces, /*whole=*/false);  // this shard's part: other shards fill its gaps
  if (!v.ok()) return Status::InvalidArgument(v.code() + ": " + v.message()).with_tensor(v.tensor());
  auto impl = std::make_unique<Impl>();
  impl->rel = shard_file_name(rank);
  impl->path = partial_dir + "/" + impl->rel;
  impl->opts = opts;
  impl->pool = std::make_unique<ThreadPool>(std::max(1, opts.hash_threads));
  impl->buffer_hasher = std::make_unique<ThreadPool>(1);
  const uint64_t per_chunk = 2 * std::max<uint64_t>(1, opts.chunk_bytes);
  impl->chunks = std::make_unique<ChunkWriter>(impl->pool.get(), impl->path,
                                               opts.chunk_memory ? static_cast<size_t>(opts.chunk_memory / per_chunk) : SIZE_MAX);
  auto lock = h5_lock();
  CKPT_ASSIGN_OR_RETURN(H5Id fapl, shard_file_access(opts, pieces));  // compressed: ckpt's file driver (direct_vfd.h)
  impl->file = h5_file(H5Fcreate(impl->path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()));
  if (!impl->file.valid()) return Status::Io("cannot create HDF5 shard '" + impl->path + "' (exists, or directory missing)").with_file(impl->path);
  impl->slots.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto& s = impl->slots[i];
    const auto& p = pieces[i];
    s.rec.piece = p;
    s.hash = Digest(opts.digest);
    s.rec.file = impl->rel;
    char name[32];
    std::snprintf(name, sizeof name, "/p%06zu", i);
    s.rec.dataset = name;
    s.esize = dtype_size(p.dtype);
    s.numel = p.region.numel();
    s.rec.bytes = static_cast<uint64_t>(s.numel) * s.esize;
    s.dims = piece_dataset_dims(p.region);
    H5Id space = h5_space(H5Screate_simple(static_cast<int>(s.dims.size()), s.dims.data(), nullptr));
    H5Id dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_obj_track_times(dcpl.get(), 0);  // no timestamps: the same pieces give the same file bytes
    H5Id dapl = h5_plist(H5Pcreate(H5P_DATASET_ACCESS));
    s.rec.codec = s.numel > 0 ? opts.codec : Codec::kNone;
    if (s.rec.codec != Codec::kNone) {
      auto cd = piece_chunk_dims(s.dims, s.esize, opts.chunk_bytes);
      H5Pset_chunk(dcpl.get(), static_cast<int>(cd.size()), cd.data());
      if (s.rec.codec == Codec::kShuffleZstd && s.esize > 1) H5Pset_shuffle(dcpl.get());
      unsigned cdv[1] = {static_cast<unsigned>(opts.zstd_level)};
      if (H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, cdv) < 0)
        return Status::Internal("H5Pset_filter(zstd) failed");
      s.rec.codec_level = opts.zstd_level;
      uint64_t chunk_b = s.esize;
      for (auto c : cd) chunk_b *= c;
      H5Pset_chunk_cache(dapl.get(), 521, std::max<uint64_t>(4 * chunk_b, 16 << 20), 1.0);
    } else if (s.numel > 0) {
      // Contiguous, allocated now and never filled: its file range is known and written by ckpt
      // itself (pwrite / copy_file_bytes), HDF5 writes only metadata.
      if (H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS) < 0 || H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0 ||
          H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0)
        return Status::Internal("HDF5 dataset creation properties (contiguous, early allocation) failed");
    }
    s.ds = h5_dataset(H5Dcreate2(impl->file.get(), s.rec.dataset.c_str(), h5_type_for(p.dtype), space.get(), H5P_DEFAULT,
                                 dcpl.get(), dapl.get()));
    if (!s.ds.valid()) return Status::Io("cannot create dataset " + s.rec.dataset + " for tensor '" + p.tensor + "'").with_file(impl->path);
    if (s.rec.codec != Codec::kNone)
      s.chunk_stream = impl->chunks->add(s.ds.get(), s.dims, piece_chunk_dims(s.dims, s.esize, opts.chunk_bytes), s.esize, s.rec.codec,
                                         opts.zstd_level, Impl::rec_desc(s), p.tensor);
    CKPT_RETURN_IF_ERROR(write_string_attr(s.ds.get(), "tensor", p.tensor));
    CKPT_RETURN_IF_ERROR(write_string_attr(s.ds.get(), "dtype", std::string(dtype_name(p.dtype))));
    if (s.rec.codec == Codec::kNone && s.numel > 0) {
      const haddr_t a = H5Dget_offset(s.ds.get());
      if (a == HADDR_UNDEF || a > static_cast<haddr_t>(INT64_MAX - static_cast<int64_t>(s.rec.bytes)))
        return Status::Internal("HDF5 gave no file offset for contiguous dataset " + s.rec.dataset).with_file(impl->path);
      s.raw_offset = static_cast<int64_t>(a);
    }
  }
  uint64_t raw_bytes = 0;
  for (const auto& s : impl->slots) raw_bytes += s.raw_offset >= 0 ? s.rec.bytes : 0;
  CKPT_ASSIGN_OR_RETURN(impl->out, OutputFile::open(impl->path, O_WRONLY, opts.io, raw_bytes));
  impl->out.set_read_ahead(opts.read_ahead.get());
  if (impl->out.direct()) {
    impl->out.set_write_pool(opts.write_pool.get());
    std::vector<ByteRange> raw;  // the pieces' data: gathered into whole requests across pieces and copy threads
    for (const auto& s : impl->slots)
      if (s.raw_offset >= 0) raw.push_back({static_cast<uint64_t>(s.raw_offset), static_cast<uint64_t>(s.raw_offset) + s.rec.bytes});
    Status g = impl->out.gather_ranges(std::move(raw));
    if (!g.ok()) return std::move(g).with_file(impl->path);
  }
  return std::unique_ptr<ShardWriter>(new ShardWriter(std::move(impl)));
}

Status ShardWriter::write(size_t piece, const void* data, int64_t count) {
  auto& im = *impl_;
  CKPT_ASSIGN_OR_RETURN(Impl::Slot * sp, im.slot_for(piece, count));
  auto& s = *sp;
  if (count == 0) return Status::Ok();
  CKPT_RETURN_IF_ERROR(im.wait_copied(&s));  // earlier extents of this piece first: the hash is in order
  const size_t nbytes = static_cast<size_t>(count) * s.esize;
  std::future<void> hashed;
  if (nbytes >= kInlineHashBytes) hashed = im.buffer_hasher->submit([&s, data, nbytes] {
      name_store_thread("ckpt-hash");
      s.hash.update(data, nbytes);
    });
  else s.hash.update(data, nbytes);
  Status st;
  if (s.raw_offset >= 0) {
    st = im.out.write(data, nbytes, static_cast<uint64_t>(s.raw_offset) + static_cast<uint64_t>(s.written) * s.esize);
    if (!st.ok()) st = std::move(st).with_tensor(s.rec.piece.tensor).with_context("writing " + Impl::rec_desc(s));
  } else {
    st = im.chunks->write(s.chunk_stream, data, static_cast<uint64_t>(count));
    if (!st.ok() && st.tensor().empty()) st = std::move(st).with_tensor(s.rec.piece.tensor);  // a chunk error names its own
  }
  if (hashed.valid()) hashed.get();
  CKPT_RETURN_IF_ERROR(st);
  return im.advance(s, count);
}

bool ShardWriter::accepts_file_extents() const { return impl_->opts.codec == Codec::kNone; }

std::optional<uint64_t> ShardWriter::piece_file_offset(size_t piece) const {
  if (piece >= impl_->slots.size() || impl_->slots[piece].raw_offset < 0) return std::nullopt;
  return static_cast<uint64_t>(impl_->slots[piece].raw_offset);
}

Status ShardWriter::write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) {
  auto& im = *impl_;
  CKPT_ASSIGN_OR_RETURN(Impl::Slot * sp, im.slot_for(piece, count));
  auto& s = *sp;
  if (count == 0) return Status::Ok();
  if (s.raw_offset < 0) return Status::Internal("file extent for compressed " + Impl::rec_desc(s));
  uint64_t bytes = 0;
  for (const FileExtent& r : runs) bytes += r.bytes;
  if (bytes != static_cast<uint64_t>(count) * s.esize)
    return Status::Internal("file extents of " + std::to_string(bytes) + " bytes for " + std::to_string(count) + " elements of " +
                            Impl::rec_desc(s));
  // Copied and hashed on the pool, in order per piece; at most 2 extents per hash thread wait.
  {
    std::unique_lock<std::mutex> l(im.copy_mu);
    im.copy_cv.wait(l, [&im] { return im.queued < 2 * static_cast<size_t>(im.pool->size()); });
    if (!s.copy_status.ok()) return s.copy_status;
    s.pending.push_back({runs, static_cast<uint64_t>(s.raw_offset) + static_cast<uint64_t>(s.written) * s.esize});
    ++im.queued;
    if (!s.draining) {
      s.draining = true;
      Impl* ip = &im;
      Impl::Slot* slot = &s;
      (void)im.pool->submit([ip, slot] { ip->drain(*slot); });
    }
  }
  return im.advance(s, count);
}

Result<std::vector<PieceRecord>> ShardWriter::close() {
  auto& im = *impl_;
  if (im.closed) return Status::InvalidArgument("shard already closed");
  for (size_t i = 0; i < im.slots.size(); ++i) {
    auto& s = im.slots[i];
    if (s.written != s.numel)
      return Status::InvalidArgument("piece #" + std::to_string(i) + " of tensor '" + s.rec.piece.tensor + "' got " + std::to_string(s.written) +
                                     " of " + std::to_string(s.numel) + " elements")
          .with_tensor(s.rec.piece.tensor);
  }
  CKPT_RETURN_IF_ERROR(im.wait_copied(nullptr));
  CKPT_RETURN_IF_ERROR(im.chunks->flush());  // every compressed chunk written, before the datasets close
  CKPT_RETURN_IF_ERROR(im.out.wait());  // the data (gathered blocks) first: a full disk's errno, not HDF5's "flush failed"
  {
    auto lock = h5_lock();
    for (auto& s : im.slots) s.ds.reset();
    if (H5Fflush(im.file.get(), H5F_SCOPE_LOCAL) < 0 || !im.file.reset()) return shard_io_failure("flushing HDF5 shard", im.path);
  }
  im.closed = true;
  CKPT_RETURN_IF_ERROR(im.out.close());
  if (im.opts.fsync) CKPT_RETURN_IF_ERROR(fsync_path(im.path));
  std::vector<PieceRecord> out;
  out.reserve(im.slots.size());
  for (auto& s : im.slots) {
    s.rec.digest = s.hash.value();
    out.push_back(s.rec);
  }
  return out;
}

void ShardWriter::abort() {
  if (!impl_ || impl_->closed) return;
  impl_->cancel.store(true);
  (void)impl_->wait_copied(nullptr);  // jobs read source files the caller may close next
  auto lock = h5_lock();
  for (auto& s : impl_->slots) s.ds.reset();
  impl_->file.reset();
  impl_->closed = true;
}

StoreWriter::StoreWriter(std::string dst, StoreOptions opts) : dst_(std::move(dst)), opts_(opts) {
  while (dst_.size() > 1 && dst_.back() == '/') dst_.pop_back();
}
StoreWriter::~StoreWriter() {
  if (begun_ && !done_) abort();
}

std::string StoreWriter::partial_dir(const std::string& dst) { return PartialDir::path_for(dst); }

Status StoreWriter::prepare_partial(const std::string& dst) {
  PartialDir dir(dst, kStoreDirPolicy);
  CKPT_RETURN_IF_ERROR(dir.create());
  CKPT_RETURN_IF_ERROR(make_dir(dir.path() + "/shards"));
  dir.release();  // finalize() commits it; on failure the caller removes it
  return Status::Ok();
}

Status StoreWriter::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) {
  if (begun_) return Status::InvalidArgument("begin() called twice");
  if (!metadata.is_null() && !metadata.is_object()) return Status::InvalidArgument("checkpoint metadata must be a JSON object");
  if (metadata.is_object())
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      if (is_reserved_key(it.key())) return Status::InvalidArgument("metadata key '" + it.key() + "' is reserved by the store format");
  Status v = validate_pieces(tensors, pieces);
  if (!v.ok()) return Status::InvalidArgument(v.code() + ": " + v.message()).with_tensor(v.tensor());
  CKPT_RETURN_IF_ERROR(prepare_partial(dst_));
  begun_ = true;
  tensors_ = tensors;
  pieces_ = pieces;
  metadata_ = metadata.is_object() ? metadata : nlohmann::json::object();
  auto sw = ShardWriter::open(partial_dir(dst_), 0, tensors, pieces, opts_);
  if (!sw.ok()) {
    abort();
    return sw.take_status();
  }
  shard_ = std::move(sw).value();
  return Status::Ok();
}

Status StoreWriter::write(size_t piece, const void* data, int64_t count) {
  if (!shard_ || done_) return Status::InvalidArgument("write() outside begin()/commit()");
  return shard_->write(piece, data, count);
}

std::vector<size_t> StoreWriter::write_order() const {
  std::vector<size_t> order(pieces_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [this](size_t a, size_t b) {
    return pieces_[a].region.numel() * static_cast<int64_t>(dtype_size(pieces_[a].dtype)) >
           pieces_[b].region.numel() * static_cast<int64_t>(dtype_size(pieces_[b].dtype));
  });
  return order;
}

Status StoreWriter::write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) {
  if (!shard_ || done_) return Status::InvalidArgument("write_from_file() outside begin()/commit()");
  return shard_->write_from_files(piece, runs, count);
}

Status StoreWriter::commit() {
  if (!shard_ || done_) return Status::InvalidArgument("commit() without begin()");
  auto recs = shard_->close();
  if (!recs.ok()) {
    abort();
    return recs.take_status();
  }
  Status st = finalize(dst_, tensors_, std::move(recs).value(), metadata_, opts_);
  if (!st.ok()) {
    abort();
    return st;
  }
  done_ = true;
  return Status::Ok();
}

void StoreWriter::abort() {
  if (shard_) shard_->abort();
  if (begun_ && !done_) (void)remove_tree(partial_dir(dst_));
  done_ = true;
}

Status StoreWriter::finalize(const std::string& dst, const std::vector<TensorMeta>& tensors, std::vector<PieceRecord> records,
                             const nlohmann::json& metadata, const StoreOptions& opts) {
  PartialDir dir(dst, kStoreDirPolicy);  // made by prepare_partial(); left in place if this fails
  const std::string& partial = dir.path();
  std::unordered_map<std::string, size_t> order;
  for (size_t i = 0; i < tensors.size(); ++i) order.emplace(tensors[i].name, i);
  auto key = [&](const PieceRecord& r) {
    auto it = order.find(r.piece.tensor);
    return std::make_tuple(it == order.end() ? SIZE_MAX : it->second, r.piece.region.box.offset, r.piece.region.flat_begin, r.file, r.dataset);
  };
  std::sort(records.begin(), records.end(), [&](const PieceRecord& a, const PieceRecord& b) { return key(a) < key(b); });
  Manifest m;
  m.tensors = tensors;
  m.pieces = std::move(records);
  m.manifest_digest.algo = opts.digest;  // the manifest is sealed with the pieces' algorithm
  if (metadata.is_object())
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      if (!is_reserved_key(it.key())) m.metadata[it.key()] = it.value();
  Status v = validate_manifest(m);
  if (!v.ok()) return Status::InvalidArgument("refusing to commit an invalid store: " + v.code() + ": " + v.message()).with_tensor(v.tensor());
  for (const auto& r : m.pieces)
    if (!path_exists(partial + "/" + r.file))
      return Status::NotFound("shard '" + r.file + "' missing in " + partial).with_file(partial + "/" + r.file);
  CKPT_RETURN_IF_ERROR(dir.check_target());
  CKPT_ASSIGN_OR_RETURN(const std::string text, manifest_text(m));  // reads back through the reader's parser
  if (opts.fsync) CKPT_RETURN_IF_ERROR(fsync_dir(partial + "/shards"));
  CKPT_RETURN_IF_ERROR(write_file_atomic(partial + "/" + kManifestFile, text));
  return dir.commit(opts.fsync);
}

}  // namespace ckpt::store
