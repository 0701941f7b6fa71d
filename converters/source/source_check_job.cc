#include "converters/source/source_check_job.h"

#include "converters/source/open_checkpoint.h"

namespace ckpt {

void JobSourceCheck::from_copy(TensorSource& src, SourceBlocks& read_ahead) {
  if (skip_) return;
  tap_ = std::make_shared<CopyVerify>(src);
  read_ahead.set_tap(tap_);
  how_ = "copy";
}

void JobSourceCheck::start(const std::string& src_path, IoMode io, int threads, bool skip, bool in_child) {
  skip_ = skip;
  io_ = io == IoMode::kDirect ? IoMode::kDirect : IoMode::kBuffered;
  threads_ = threads;
  if (skip || !in_child) return;
  const IoMode cio = io_;
  if (bg_.start([src_path, cio, threads]() -> Status {
        auto src = open_checkpoint(src_path);
        if (!src.ok()) return src.take_status().with_context("checking SRC");
        if (!(*src)->integrity().checks()) return Status::Ok();  // nothing to check: the job reads every byte anyway
        CheckOptions o;
        o.threads = threads;
        o.io = cio;
        return verdict((*src)->check(o));
      }))
    how_ = "process";
}

Status JobSourceCheck::finish(TensorSource& src) {
  info_ = src.integrity();
  if (skip_) return Status::Ok();
  Status st;
  if (tap_) {
    st = tap_->finish();
  } else if (bg_.started()) {
    st = bg_.wait();  // the child checks nothing where the format has no checks
  } else if (info_.checks()) {
    how_ = "inline";
    CheckOptions o;
    o.threads = threads_;
    o.io = io_;
    st = verdict(src.check(o));
  }
  if (!info_.checks()) how_ = "none";
  return st;
}

nlohmann::json JobSourceCheck::to_json() const {
  if (skip_) return {{"how", "none"}};  // --no-verify, --dry-run, or another rank's to check
  nlohmann::json j = {{"how", how_}, {"scheme", info_.scheme}};
  if (!info_.cannot_check.empty()) j["note"] = info_.cannot_check;
  if (tap_) {
    j["bytes_from_copy"] = tap_->bytes_from_copy();
    j["bytes_reread"] = tap_->bytes_reread();
  }
  return j;
}

}  // namespace ckpt
