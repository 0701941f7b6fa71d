// A small fixed-size thread pool (executor cast/copy work, store hashing; never HDF5 calls).
// submit() returns a future; tasks run in submission order per worker availability. The workers
// start with the first submit(), not with the pool: a job forks (BackgroundVerify) after sizing
// its pools, and a fork must not meet a thread starting or holding a lock (a pool never used costs
// no thread).
// Thread safety: submit() may be called from any thread; the destructor joins all workers.
// live_workers(): the workers of every pool alive in this process (a fork must see none: see
// reshard/source_verify.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {

class ThreadPool {
 public:
  explicit ThreadPool(int workers) : n_(workers > 0 ? workers : 0) {}
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    live_.fetch_sub(static_cast<int>(threads_.size()));
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }  // the workers it runs (started or not yet)
  static int live_workers() { return live_.load(); }

  template <typename F>
  auto submit(F&& f) -> std::future<decltype(f())> {
    using R = decltype(f());
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    {
      std::lock_guard<std::mutex> l(mu_);
      if (threads_.empty()) start_locked();
      queue_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return fut;
  }

 private:
  void start_locked() {
    for (int i = 0; i < n_; ++i) {
      live_.fetch_add(1);
      threads_.emplace_back([this] { loop(); });
    }
  }
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  const int n_;
  std::vector<std::thread> threads_;  // started by the first submit()
  bool stop_ = false;
  static inline std::atomic<int> live_{0};
};

}  // namespace ckpt
