// Asynchronous checkpoint saving: the training thread copies parameters and moments into a
// staging Snapshot (owned here, reused), then a background thread writes it to the run dir
// while training continues. At most one save is in flight: the next save (or wait()) first
// waits for the previous one. The training loop is blocked only for that wait plus the copy.
// Thread safety: the public methods are called from one (the training) thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "formats/status.h"
#include "formats/store/store_writer.h"
#include "trainer/checkpoint_io.h"

namespace ckpt::trainer {

class AsyncSaver {
 public:
  AsyncSaver(std::string run_dir, store::StoreOptions opts = {});
  ~AsyncSaver();  // waits for the save in flight
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Waits for the previous save (returns its error, if any), snapshots `model`/`opt`/`state`
  // into the staging buffer and starts writing it in the background.
  Status save(Model<float>& model, const AdamW& opt, const TrainerState& state);
  // Waits for the save in flight; returns its status.
  Status wait();
  bool busy();

 private:
  void loop();

  std::string run_dir_;
  store::StoreOptions opts_;
  Snapshot staging_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, stop_ = false;
  Status last_;
  std::thread thread_;
};

}  // namespace ckpt::trainer
