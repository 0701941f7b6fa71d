#include "formats/store/source_scan.h"

#include <algorithm>
#include <vector>

#include "formats/checked.h"
#include "formats/dtype.h"

namespace ckpt::store {

VerifyReport scan_source(TensorSource& src, const std::function<void(uint64_t, uint64_t)>& progress, uint64_t chunk_bytes) {
  VerifyReport rep;
  const auto& pieces = src.pieces();
  uint64_t total = 0;
  for (const auto& p : pieces) {
    auto b = checked_mul(static_cast<uint64_t>(std::max<int64_t>(0, p.region.numel())), static_cast<uint64_t>(dtype_size(p.dtype)));
    total = b ? total + *b : total;
  }
  std::vector<char> buf;  // (chunk elements * element size,) reused for every read
  uint64_t done = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
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
        if (progress) progress(done, total);
      }
      if (!st.ok()) break;
    }
    ++rep.pieces;
    rep.bytes += piece_bytes;
    if (!st.ok()) rep.failures.push_back({i, std::move(st).with_tensor(p.tensor)});
  }
  return rep;
}

}  // namespace ckpt::store
