#include "formats/tensor/tensor_io.h"

#include <algorithm>

#include "formats/base/checked.h"

namespace ckpt {

Status CheckReport::verdict(const std::string& what) const {
  if (failures.empty()) return Status::Ok();
  Status first = failures.front().status;
  if (failures.size() == 1) return std::move(first).with_context(what + " failed its check");
  return std::move(first).with_context(what + " failed its check in " + std::to_string(failures.size()) + " units; the first");
}

IntegrityInfo TensorSource::integrity() const {
  return {describe(), "", describe() + " has no checksums: structure validated and every byte read, content not checkable", {}};
}

CheckReport TensorSource::check(const CheckOptions& o) { return read_all_pieces(*this, o); }

Status TensorSource::check_piece(size_t piece) {
  (void)piece;
  return Status::Ok();
}

CheckReport check_of_inner(TensorSource& inner, const CheckOptions& o, bool same_pieces) {
  CheckReport rep = inner.check(o);
  if (!same_pieces)
    for (CheckFailure& f : rep.failures) f.piece = CheckFailure::kNoPiece;
  return rep;
}

CheckReport read_all_pieces(TensorSource& src, const CheckOptions& o, uint64_t chunk_bytes) {
  CheckReport rep;
  const auto& pieces = src.pieces();
  const int shares = std::max(1, o.shares);
  auto mine = [&](size_t i) { return static_cast<int>(i % static_cast<size_t>(shares)) == o.share; };
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!mine(i)) continue;
    const Piece& p = pieces[i];
    auto b = checked_mul(static_cast<uint64_t>(std::max<int64_t>(0, p.region.numel())), static_cast<uint64_t>(dtype_size(p.dtype)));
    total = b ? total + *b : total;
  }
  std::vector<char> buf;  // (chunk elements * element size,) reused for every read
  uint64_t done = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!mine(i)) continue;
    const Piece& p = pieces[i];
    const uint64_t es = dtype_size(p.dtype);
    const int64_t step = static_cast<int64_t>(std::max<uint64_t>(1, chunk_bytes / es));
    buf.resize(std::max<size_t>(buf.size(), static_cast<size_t>(step) * es));
    Status st;
    uint64_t piece_bytes = 0;
    for (const Box& box : p.region.boxes()) {
      const int64_t n = box.numel();
      for (int64_t at = 0; st.ok() && at < n; at += step) {
        const int64_t end = std::min(n, at + step);
        // Boxes whose elements are contiguous in `box`'s row-major order, together [at, end).
        for (const Box& sub : flat_range_to_boxes(box, at, end)) {
          st = src.read(i, sub, buf.data());
          if (!st.ok()) break;
        }
        if (!st.ok()) break;
        const uint64_t nb = static_cast<uint64_t>(end - at) * es;
        piece_bytes += nb;
        done += nb;
        if (o.progress) o.progress(done, total);
      }
      if (!st.ok()) break;
    }
    ++rep.pieces;
    rep.bytes += piece_bytes;
    if (!st.ok()) {
      Status s = std::move(st).with_tensor(p.tensor);
      const std::string file = s.file();
      rep.failures.push_back({i, std::move(s), p.tensor, file, ""});
    }
  }
  return rep;
}

}  // namespace ckpt
