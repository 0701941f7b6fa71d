#include "formats/torch/dcp/dcp_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "formats/base/checked.h"
#include "formats/base/file_io.h"
#include "formats/tensor/tiling.h"

namespace ckpt::torch {

namespace dcp_writer_detail {

Status bad_piece(const std::string& msg) { return Status::Error("DcpWriteInvalid", msg); }

Shape contiguous_strides(const Shape& extent) {
  Shape st(extent.size(), 1);
  for (size_t d = extent.size(); d-- > 1;) st[d - 1] = st[d] * extent[d];
  return st;
}

// The torch.save zip of one chunk: a dense tensor over storage "0".
Result<std::unique_ptr<TorchZipWriter>> plan_chunk_item(DType dt, const Shape& extent, int64_t numel, bool zip64) {
  PyArena arena;
  TensorRef t;
  t.storage = StorageRef{"0", dt, numel, "cpu"};
  t.size = extent;
  t.stride = contiguous_strides(extent);
  TorchWriteOptions opts;
  opts.archive_name = "archive";
  opts.force_zip64 = zip64;
  opts.serialization_id = "0000000000000000000000000000000000000000";
  return TorchZipWriter::plan(arena.tensor(t), {TorchStorage{"0", dt, numel}}, opts);
}

}  // namespace dcp_writer_detail


DcpWriter::DcpWriter(std::string dir, DcpWriterOptions opts)
    : dir_(std::move(dir)), opts_(std::move(opts)), partial_(dir_, opts_.policy) {}

DcpWriter::~DcpWriter() {
  if (!committed_) abort();
}

Status DcpWriter::check_pieces(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces) const {
  std::map<std::string, const TensorMeta*> by_name;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t).second) return dcp_writer_detail::bad_piece("tensor '" + t.name + "' declared twice");
  for (const auto& b : opts_.bytes)
    if (by_name.count(b.fqn) || b.rank < 0) return dcp_writer_detail::bad_piece("bytes item '" + b.fqn + "' has a tensor's name or a negative rank");
  if (!opts_.piece_rank.empty() && opts_.piece_rank.size() != pieces.size())
    return Status::Internal("DcpWriter: " + std::to_string(opts_.piece_rank.size()) + " piece ranks for " + std::to_string(pieces.size()) +
                            " pieces");
  std::map<std::string, std::vector<size_t>> of_tensor;  // piece numbers per tensor
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    auto it = by_name.find(p.tensor);
    if (it == by_name.end()) return dcp_writer_detail::bad_piece("piece " + std::to_string(i) + " names undeclared tensor '" + p.tensor + "'");
    if (p.region.is_flat())
      return dcp_writer_detail::bad_piece("a DCP chunk is a box; piece " + std::to_string(i) + " of '" + p.tensor + "' is " + p.region.to_string());
    if (p.dtype != it->second->dtype)
      return dcp_writer_detail::bad_piece("piece " + std::to_string(i) + " of '" + p.tensor + "' is " + std::string(dtype_name(p.dtype)) +
                                          ", the tensor " +
                       std::string(dtype_name(it->second->dtype)) + " (DCP holds one dtype per tensor)");
    if (!opts_.piece_rank.empty() && opts_.piece_rank[i] < 0)
      return dcp_writer_detail::bad_piece("piece " + std::to_string(i) + " has a negative rank");
    of_tensor[p.tensor].push_back(i);
  }
  std::vector<Region> regions;
  for (const auto& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(int64_t n, shape_numel(t.shape));
    const std::vector<size_t>& idx = of_tensor[t.name];
    regions.clear();
    for (size_t i : idx) regions.push_back(pieces[i].region);
    // A DCP needs every element in a chunk, each in one (formats/tensor/tiling.h).
    auto f = find_tiling_fault(t.shape, regions);
    if (f && f->kind == TilingFault::Kind::kOverlap)
      return dcp_writer_detail::bad_piece("pieces of '" + t.name + "' overlap: " + regions[f->a].box.to_string() + " and " +
                                          regions[f->b].box.to_string());
    if (f && f->kind != TilingFault::Kind::kGap)
      return dcp_writer_detail::bad_piece("piece " + std::to_string(idx[f->a]) + " of '" + t.name + "': " + f->detail);
    if (f || idx.empty())
      return dcp_writer_detail::bad_piece("the pieces of '" + t.name + "' " + shape_to_string(t.shape) + " cover " +
                                          std::to_string(f ? f->covered : 0) +
                       " of " + std::to_string(n) + " elements (a DCP needs every element in a chunk)");
  }
  return Status::Ok();
}

Status DcpWriter::lay_out(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces) {
  std::map<int, size_t> file_of_rank;
  auto file_for = [&](int rank) {
    auto [it, fresh] = file_of_rank.emplace(rank, files_.size());
    if (fresh) {
      files_.emplace_back();
      files_.back().name = "__" + std::to_string(rank) + "_0.distcp";
    }
    return it->second;
  };
  for (const auto& b : opts_.bytes) {  // bytes items first in their file, as torch writes them
    size_t f = file_for(b.rank);
    bytes_at_.emplace_back(f, files_[f].size);
    md_.bytes.push_back(DcpBytesItem{b.fqn, files_[f].name, files_[f].size, b.data.size()});
    files_[f].size += b.data.size();
  }
  std::map<std::string, size_t> tensor_index;
  for (const auto& t : tensors) {
    tensor_index[t.name] = md_.tensors.size();
    md_.tensors.push_back(DcpTensor{t.name, t.dtype, t.shape, {}});
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    size_t f = file_for(opts_.piece_rank.empty() ? 0 : opts_.piece_rank[i]);
    CKPT_ASSIGN_OR_RETURN(auto zip, dcp_writer_detail::plan_chunk_item(p.dtype, p.region.box.extent, p.region.box.numel(), opts_.force_zip64));
    Item it;
    it.file = f;
    it.base = files_[f].size;
    it.elem = dtype_size(p.dtype);
    it.tensor = p.tensor;
    uint64_t len = zip->size();
    it.zip = std::move(zip);
    md_.tensors[tensor_index[p.tensor]].chunks.push_back(
        DcpChunk{p.region.box.offset, p.region.box.extent, files_[f].name, it.base, len});
    files_[f].size += len;
    items_.push_back(std::move(it));
  }
  return Status::Ok();
}

Status DcpWriter::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json&) {
  if (begun_ || committed_) return Status::Internal("DcpWriter::begin called twice for '" + dir_ + "'");
  Status st = check_pieces(tensors, pieces);
  if (st.ok()) st = lay_out(tensors, pieces);
  if (st.ok()) st = partial_.check_target();
  if (!st.ok()) return std::move(st).with_file(dir_);
  CKPT_RETURN_IF_ERROR(partial_.create());
  begun_ = true;
  for (auto& f : files_) {
    std::string path = partial_.path() + "/" + f.name;
    CKPT_ASSIGN_OR_RETURN(f.out, OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, opts_.io, f.size));
    if (f.out.direct()) f.out.set_write_pool(opts_.write_pool);
    if (::ftruncate(f.out.fd(), static_cast<off_t>(f.size)) != 0) return Status::FromErrno("cannot size", path, errno);
  }
  for (auto& it : items_) it.zip->attach(files_[it.file].out, it.base, partial_.path() + "/" + files_[it.file].name);
  return Status::Ok();
}

Status DcpWriter::write(size_t piece, const void* data, int64_t count) {
  if (!begun_ || piece >= items_.size() || count < 0) return Status::Internal("DcpWriter::write: bad call for piece " + std::to_string(piece));
  Item& it = items_[piece];
  Status st = it.zip->write(0, data, static_cast<uint64_t>(count) * it.elem);
  return st.ok() ? st : std::move(st).with_tensor(it.tensor);
}

Status DcpWriter::write_from_file(size_t piece, const FileExtent& src, int64_t count) {
  if (!begun_ || piece >= items_.size() || count < 0) return Status::Internal("DcpWriter::write: bad call for piece " + std::to_string(piece));
  Item& it = items_[piece];
  if (src.bytes != static_cast<uint64_t>(count) * it.elem)
    return Status::Internal("file extent of " + std::to_string(src.bytes) + " bytes for " + std::to_string(count) + " elements");
  Status st = it.zip->write_from_file(0, src.fd, src.offset, src.bytes);
  return st.ok() ? st : std::move(st).with_tensor(it.tensor);
}

std::vector<size_t> DcpWriter::write_order() const {
  std::vector<size_t> order(items_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(items_[a].file, items_[a].base) < std::pair(items_[b].file, items_[b].base);
  });
  return order;
}

Status DcpWriter::commit() {
  if (!begun_ || committed_) return Status::Internal("DcpWriter::commit without begin for '" + dir_ + "'");
  for (auto& it : items_) {
    Status st = it.zip->finish();
    if (!st.ok()) return std::move(st).with_tensor(it.tensor);
  }
  for (size_t i = 0; i < opts_.bytes.size(); ++i) {
    const auto& [f, off] = bytes_at_[i];
    CKPT_RETURN_IF_ERROR(pwrite_full(files_[f].out.fd(), opts_.bytes[i].data.data(), opts_.bytes[i].data.size(), off,
                                     partial_.path() + "/" + files_[f].name));
  }
  for (auto& f : files_) {
    std::string path = partial_.path() + "/" + f.name;
    CKPT_RETURN_IF_ERROR(f.out.wait());  // item writes still in flight on the pool
    if (opts_.fsync && ::fsync(f.out.fd()) != 0) return Status::FromErrno("fsync failed", path, errno);
    CKPT_RETURN_IF_ERROR(f.out.close());
  }
  CKPT_ASSIGN_OR_RETURN(std::string pkl, pickle_dcp_metadata(md_, opts_.save_id, opts_.flat_planner_data));
  CKPT_RETURN_IF_ERROR(write_file(partial_.path() + "/.metadata", pkl, opts_.fsync));
  CKPT_RETURN_IF_ERROR(partial_.commit(opts_.fsync));
  committed_ = true;
  return Status::Ok();
}

void DcpWriter::abort() {
  if (committed_) return;
  for (auto& f : files_) f.out.reset();
  if (begun_) partial_.remove();
}

}  // namespace ckpt::torch
