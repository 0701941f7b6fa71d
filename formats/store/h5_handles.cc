#include "formats/store/h5_handles.h"

namespace ckpt::store {

std::unique_lock<std::recursive_mutex> h5_lock() {
  static std::recursive_mutex mu;
  std::unique_lock<std::recursive_mutex> l(mu);
  static bool quiet = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)quiet;
  return l;
}

}  // namespace ckpt::store
