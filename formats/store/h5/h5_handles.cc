#include "formats/store/h5/h5_handles.h"

namespace ckpt::store {

std::unique_lock<std::recursive_mutex> h5_lock() {
  static std::recursive_mutex mu;
  std::unique_lock<std::recursive_mutex> l(mu);
  static bool quiet = [] {
    // No HDF5 clean-up at exit: every file ckpt writes is closed (and its close checked) before
    // the command returns, and after a close that failed (a flush on a full disk) HDF5's own
    // exit handler crashes in H5F__close_cb walking that file's half-freed state (HDF5 1.10).
    // Must come before any other HDF5 call to take effect.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)quiet;
  return l;
}

int h5_posix_fd(hid_t file) {
  const hid_t fapl = H5Fget_access_plist(file);
  if (fapl < 0) return -1;
  const bool sec2 = H5Pget_driver(fapl) == H5FD_SEC2;
  H5Pclose(fapl);
  void* handle = nullptr;
  if (!sec2 || H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle) return -1;
  return *static_cast<int*>(handle);
}

}  // namespace ckpt::store
