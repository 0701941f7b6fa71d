#include "converters/megatron/dist/megatron_dist_sink.h"

#include <algorithm>

#include "formats/base/fs_util.h"

namespace ckpt {

namespace dist_sink_detail {

torch::DcpWriterOptions writer_options(const std::vector<DistTensor>& map, std::vector<torch::DcpBytesEntry> bytes,
                                       WritePool* write_pool) {
  torch::DcpWriterOptions o;
  o.write_pool = write_pool;
  for (const auto& t : map)
    for (const auto& c : t.chunks) o.piece_rank.push_back(c.rank);
  o.bytes = std::move(bytes);
  return o;
}

}  // namespace dist_sink_detail

DistSegmentSink::DistSegmentSink(std::string dst, std::vector<DistTensor> map, std::vector<DType> dtypes,
                                 std::vector<torch::DcpBytesEntry> bytes,
                                 std::vector<std::pair<std::string, std::string>> extra_files, WritePool* write_pool)
    : dst_(dst), map_(std::move(map)), dtypes_(std::move(dtypes)), extra_files_(std::move(extra_files)),
      writer_(dst, dist_sink_detail::writer_options(map_, std::move(bytes), write_pool)) {
  for (size_t t = 0; t < map_.size(); ++t) {
    const DistTensor& d = map_[t];
    inner_tensors_.push_back(TensorMeta{d.key, dtypes_[t], d.shape});
    for (const auto& c : d.chunks) {
      const size_t ci = chunks_.size();
      inner_pieces_.push_back(Piece{d.key, Region{c.box}, dtypes_[t]});
      chunks_.emplace_back();
      for (size_t s = 0; s < c.segments.size(); ++s) {
        const MegatronSegment& sg = c.segments[s];
        const Box mb = dist_segment_box(c, s);
        Seg seg{ci, mb.numel(), -1};
        if (!sg.tensor.empty()) {
          seg.piece = static_cast<int64_t>(pieces_.size());
          pieces_.push_back(Piece{sg.tensor, Region{sg.box}, dtypes_[t]});
          seg_of_piece_.push_back(segs_.size());
        }
        chunks_.back().segs.push_back(segs_.size());
        segs_.push_back(seg);
      }
    }
  }
}

Status DistSegmentSink::begin(const std::vector<TensorMeta>&, const std::vector<Piece>& pieces, const nlohmann::json& metadata) {
  if (pieces != pieces_) return Status::Internal("DistSegmentSink::begin: pieces differ from pieces()");
  CKPT_RETURN_IF_ERROR(writer_.begin(inner_tensors_, inner_pieces_, metadata));
  const std::string dir = PartialDir::path_for(dst_);
  for (const auto& [name, bytes] : extra_files_) CKPT_RETURN_IF_ERROR(write_file(dir + "/" + name, bytes, true));
  for (size_t c = 0; c < chunks_.size(); ++c) CKPT_RETURN_IF_ERROR(advance_padding(c));
  return Status::Ok();
}

// Writes the zero segments at the chunk's cursor (vocab padding), moving past them.
Status DistSegmentSink::advance_padding(size_t chunk) {
  Chunk& c = chunks_[chunk];
  while (c.next < c.segs.size() && segs_[c.segs[c.next]].piece < 0) {
    const Seg& s = segs_[c.segs[c.next]];
    const size_t elem = dtype_size(inner_pieces_[chunk].dtype);
    const std::vector<char> zeros(static_cast<size_t>(std::min<int64_t>(s.count, 1 << 16)) * elem, 0);
    for (int64_t done = 0; done < s.count;) {
      const int64_t n = std::min<int64_t>(s.count - done, 1 << 16);
      CKPT_RETURN_IF_ERROR(writer_.write(chunk, zeros.data(), n));
      done += n;
    }
    ++c.next;
  }
  return Status::Ok();
}

Status DistSegmentSink::write(size_t piece, const void* data, int64_t count) {
  if (piece >= seg_of_piece_.size() || count < 0) return Status::Internal("DistSegmentSink::write: bad piece");
  const size_t si = seg_of_piece_[piece];
  const Seg& s = segs_[si];
  Chunk& c = chunks_[s.chunk];
  if (c.next >= c.segs.size() || c.segs[c.next] != si || c.done + count > s.count)
    return Status::Internal("DistSegmentSink: piece " + std::to_string(piece) + " of '" + pieces_[piece].tensor +
                            "' written out of its chunk's order");
  CKPT_RETURN_IF_ERROR(writer_.write(s.chunk, data, count));
  c.done += count;
  if (c.done == s.count) {
    c.done = 0;
    ++c.next;
    CKPT_RETURN_IF_ERROR(advance_padding(s.chunk));
  }
  return Status::Ok();
}

std::vector<size_t> DistSegmentSink::write_order() const {
  std::vector<size_t> inner = writer_.write_order();
  if (inner.size() != chunks_.size()) {
    inner.resize(chunks_.size());
    for (size_t i = 0; i < inner.size(); ++i) inner[i] = i;
  }
  std::vector<size_t> order;
  for (size_t c : inner)
    for (size_t si : chunks_[c].segs)
      if (segs_[si].piece >= 0) order.push_back(static_cast<size_t>(segs_[si].piece));
  return order;
}

Status DistSegmentSink::commit() {
  for (size_t c = 0; c < chunks_.size(); ++c)
    if (chunks_[c].next != chunks_[c].segs.size())
      return Status::Internal("DistSegmentSink::commit: chunk of '" + inner_pieces_[c].tensor + "' incomplete");
  return writer_.commit();
}

void DistSegmentSink::abort() { writer_.abort(); }

}  // namespace ckpt
