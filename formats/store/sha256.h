// Streaming SHA-256 (OpenSSL EVP) of piece bytes, hex-encoded, and a one-thread helper that
// hashes a buffer while the caller does I/O (pipelining hash with HDF5 calls).
// Thread safety: a Sha256 is used by one thread at a time; HashWorker runs one job at a time.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ckpt::store {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&& o) noexcept;
  Sha256& operator=(Sha256&& o) noexcept;
  void update(const void* data, size_t n);
  // Lower-case hex of the digest; the object is reset afterwards.
  std::string hex_digest();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX*
};

std::string sha256_hex(const void* data, size_t n);
bool is_sha256_hex(const std::string& s);  // 64 lower-case hex digits

// Runs one job at a time on a helper thread: start(job) ... wait(). Used to hash buffer k
// while buffer k+1 is read or written on the calling thread.
class HashWorker {
 public:
  HashWorker();
  ~HashWorker();
  HashWorker(const HashWorker&) = delete;
  HashWorker& operator=(const HashWorker&) = delete;
  void start(std::function<void()> job);  // waits for the previous job first
  void wait();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace ckpt::store
