#include "formats/safetensors/st_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "formats/base/checked.h"

namespace ckpt::safetensors {

SafetensorsWriter::SafetensorsWriter(std::string path, WriterOptions opts) : path_(std::move(path)), opts_(std::move(opts)) {
  tmp_ = opts_.rename_on_commit ? temp_path_for(path_) : path_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!committed_) abort();
}

Status SafetensorsWriter::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json&) {
  if (out_.valid() || committed_) return Status::Internal("SafetensorsWriter::begin called twice for '" + path_ + "'");
  std::map<std::string, const TensorMeta*> by_name;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t).second) return Status::InvalidArgument("tensor '" + t.name + "' declared twice").with_file(path_);
  std::map<std::string, size_t> piece_of;
  std::vector<TensorEntry> entries;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    auto it = by_name.find(p.tensor);
    if (it == by_name.end())
      return Status::InvalidArgument("piece " + std::to_string(i) + " names undeclared tensor '" + p.tensor + "'").with_file(path_);
    if (p.region.is_flat() || !(p.region.box == Box::whole(it->second->shape)))
      return Status::InvalidArgument("a safetensors file holds whole tensors; piece " + std::to_string(i) + " of '" + p.tensor + "' is " +
                                     p.region.to_string() + ", tensor shape " + shape_to_string(it->second->shape))
          .with_file(path_);
    if (!piece_of.emplace(p.tensor, i).second)
      return Status::InvalidArgument("tensor '" + p.tensor + "' has more than one piece").with_file(path_);
    entries.push_back(TensorEntry{p.tensor, p.dtype, it->second->shape, 0, 0});
  }
  if (piece_of.size() != by_name.size())
    return Status::InvalidArgument("every declared tensor needs exactly one piece (" + std::to_string(by_name.size()) + " tensors, " +
                                   std::to_string(piece_of.size()) + " pieces)").with_file(path_);
  const std::map<std::string, std::string>* md = opts_.write_metadata ? &opts_.metadata : nullptr;
  auto hdr = build_header(entries, md);
  if (!hdr.ok()) return hdr.take_status().with_file(path_);
  data_start_ = 8 + hdr->size();
  slots_.assign(pieces.size(), Slot{});
  uint64_t data_size = 0;
  for (const auto& e : entries) {
    size_t i = piece_of[e.name];
    slots_[i] = Slot{e.name, data_start_ + e.begin, e.end - e.begin, 0, dtype_size(e.dtype)};
    data_size = std::max(data_size, e.end);
  }
  file_size_ = data_start_ + data_size;
  CKPT_ASSIGN_OR_RETURN(out_, OutputFile::open(tmp_, O_WRONLY | O_CREAT | O_TRUNC, opts_.io, file_size_));
  out_.set_read_ahead(opts_.read_ahead);
  if (out_.direct()) {
    out_.set_write_pool(opts_.write_pool);
    std::vector<ByteRange> data;  // the tensors' bytes: gathered into whole requests across tensors and calls
    for (const Slot& s : slots_) data.push_back({s.begin, s.begin + s.bytes});
    CKPT_RETURN_IF_ERROR(out_.gather_ranges(std::move(data)));
  }
  std::string prefix(8, '\0');
  for (int b = 0; b < 8; ++b) prefix[b] = static_cast<char>((hdr->size() >> (8 * b)) & 0xFF);
  prefix += *hdr;
  CKPT_RETURN_IF_ERROR(out_.write(prefix.data(), prefix.size(), 0));
  if (::ftruncate(out_.fd(), static_cast<off_t>(file_size_)) != 0) return Status::FromErrno("cannot size", tmp_, errno);
  return Status::Ok();
}

Result<std::pair<SafetensorsWriter::Slot*, uint64_t>> SafetensorsWriter::next_run(size_t piece, int64_t count) {
  if (!out_.valid()) return Status::Internal("SafetensorsWriter::write before begin for '" + path_ + "'");
  if (piece >= slots_.size()) return Status::Internal("SafetensorsWriter::write: piece " + std::to_string(piece) + " out of range");
  Slot& s = slots_[piece];
  auto bytes = checked_mul(static_cast<uint64_t>(count < 0 ? 0 : count), static_cast<uint64_t>(s.elem));
  if (count < 0 || !bytes || *bytes > s.bytes - s.written)
    return Status::Internal("write of " + std::to_string(count) + " elements overruns tensor '" + s.name + "' (" +
                            std::to_string((s.bytes - s.written) / s.elem) + " left)").with_file(path_);
  return std::pair<Slot*, uint64_t>{&s, *bytes};
}

std::vector<size_t> SafetensorsWriter::write_order() const {
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return slots_[a].begin < slots_[b].begin; });
  return order;
}

Status SafetensorsWriter::write(size_t piece, const void* data, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(auto run, next_run(piece, count));
  CKPT_RETURN_IF_ERROR(out_.write(data, run.second, run.first->begin + run.first->written));
  run.first->written += run.second;
  return Status::Ok();
}

Status SafetensorsWriter::write_at(size_t piece, int64_t first, const void* data, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(auto run, next_run(piece, count));
  Slot& s = *run.first;
  auto off = checked_mul(static_cast<uint64_t>(first < 0 ? 0 : first), static_cast<uint64_t>(s.elem));
  if (first < 0 || !off || *off > s.bytes || run.second > s.bytes - *off)
    return Status::Internal("write of " + std::to_string(count) + " elements at element " + std::to_string(first) +
                            " overruns tensor '" + s.name + "'").with_file(path_);
  CKPT_RETURN_IF_ERROR(out_.write(data, run.second, s.begin + *off));
  s.written += run.second;
  return Status::Ok();
}

Status SafetensorsWriter::write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(auto run, next_run(piece, count));
  uint64_t bytes = 0;
  for (const FileExtent& r : runs) bytes += r.bytes;
  if (bytes != run.second)
    return Status::Internal("file extents of " + std::to_string(bytes) + " bytes for a write of " + std::to_string(run.second)).with_file(path_);
  CKPT_RETURN_IF_ERROR(out_.copy_runs(runs, run.first->begin + run.first->written));
  run.first->written += run.second;
  return Status::Ok();
}

Status SafetensorsWriter::commit() {
  if (!out_.valid()) return Status::Internal("SafetensorsWriter::commit without begin for '" + path_ + "'");
  for (const auto& s : slots_)
    if (s.written != s.bytes)
      return Status::Internal("tensor '" + s.name + "' incomplete: " + std::to_string(s.written) + " of " + std::to_string(s.bytes) +
                              " bytes written").with_file(path_);
  CKPT_RETURN_IF_ERROR(out_.wait());  // writes still in flight on the pool
  if (opts_.fsync && ::fsync(out_.fd()) != 0) return Status::FromErrno("fsync failed", tmp_, errno);
  CKPT_RETURN_IF_ERROR(out_.close());
  if (opts_.rename_on_commit) CKPT_RETURN_IF_ERROR(commit_temp_file(tmp_, path_, opts_.fsync));
  committed_ = true;
  return Status::Ok();
}

void SafetensorsWriter::abort() {
  if (out_.valid()) {
    out_.reset();
    ::unlink(tmp_.c_str());
  }
}

}  // namespace ckpt::safetensors
