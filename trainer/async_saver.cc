#include "trainer/async_saver.h"

namespace ckpt::trainer {

AsyncSaver::AsyncSaver(std::string run_dir, store::StoreOptions opts)
    : run_dir_(std::move(run_dir)), opts_(opts), thread_([this] { loop(); }) {}

AsyncSaver::~AsyncSaver() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !pending_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncSaver::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return pending_ || stop_; });
    if (stop_ && !pending_) return;
    lk.unlock();
    Status st = write_snapshot(staging_, run_dir_, opts_);
    lk.lock();
    last_ = std::move(st);
    pending_ = false;
    cv_.notify_all();
  }
}

Status AsyncSaver::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !pending_; });
  Status st = std::move(last_);
  last_ = Status::Ok();
  return st;
}

bool AsyncSaver::busy() {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_;
}

Status AsyncSaver::save(Model<float>& model, const AdamW& opt, const TrainerState& state) {
  CKPT_RETURN_IF_ERROR(wait());
  take_snapshot(model, opt, state, &staging_);  // the background thread is idle: safe
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_ = true;
  }
  cv_.notify_all();
  return Status::Ok();
}

}  // namespace ckpt::trainer
