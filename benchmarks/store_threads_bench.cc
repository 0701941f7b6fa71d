// Compressed store with 1 vs N threads, the store alone (a command, not a timed test): writes
// --gib GiB of bf16 N(0, 0.02) from memory into a shuffle+zstd store (StoreOptions::hash_threads =
// T: the pool that compresses chunks) and reads it back into memory (StoreReader::
// set_decode_threads(T); read_storage_range in 16 MiB slabs, as the executor reads a source), for
// every T of --threads, --reps rounds, the thread counts interleaved within each round. No
// safetensors source, no output file: only store work is timed. The write includes commit (fsync
// unless --no-fsync; --io as the commands take it, auto: direct for these sizes). Reads are from the
// page cache ("warm": the shard read through once, untimed, before; with --cold-reads dropped from
// it instead: "cold").
// Per case: wall s, process CPU s (getrusage), cores used (CPU / wall), the vCPUs' steal time
// (/proc/stat: CPU the host gave to others meanwhile), and CPU s per thread
// (a sampler reads /proc/self/task/*/stat every 10 ms; threads by name: ckpt-encode, ckpt-hash,
// ckpt-decode, formats/base/thread_name.h; "caller" = the thread calling the store), the
// stored bytes (compression ratio) and a checksum of the bytes read back against those written
// (the caller's checksum time is measured and taken off the wall, CPU and "caller" figures).
// Then the codec alone ("encode", "decode": codec_alone below), the same bytes on T threads without
// HDF5 or a file: the ceiling of the store's ratios on this machine.
// Warm-up: one untimed write + read of 1/8 of the data before the first round.
// Prints one JSON object per case, then a table of medians and the T / first-T ratios.
//   ninja -C build store_threads_bench && build/store_threads_bench --gib 2 --threads 1,2 --reps 3
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/store_bench_spec.h"
#include "formats/dtype/dtype.h"
#include "formats/store/chunk_codec.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"

using namespace ckpt;
using namespace ckpt::store;
using Clock = std::chrono::steady_clock;

namespace {

using bench::kPool;
using bench::kSlab;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
double cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// CPU seconds the hypervisor gave to others while this VM's vCPUs wanted to run (/proc/stat "cpu"
// steal, all vCPUs summed): a case whose steal is not ~0 ran on a machine that was not all ours.
double steal_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  unsigned long long v[8] = {};
  f >> cpu;
  for (auto& x : v) f >> x;
  return static_cast<double>(v[7]) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Per-thread CPU ticks of this process, sampled every 10 ms: the last value seen per tid.
class ThreadSampler {
 public:
  ThreadSampler() : main_tid_(static_cast<long>(::syscall(SYS_gettid))), th_([this] { loop(); }) {}
  ~ThreadSampler() {
    stop_ = true;
    th_.join();
  }
  struct Seen {
    std::string name;
    long ticks = 0;
  };
  std::map<long, Seen> snapshot() {
    sample();
    std::lock_guard<std::mutex> l(mu_);
    return seen_;
  }
  // CPU seconds per thread name between two snapshots (tids seen only in `b` count from 0).
  // `caller_excluded`: CPU seconds of the caller's that are not store work.
  nlohmann::json delta(const std::map<long, Seen>& a, const std::map<long, Seen>& b, double caller_excluded) const {
    std::map<std::string, double> by;
    const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
    for (const auto& [tid, s] : b) {
      auto it = a.find(tid);
      const long d = s.ticks - (it == a.end() ? 0 : it->second.ticks);
      if (d > 0 && tid != sampler_tid_) by[tid == main_tid_ ? "caller" : s.name] += d / hz;
    }
    by["caller"] -= caller_excluded;
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [n, v] : by) j[n] = std::round(v * 100) / 100;
    return j;
  }

 private:
  void loop() {
    sampler_tid_ = static_cast<long>(::syscall(SYS_gettid));
    while (!stop_) {
      sample();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void sample() {
    std::map<long, Seen> now;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream f(e.path() / "stat");
      std::string line;
      if (!std::getline(f, line)) continue;
      const auto l = line.find('('), r = line.rfind(')');
      if (l == std::string::npos || r == std::string::npos) continue;
      Seen s;
      s.name = line.substr(l + 1, r - l - 1);
      std::vector<std::string> fld;
      std::string tok;
      for (size_t i = r + 2; i <= line.size(); ++i) {
        if (i == line.size() || line[i] == ' ') {
          fld.push_back(tok);
          tok.clear();
        } else {
          tok += line[i];
        }
      }
      if (fld.size() < 13) continue;
      s.ticks = std::stol(fld[11]) + std::stol(fld[12]);  // utime, stime (fields 14, 15)
      now[std::stol(e.path().filename().string())] = s;
    }
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [tid, s] : now) seen_[tid] = s;
  }
  long main_tid_;
  std::atomic<long> sampler_tid_{-1};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<long, Seen> seen_;
  std::thread th_;
};

std::vector<uint16_t> make_pool() {  // bf16 bits of N(0, 0.02)
  std::vector<uint16_t> v(kPool / 2);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  return v;
}
const char* pool_at(const std::vector<uint16_t>& pool, uint64_t at) {
  return reinterpret_cast<const char*>(pool.data()) + (at % (kPool - kSlab + 1) & ~uint64_t{1});
}

using bench::Spec;
using bench::make_spec;

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}
// Wall and CPU seconds the caller spends checksumming (not store work): taken off every figure.
struct Excluded {
  double wall = 0, cpu = 0;
};
Excluded g_excluded;

// Sum of every 8-byte word (order-independent enough to catch a wrong or missing chunk).
uint64_t word_sum(const char* p, size_t n) {
  const double w0 = now_s(), c0 = thread_cpu_s();
  struct Account {
    double w0, c0;
    ~Account() {
      g_excluded.wall += now_s() - w0;
      g_excluded.cpu += thread_cpu_s() - c0;
    }
  } account{w0, c0};
  uint64_t s = 0, w;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    std::memcpy(&w, p + i, 8);
    s += w * 0x9E3779B97F4A7C15ull + i;
  }
  return s;
}

Status write_store(const std::string& dst, const Spec& spec, const std::vector<uint16_t>& pool, const StoreOptions& opts, uint64_t* sum) {
  StoreWriter w(dst, opts);
  CKPT_RETURN_IF_ERROR(w.begin(spec.tensors, spec.pieces, {{"profile", "reference"}}));
  uint64_t at = 0;
  for (size_t k = 0; k < spec.pieces.size(); ++k) {
    const int64_t n = spec.pieces[k].region.numel(), slab = kSlab / 2;
    for (int64_t i = 0; i < n; i += slab) {
      const int64_t c = std::min(slab, n - i);
      CKPT_RETURN_IF_ERROR(w.write(k, pool_at(pool, at), c));
      *sum += word_sum(pool_at(pool, at), static_cast<size_t>(c) * 2);
      at += static_cast<uint64_t>(c) * 2;
    }
  }
  return w.commit();
}

Status read_store(const std::string& dst, int threads, std::vector<char>& buf, uint64_t* sum, uint64_t* stored) {
  CKPT_ASSIGN_OR_RETURN(auto r, StoreReader::open(dst));
  r->set_decode_threads(threads);
  for (size_t k = 0; k < r->pieces().size(); ++k) {
    const int64_t n = r->pieces()[k].region.numel(), slab = static_cast<int64_t>(buf.size() / 2);
    for (int64_t i = 0; i < n; i += slab) {
      const int64_t e = std::min(n, i + slab);
      CKPT_RETURN_IF_ERROR(r->read_storage_range(k, i, e, buf.data()));
      *sum += word_sum(buf.data(), static_cast<size_t>(e - i) * 2);
    }
    *stored += r->stored_bytes(k);
  }
  return Status::Ok();
}

// The codec alone on T threads: no HDF5, no file, no store. The same bytes as the store phases,
// cut into the store's 4 MiB chunks; T threads take chunks from a shared counter and run
// encode_chunk (shuffle + zstd, the store's pool task), or decode_chunk into a per-thread 16 MiB
// slab (the store decodes into the reader's destination). Its T / first-T ratio is this machine's ceiling for
// the store's: two cores running this code at once are slower each than one alone.
constexpr size_t kCodecChunk = 4u << 20;
Status codec_alone(const char* phase, int threads, uint64_t bytes, const std::vector<uint16_t>& pool, int level,
                   const std::vector<std::string>& frames, uint64_t* sum) {
  const uint64_t chunks = bytes / kCodecChunk;
  std::atomic<uint64_t> next{0}, total{0};
  std::atomic<bool> failed{false};
  const bool encode = std::strcmp(phase, "encode") == 0;
  auto work = [&] {
    std::vector<char> dst(encode ? 0 : kSlab);  // decoded into a 16 MiB slab, as the store's reads
    ChunkBuffer out;                            // compressed into a reused buffer, as the store's writes
    for (uint64_t c; (c = next.fetch_add(1)) < chunks;) {
      if (encode) {
        if (!encode_chunk_into(Codec::kShuffleZstd, level, 2, pool_at(pool, c * kCodecChunk), kCodecChunk, out).ok()) failed = true;
        else total += out.size;
      } else {
        const std::string& f = frames[c % frames.size()];
        char* at = dst.data() + (c % (kSlab / kCodecChunk)) * kCodecChunk;
        if (!decode_chunk(Codec::kShuffleZstd, 2, f.data(), f.size(), at, kCodecChunk).ok()) failed = true;
        else total += static_cast<unsigned char>(at[c % kCodecChunk]);
      }
    }
  };
  std::vector<std::thread> th;
  for (int i = 1; i < threads; ++i) th.emplace_back(work);
  work();  // the calling thread is one of the T
  for (auto& t : th) t.join();
  *sum = total;
  return failed ? Status::Internal(std::string("codec-alone ") + phase + " failed") : Status::Ok();
}

// Untimed, before a read: every shard file of `dst` into the page cache ("warm": read through
// once) or out of it ("cold": fsync, then POSIX_FADV_DONTNEED). Direct writes leave a store cold.
void set_read_cache(const std::string& dst, bool warm, std::vector<char>& buf) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dst)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (warm) {
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
    } else {
      ::fsync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    ::close(fd);
  }
}

bool has_phase(const std::string& list, const char* phase) { return ("," + list + ",").find(std::string(",") + phase + ",") != std::string::npos; }

std::string uptime() {
  std::ifstream f("/proc/loadavg");
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/ckpt_store_threads_bench", tlist = "1,2", plist = "write,read,encode,decode";
  double gib = 2.0;
  int reps = 3, level = 1;
  bool fsync = true;
  IoMode io = IoMode::kAuto;
  bool warm_reads = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = std::atof(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) tlist = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--level" && i + 1 < argc) level = std::atoi(argv[++i]);
    else if (a == "--no-fsync") fsync = false;
    else if (a == "--phases" && i + 1 < argc) plist = argv[++i];
    else if (a == "--cold-reads") warm_reads = false;
    else if (a == "--io" && i + 1 < argc) {
      auto m = parse_io_mode(argv[++i], "--io");
      if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().message().c_str()), 2;
      io = *m;
    }
    else {
      std::fprintf(stderr,
                   "usage: %s [--dir DIR] [--gib 2] [--threads 1,2] [--reps 3] [--level 1] [--no-fsync] [--phases write,read,encode,decode] "
                   "[--io auto|direct|buffered] [--cold-reads]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<int> ts;
  for (size_t p = 0; p < tlist.size();) {
    size_t q = tlist.find(',', p);
    ts.push_back(std::atoi(tlist.substr(p, q - p).c_str()));
    p = q == std::string::npos ? tlist.size() : q + 1;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto pool = make_pool();
  const Spec spec = make_spec(gib);
  std::vector<char> buf(kSlab);
  {  // warm-up, untimed: page-cache and heap pages touched once, pool threads started once
    StoreOptions o;
    o.codec = Codec::kShuffleZstd;
    o.fsync = false;
    o.hash_threads = ts.back();
    uint64_t a = 0, b = 0, c = 0;
    Status st = write_store(dir + "/warm", make_spec(gib / 8), pool, o, &a);
    if (st.ok()) st = read_store(dir + "/warm", ts.back(), buf, &b, &c);
    if (!st.ok()) std::fprintf(stderr, "warm-up: %s\n", st.to_string().c_str());
    std::filesystem::remove_all(dir + "/warm");
  }
  std::vector<std::string> frames;  // distinct stored chunks for the codec-alone decode phase
  for (uint64_t c = 0; c < 16; ++c) {
    auto r = encode_chunk(Codec::kShuffleZstd, level, 2, pool_at(pool, c * kCodecChunk), kCodecChunk);
    if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().to_string().c_str()), 1;
    frames.push_back(std::move(*r));
  }
  ThreadSampler sampler;
  std::map<std::string, std::vector<double>> wall, cpu;
  for (int rep = 0; rep < reps; ++rep) {
    for (int t : ts) {
      StoreOptions o;
      o.codec = Codec::kShuffleZstd;
      o.zstd_level = level;
      o.fsync = fsync;
      o.io = io;
      o.hash_threads = t;
      const std::string dst = dir + "/s";
      std::filesystem::remove_all(dst);
      uint64_t wsum = 0, rsum = 0, stored = 0, csum = 0;
      for (const char* phase : {"write", "read", "encode", "decode"}) {
        if (!has_phase(plist, phase) || (std::strcmp(phase, "read") == 0 && !has_phase(plist, "write"))) continue;  // read needs the written store
        if (std::strcmp(phase, "read") == 0) set_read_cache(dst, warm_reads, buf);
        const std::string load = uptime();
        auto s0 = sampler.snapshot();
        g_excluded = {};
        const double w0 = now_s(), c0 = cpu_s(), st0 = steal_s();
        Status st = std::strcmp(phase, "write") == 0 ? write_store(dst, spec, pool, o, &wsum)
                    : std::strcmp(phase, "read") == 0 ? read_store(dst, t, buf, &rsum, &stored)
                                                       : codec_alone(phase, t, spec.bytes, pool, level, frames, &csum);
        const double dw = now_s() - w0 - g_excluded.wall, dc = cpu_s() - c0 - g_excluded.cpu;
        auto s1 = sampler.snapshot();
        const std::string key = std::string(phase) + " t" + std::to_string(t);
        wall[key].push_back(dw);
        cpu[key].push_back(dc);
        nlohmann::json j = {{"round", rep}, {"case", key}, {"wall_s", std::round(dw * 1000) / 1000}, {"cpu_s", std::round(dc * 100) / 100},
                            {"cores", std::round(dc / dw * 100) / 100}, {"threads_cpu_s", sampler.delta(s0, s1, g_excluded.cpu)}, {"loadavg", load},
                            {"steal_s", std::round((steal_s() - st0) * 100) / 100}};
        if (!st.ok()) j["error"] = st.to_string();
        if (std::strcmp(phase, "read") == 0) {
          j["stored_bytes"] = stored;
          j["ratio"] = std::round(static_cast<double>(spec.bytes) / std::max<uint64_t>(1, stored) * 1000) / 1000;
          j["read_back_equal"] = rsum == wsum;
        }
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
      std::filesystem::remove_all(dst);
    }
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("\ncase | median wall s | median CPU s | cores | vs t%d (wall ratio)\n", ts[0]);
  for (const char* phase : {"write", "read", "encode", "decode"})
    for (int t : ts) {
      if (!has_phase(plist, phase) || (std::strcmp(phase, "read") == 0 && !has_phase(plist, "write"))) continue;
      const std::string key = std::string(phase) + " t" + std::to_string(t), base = std::string(phase) + " t" + std::to_string(ts[0]);
      const double mw = med(wall[key]), mc = med(cpu[key]);
      std::printf("%s | %.3f | %.2f | %.2f | %.2fx\n", key.c_str(), mw, mc, mc / mw, med(wall[base]) / mw);
    }
  std::printf("bytes %llu, loadavg after %s\n", static_cast<unsigned long long>(spec.bytes), uptime().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
