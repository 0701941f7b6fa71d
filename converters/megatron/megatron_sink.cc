#include "converters/megatron/megatron_sink.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace ckpt {

namespace {

// Elements in one row (dim 0 index) of a tensor of shape `shape`.
int64_t row_elems(const Shape& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

constexpr size_t kZeroBytes = 1 << 20;  // zero buffer for the padding rows

}  // namespace

MegatronSink::MegatronSink(std::string dst, const Layout& layout, std::vector<std::vector<MegatronTensor>> ranks,
                           std::vector<std::vector<DType>> dtypes, std::string args_json, bool fsync,
                           std::vector<std::string> dirs)
    : dir_(std::move(dst), fsync),
      layout_(layout),
      ranks_(std::move(ranks)),
      dtypes_(std::move(dtypes)),
      args_json_(std::move(args_json)),
      dirs_(std::move(dirs)) {
  if (dirs_.empty())
    for (int p = 0; p < layout_.pp; ++p)
      for (int r = 0; r < layout_.tp; ++r) dirs_.push_back(megatron_rank_dir(layout_, r, p));
  for (size_t f = 0; f < ranks_.size(); ++f)
    for (size_t i = 0; i < ranks_[f].size(); ++i) {
      const MegatronTensor& t = ranks_[f][i];
      const int64_t row = row_elems(t.shape);
      int64_t first_row = 0;
      for (const MegatronSegment& sg : t.segments) {
        if (!sg.tensor.empty()) {
          pieces_.push_back(Piece{sg.tensor, Region{sg.box}, dtypes_[f][i]});
          targets_.push_back(Target{f, i, first_row * row, sg.rows() * row});
        }
        first_row += sg.rows();
      }
    }
}

Status MegatronSink::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                           const nlohmann::json& metadata) {
  (void)tensors;
  (void)metadata;
  if (pieces != pieces_) return Status::Internal("MegatronSink::begin: pieces are not the sink's segments");
  CKPT_RETURN_IF_ERROR(layout_.as_symmetric("the Megatron sink").status());
  if (ranks_.size() != dirs_.size() || dtypes_.size() != ranks_.size())
    return Status::Internal("MegatronSink: " + std::to_string(ranks_.size()) + " ranks for " + std::to_string(dirs_.size()) +
                            " rank directories");
  CKPT_RETURN_IF_ERROR(dir_.create());
  for (size_t f = 0; f < ranks_.size(); ++f) {
    std::vector<TensorMeta> metas;
    std::vector<Piece> whole;
    for (size_t i = 0; i < ranks_[f].size(); ++i) {
      const MegatronTensor& t = ranks_[f][i];
      metas.push_back(TensorMeta{t.name, dtypes_[f][i], t.shape});
      whole.push_back(Piece{t.name, Region{Box::whole(t.shape)}, dtypes_[f][i]});
    }
    CKPT_ASSIGN_OR_RETURN(auto* w, dir_.add_file(dirs_[f] + "/model.safetensors", metas, whole));
    writers_.push_back(w);
  }
  return write_padding();
}

// Zero rows of every padding segment, at their offsets.
Status MegatronSink::write_padding() {
  const std::vector<unsigned char> zeros(kZeroBytes, 0);
  for (size_t f = 0; f < ranks_.size(); ++f)
    for (size_t i = 0; i < ranks_[f].size(); ++i) {
      const MegatronTensor& t = ranks_[f][i];
      const int64_t row = row_elems(t.shape);
      const int64_t per_write = std::max<int64_t>(1, static_cast<int64_t>(kZeroBytes / dtype_size(dtypes_[f][i])));
      int64_t first_row = 0;
      for (const MegatronSegment& sg : t.segments) {
        const int64_t end = (first_row + sg.rows()) * row;
        if (sg.tensor.empty())
          for (int64_t e = first_row * row; e < end; e += per_write)
            CKPT_RETURN_IF_ERROR(writers_[f]->write_at(i, e, zeros.data(), std::min(per_write, end - e)));
        first_row += sg.rows();
      }
    }
  return Status::Ok();
}

Status MegatronSink::write(size_t piece, const void* data, int64_t count) {
  if (piece >= targets_.size() || writers_.empty())
    return Status::Internal("MegatronSink::write: piece " + std::to_string(piece) + " out of range or before begin");
  Target& t = targets_[piece];
  if (count < 0 || count > t.count - t.done)
    return Status::Internal("MegatronSink::write of " + std::to_string(count) + " elements overruns segment " +
                            std::to_string(piece) + " of '" + ranks_[t.file][t.inner].name + "'");
  CKPT_RETURN_IF_ERROR(writers_[t.file]->write_at(t.inner, t.first + t.done, data, count));
  t.done += count;
  return Status::Ok();
}

std::vector<size_t> MegatronSink::write_order() const {
  std::vector<size_t> order(targets_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (writers_.empty()) return order;
  auto key = [&](size_t k) {
    const Target& t = targets_[k];
    return std::tuple{t.file, writers_[t.file]->piece_offset(t.inner), t.first};
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

Status MegatronSink::commit() { return dir_.commit({{"megatron_args.json", args_json_}}, {}); }

void MegatronSink::abort() {
  dir_.abort();
  writers_.clear();
}

}  // namespace ckpt
