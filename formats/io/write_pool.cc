#include "formats/io/write_pool.h"

#include <algorithm>
#include <chrono>

#include "formats/base/thread_pool.h"

namespace ckpt {

Status WriteGroup::wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return pending_ == 0; });
  return first_;
}

Status WriteGroup::failed() {
  std::lock_guard<std::mutex> l(mu_);
  return first_;
}

void WriteGroup::done(Status st) {
  std::lock_guard<std::mutex> l(mu_);
  if (first_.ok() && !st.ok()) first_ = std::move(st);
  --pending_;
  cv_.notify_all();
}

WritePool::WritePool(int buffers, uint64_t request_bytes, uint64_t probe_bytes)
    : nbuf_(std::max(1, buffers)),
      request_(std::max<uint64_t>(4096, (request_bytes + 4095) / 4096 * 4096)),
      probe_(probe_bytes),
      bprobe_(std::min<uint64_t>(probe_bytes, kBufferedProbeRequests * request_)),
      writers_(std::make_unique<ThreadPool>(nbuf_)) {}

WritePool::~WritePool() { writers_.reset(); }

char* WritePool::acquire() {
  std::unique_lock<std::mutex> l(mu_);
  if (free_.empty() && mem_.size() < static_cast<size_t>(nbuf_)) {
    IoBuffer b(request_);
    if (!b.data()) return nullptr;
    mem_.push_back(std::move(b));
    stats_.allocated = mem_.size();
    return mem_.back().data();
  }
  if (free_.empty()) ++stats_.acquire_waits;
  while (free_.empty()) {
    if (inflight_ > 0) {  // a write in flight gives its buffer back
      cv_.wait(l);
      continue;
    }
    l.unlock();
    const bool released = release_from_holders();
    l.lock();
    if (!released && free_.empty() && inflight_ == 0) cv_.wait_for(l, std::chrono::milliseconds(1));  // buffers being filled
  }
  char* p = free_.back();
  free_.pop_back();
  return p;
}

void WritePool::give_back(char* buf) {
  if (!buf) return;
  std::lock_guard<std::mutex> l(mu_);
  free_.push_back(buf);
  cv_.notify_all();
}

void WritePool::add_holder(Holder* h) {
  std::lock_guard<std::mutex> l(holders_mu_);
  holders_.push_back(h);
}

void WritePool::remove_holder(Holder* h) {
  std::lock_guard<std::mutex> l(holders_mu_);
  holders_.erase(std::remove(holders_.begin(), holders_.end(), h), holders_.end());
}

bool WritePool::release_from_holders() {
  std::lock_guard<std::mutex> l(holders_mu_);
  for (Holder* h : holders_)
    if (h->release_one()) {
      std::lock_guard<std::mutex> s(mu_);
      ++stats_.holder_releases;
      return true;
    }
  return false;
}

namespace {

double now_s() {
  static const auto t0 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void WritePool::set_auto(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  auto_ = on;
  choice_.automatic = on;
}

WritePool::Choice WritePool::choice() const {
  std::lock_guard<std::mutex> l(mu_);
  return choice_;
}

// The buffered probe (writeback waited for), then the direct probe, each alone in flight; then the
// faster way.
WritePool::Route WritePool::route_for(std::unique_lock<std::mutex>& l, uint64_t bytes, int& probe) {
  probe = kNotProbed;
  if (!auto_) return Route::kDirect;
  Probe& buffered = probes_[kBufferedProbeIndex];
  if (buffered.assigned < bprobe_) {
    buffered.assigned += bytes;
    probe = kBufferedProbeIndex;
    return Route::kBufferedProbe;
  }
  cv_.wait(l, [&buffered] { return buffered.done >= buffered.assigned; });
  if (probes_[kDirectProbe].assigned < probe_) {
    probes_[kDirectProbe].assigned += bytes;
    probe = kDirectProbe;
    return Route::kDirect;
  }
  cv_.wait(l, [this] { return choice_.decided; });
  if (choice_.route == Route::kBuffered) probe = kBufferedRun;
  return choice_.route;
}

void WritePool::started(int probe, double t) {
  if (probe == kNotProbed) return;
  Probe& p = probes_[probe];
  if (p.inflight++ == 0) p.busy_since = t;
}

// A probe's rate is its bytes over the time it had a request in flight (the union of its
// requests' times: gaps where the copies had nothing ready do not count against the disk).
void WritePool::finished(int probe, double t, uint64_t bytes) {
  if (probe == kNotProbed) return;
  Probe& p = probes_[probe];
  p.done += bytes;
  if (--p.inflight == 0) p.busy += t - p.busy_since;
  if (probe == kBufferedRun) {  // the run's buffered requests: slower than the direct probe => direct from now on
    choice_.buffered_run_bytes_per_s = p.rate(t);
    if (!choice_.switched && p.done >= probe_ && choice_.buffered_run_bytes_per_s < choice_.direct_bytes_per_s) {
      choice_.route = Route::kDirect;
      choice_.switched = true;
    }
    return;
  }
  const Probe &direct = probes_[kDirectProbe], &buffered = probes_[kBufferedProbeIndex];
  if (direct.assigned < probe_ || direct.done < direct.assigned || buffered.done < buffered.assigned) return;
  choice_.direct_bytes_per_s = direct.rate(t);
  choice_.buffered_bytes_per_s = buffered.rate(t);
  choice_.route = choice_.buffered_bytes_per_s > kBufferedMargin * choice_.direct_bytes_per_s ? Route::kBuffered : Route::kDirect;
  choice_.decided = true;
}

void WritePool::submit(WriteGroup& group, char* buf, uint64_t bytes, std::function<Status(Route)> write) {
  {
    std::lock_guard<std::mutex> l(group.mu_);
    ++group.pending_;
  }
  Route route;
  int probe;
  {
    std::unique_lock<std::mutex> l(mu_);
    ++stats_.writes;
    stats_.bytes += bytes;
    stats_.partial_writes += bytes < request_ ? 1 : 0;
    ++inflight_;
    route = route_for(l, bytes, probe);
  }
  (void)writers_->submit([this, &group, buf, bytes, route, probe, write = std::move(write)] {
    double t0;
    {
      std::lock_guard<std::mutex> l(mu_);
      started(probe, t0 = now_s());
    }
    Status st = write(route);
    {
      std::lock_guard<std::mutex> l(mu_);
      const double t1 = now_s();
      stats_.write_seconds += t1 - t0;
      finished(probe, t1, bytes);
      --inflight_;
      free_.push_back(buf);
      cv_.notify_all();
    }
    group.done(std::move(st));
  });
}

WritePool::Stats WritePool::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace ckpt
