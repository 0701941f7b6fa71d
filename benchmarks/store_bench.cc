// Store benchmark (a command, not a timed test): writes and reads a store of --gib GiB of bf16
// weights drawn like real ones (normal, std 0.02), plain and shuffle+zstd, against a plain
// sequential write/read of the same bytes in the same run. Cache state is declared: writes end
// with fsync; before each read the page cache is dropped (echo 3 > /proc/sys/vm/drop_caches)
// when permitted, otherwise reads are reported as "warm". Also times `verify` (every SHA-256)
// and reports the peak RSS of each phase (VmHWM, reset between phases). Prints one JSON object.
// Usage: store_bench [--dir DIR] [--gib 2] [--level 1] [--no-compressed] [--mallopt]
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/store_bench_spec.h"
#include "formats/base/fs_util.h"
#include "formats/dtype/dtype.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"

using namespace ckpt;
using namespace ckpt::store;
using Clock = std::chrono::steady_clock;

namespace {

using bench::kPool;
using bench::kSlab;

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool drop_caches() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return false;
  bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

long maxrss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

// Peak RSS since the last reset_peak_rss() (VmHWM), in MiB; -1 when /proc is not readable.
long peak_rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::atol(line + 6);
  std::fclose(f);
  return kb < 0 ? -1 : kb / 1024;
}
void reset_peak_rss() {  // Linux >= 4.0: "5" resets VmHWM to the current RSS
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  std::fputs("5", f);
  std::fclose(f);
}

// bf16 bits of normal(0, 0.02) values (round to nearest even).
std::vector<uint16_t> make_pool() {  // (kPool / 2,)
  std::vector<uint16_t> v(kPool / 2);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  return v;
}

using bench::Spec;
using bench::make_spec;

// Source bytes of [at, at + n) of the concatenated stream, tiled from the pool.
const char* pool_at(const std::vector<uint16_t>& pool, uint64_t at) {
  return reinterpret_cast<const char*>(pool.data()) + (at % (kPool - kSlab + 1) & ~uint64_t{1});
}

double raw_write(const std::string& path, const std::vector<uint16_t>& pool, uint64_t total) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t at = 0; at < total; at += kSlab) {
    size_t n = std::min<uint64_t>(kSlab, total - at);
    if (::write(fd, pool_at(pool, at), n) != static_cast<ssize_t>(n)) std::perror("write");
  }
  ::fsync(fd);
  ::close(fd);
  (void)fsync_path(parent_dir(path));
  return secs_since(t0);
}

double raw_read(const std::string& path, std::vector<char>& buf, uint64_t* sum) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_RDONLY);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) *sum += static_cast<unsigned char>(buf[static_cast<size_t>(n) - 1]);
  ::close(fd);
  return secs_since(t0);
}

double store_write(const std::string& dst, const Spec& spec, const std::vector<uint16_t>& pool, const StoreOptions& opts, std::string* err) {
  auto t0 = Clock::now();
  StoreWriter w(dst, opts);
  Status st = w.begin(spec.tensors, spec.pieces, {{"profile", "reference"}});
  uint64_t at = 0;
  for (size_t k = 0; st.ok() && k < spec.pieces.size(); ++k) {
    const int64_t n = spec.pieces[k].region.numel();
    const int64_t slab = kSlab / 2;
    for (int64_t i = 0; st.ok() && i < n; i += slab) {
      int64_t c = std::min(slab, n - i);
      st = w.write(k, pool_at(pool, at), c);
      at += static_cast<uint64_t>(c) * 2;
    }
  }
  if (st.ok()) st = w.commit();
  if (!st.ok()) *err = st.to_string();
  return secs_since(t0);
}

double store_read(const std::string& dst, std::vector<char>& buf, uint64_t* sum, uint64_t* stored, std::string* err) {
  auto t0 = Clock::now();
  auto r = StoreReader::open(dst);
  if (!r.ok()) {
    *err = r.status().to_string();
    return 0;
  }
  for (size_t k = 0; k < (*r)->pieces().size(); ++k) {
    const int64_t n = (*r)->pieces()[k].region.numel();
    const int64_t slab = static_cast<int64_t>(buf.size() / 2);
    for (int64_t i = 0; i < n; i += slab) {
      int64_t e = std::min(n, i + slab);
      Status st = (*r)->read_storage_range(k, i, e, buf.data());
      if (!st.ok()) {
        *err = st.to_string();
        return 0;
      }
      *sum += static_cast<unsigned char>(buf[static_cast<size_t>(e - i) * 2 - 1]);
    }
    *stored += (*r)->stored_bytes(k);
  }
  return secs_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/ckpt_store_bench";
  double gib = 2.0;
  int level = 1;
  bool compressed = true, tune = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = std::atof(argv[++i]);
    else if (a == "--level" && i + 1 < argc) level = std::atoi(argv[++i]);
    else if (a == "--no-compressed") compressed = false;
    else if (a == "--mallopt") tune = true;
    else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--gib 2] [--level 1] [--no-compressed] [--mallopt]\n", argv[0]);
      return 2;
    }
  }
  if (tune) mallopt(M_MMAP_THRESHOLD, 64 << 20);  // keep HDF5/zstd chunk buffers off mmap/munmap
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto pool = make_pool();
  const Spec spec = make_spec(gib);
  std::vector<char> buf(kSlab);
  std::memset(buf.data(), 0, buf.size());
  nlohmann::json out;
  out["bytes"] = spec.bytes;
  out["tensors"] = spec.tensors.size();
  out["pieces"] = spec.pieces.size();
  out["mallopt"] = tune;
  uint64_t sum = 0;
  out["baseline_rss_MiB"] = peak_rss_mib();  // pool (64 MiB) + read buffer (16 MiB) + binary

  const double t_raw_w = raw_write(dir + "/raw.bin", pool, spec.bytes);
  bool cold = drop_caches();
  const double t_raw_r = raw_read(dir + "/raw.bin", buf, &sum);
  out["read_cache_state"] = cold ? "cold (caches dropped before each read)" : "warm (drop_caches not permitted)";
  out["raw"] = {{"write_s", t_raw_w}, {"read_s", t_raw_r}, {"write_GBps", spec.bytes / t_raw_w / 1e9}, {"read_GBps", spec.bytes / t_raw_r / 1e9}};
  std::filesystem::remove(dir + "/raw.bin");

  auto run = [&](const char* label, StoreOptions opts) {
    std::string err;
    const std::string dst = dir + "/" + label;
    reset_peak_rss();
    double tw = store_write(dst, spec, pool, opts, &err);
    const long peak_w = peak_rss_mib();
    drop_caches();
    uint64_t stored = 0;
    reset_peak_rss();
    double tr = err.empty() ? store_read(dst, buf, &sum, &stored, &err) : 0;
    const long peak_r = peak_rss_mib();
    // `ckpt verify`'s path: every SHA-256 recomputed (cold when caches can be dropped).
    drop_caches();
    reset_peak_rss();
    double tv = 0;
    if (err.empty()) {
      auto t0 = Clock::now();
      auto r = StoreReader::open(dst);
      if (!r.ok()) err = r.status().to_string();
      else if (auto rep = (*r)->verify(); !rep.ok()) err = rep.failures[0].status.to_string();
      tv = secs_since(t0);
    }
    const long peak_v = peak_rss_mib();
    // Baseline again right after, same state, so noisy neighbours hit both sides.
    double tbw = raw_write(dir + "/raw.bin", pool, spec.bytes);
    drop_caches();
    double tbr = raw_read(dir + "/raw.bin", buf, &sum);
    std::filesystem::remove(dir + "/raw.bin");
    nlohmann::json j = {{"write_s", tw}, {"read_s", tr}, {"write_GBps", spec.bytes / tw / 1e9}, {"read_GBps", tr > 0 ? spec.bytes / tr / 1e9 : 0},
                        {"baseline_write_s", tbw}, {"baseline_read_s", tbr},
                        {"write_ratio_vs_raw", tbw / tw}, {"read_ratio_vs_raw", tr > 0 ? tbr / tr : 0},
                        {"stored_bytes", stored}, {"compression_ratio", stored ? static_cast<double>(spec.bytes) / static_cast<double>(stored) : 0},
                        {"verify_s", tv}, {"verify_GBps", tv > 0 ? spec.bytes / tv / 1e9 : 0},
                        {"peak_rss_MiB", {{"write", peak_w}, {"read", peak_r}, {"verify", peak_v}}}};
    if (!err.empty()) j["error"] = err;
    out[label] = j;
    std::filesystem::remove_all(dst);
  };
  StoreOptions plain;
  run("store_plain", plain);
  if (compressed) {
    StoreOptions z;
    z.codec = Codec::kShuffleZstd;
    z.zstd_level = level;
    run("store_shuffle_zstd", z);
  }
  out["maxrss_MiB"] = maxrss_mib();
  out["checksum"] = sum;
  std::printf("%s\n", out.dump(2).c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
