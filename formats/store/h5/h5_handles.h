// RAII owners for HDF5 ids and the one process-wide lock every HDF5 call is made under.
// Debian's HDF5 is not built thread-safe: any code calling the HDF5 C API holds h5_lock()
// for the duration of the calls (hashing and copying run outside it).
// Thread safety: H5Id is a move-only value; h5_lock() is safe from any thread.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <utility>

namespace ckpt::store {

// The global HDF5 lock (recursive: helpers may nest). Also silences HDF5's automatic error
// printing the first time it is taken; errors are reported as ckpt::Status instead.
std::unique_lock<std::recursive_mutex> h5_lock();

// Owns one HDF5 id and closes it with the matching H5?close on destruction.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~H5Id() { reset(); }
  // Closes now; returns false when the close failed (e.g. a flush of a file failed).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && closer_) ok = closer_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }
  bool valid() const { return id_ >= 0; }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// The POSIX descriptor of an open file when HDF5 reads it with its default (sec2) driver, else -1.
// Valid while the file is open; HDF5 reads it with pread too, so positional reads on it are safe
// from any thread without h5_lock(). Call under h5_lock().
int h5_posix_fd(hid_t file);

inline H5Id h5_file(hid_t id) { return H5Id(id, H5Fclose); }
inline H5Id h5_dataset(hid_t id) { return H5Id(id, H5Dclose); }
inline H5Id h5_space(hid_t id) { return H5Id(id, H5Sclose); }
inline H5Id h5_plist(hid_t id) { return H5Id(id, H5Pclose); }
inline H5Id h5_type(hid_t id) { return H5Id(id, H5Tclose); }

}  // namespace ckpt::store
