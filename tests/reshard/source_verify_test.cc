// reshard/source_verify: the background SRC check's verdict crosses the pipe with its kind, and
// the child never outlives its parent, and no child is forked while a thread pool has workers.
#include "reshard/source_verify.h"

#include "formats/base/thread_pool.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// Dead: gone, or a zombie nobody reaps yet (reparented to an init that does not wait).
bool dead(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_s, comm, state;
  stat >> pid_s >> comm >> state;
  return !stat || state == "Z" || state == "X";
}

TEST(BackgroundVerify, VerdictKeepsItsKind) {
  BackgroundVerify bg;
  ASSERT_TRUE(bg.start("/nonexistent/ckpt_source_verify"));
  Status st = bg.wait();
  EXPECT_EQ(st.kind(), ErrorKind::kNotFound) << st.to_string();
  EXPECT_FALSE(bg.started());
}

// A fork copies only the forking thread: a lock a worker held at that moment stays locked in the
// child (clang-14 ASan's allocator: the reshard's check child hung in free()). While a ThreadPool
// has workers start() forks nothing (the caller checks inline); with the pool gone it forks again.
TEST(BackgroundVerify, ForksNothingWhileAPoolHasWorkers) {
  const std::string missing = fs::temp_directory_path() / "ckpt_source_verify_none";
  {
    ThreadPool pool(2);
    EXPECT_EQ(ThreadPool::live_workers(), 0);  // a pool's workers start with its first task
    BackgroundVerify before;
    ASSERT_TRUE(before.start(missing));
    EXPECT_EQ(before.wait().kind(), ErrorKind::kNotFound);
    pool.submit([] {}).get();
    EXPECT_GE(ThreadPool::live_workers(), 2);
    BackgroundVerify bg;
    EXPECT_FALSE(bg.start(missing));
    EXPECT_FALSE(bg.started());
  }
  EXPECT_EQ(ThreadPool::live_workers(), 0);
  BackgroundVerify bg;
  ASSERT_TRUE(bg.start(missing));
  EXPECT_EQ(bg.wait().kind(), ErrorKind::kNotFound);
}

// The child blocks opening SRC's manifest (a FIFO nobody writes); its parent dies without running
// any destructor. The child must die with it (PR_SET_PDEATHSIG), not wait forever.
TEST(BackgroundVerify, ChildDiesWithItsParent) {
  const fs::path d = fs::temp_directory_path() / ("ckpt_bgverify_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  ASSERT_EQ(mkfifo((d / "manifest.json").c_str(), 0600), 0);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    close(p[0]);
    BackgroundVerify bg;
    pid_t child = bg.start(d.string()) ? bg.child_pid() : -1;
    (void)!write(p[1], &child, sizeof child);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the child is blocked in open()
    _exit(0);                                                     // no destructor: only PDEATHSIG can help
  }
  close(p[1]);
  pid_t child = -1;
  ASSERT_EQ(read(p[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  close(p[0]);
  ASSERT_GT(child, 0);
  waitpid(parent, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = dead(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!gone) kill(child, SIGKILL);
  EXPECT_TRUE(gone) << "verify child " << child << " outlived its parent";
  fs::remove_all(d);
}

}  // namespace
}  // namespace ckpt
