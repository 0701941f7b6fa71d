#include "formats/store/source_scan.h"

namespace ckpt::store {

VerifyReport scan_source(TensorSource& src, const std::function<void(uint64_t, uint64_t)>& progress, uint64_t chunk_bytes) {
  CheckOptions o;
  o.progress = progress;
  return read_all_pieces(src, o, chunk_bytes);
}

}  // namespace ckpt::store
