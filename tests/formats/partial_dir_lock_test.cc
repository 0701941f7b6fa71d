// PartialDir's lock against a second writer (docs/INTEGRITY.md): a child process (fork) creates NAME.partial
// and holds it; this process's create() is refused at once with DestinationBusy naming NAME and
// the child's pid, and the child's directory is untouched; once the child is killed (SIGKILL: no
// cleanup, the kernel drops the flock) the leftover is stale and create() replaces it. Also: the
// lock follows the directory through commit's rename, a process may re-lock what it holds
// (nested), and DirLock::try_lock refuses another process's lock.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "formats/base/fs_util.h"
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// A child that runs `body` (which must signal readiness by writing one byte to `ready`) and then
// waits forever; the parent reads the byte before returning the child's pid.
template <class F>
pid_t fork_holder(F body) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    body(fds[1]);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  char c = 0;
  const ssize_t n = ::read(fds[0], &c, 1);
  ::close(fds[0]);
  return n == 1 && c == 'y' ? pid : -1;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

class PartialDirLock : public testing::TempDirTest {};

TEST_F(PartialDirLock, SecondWriterRefusedAtOnceThenStaleLeftoverReplaced) {
  const std::string target = (root_ / "out").string();
  const PartialDirPolicy policy{.replace_stale = true, .empty_target_ok = false};
  const pid_t child = fork_holder([&](int ready) {
    PartialDir d(target, policy);
    const bool ok = d.create().ok();
    if (ok) std::ofstream(d.path() + "/marker") << "child";
    d.release();  // keep it (and its lock) until the process ends
    (void)::write(ready, ok ? "y" : "n", 1);
  });
  ASSERT_GT(child, 0);
  ASSERT_TRUE(fs::exists(target + ".partial/marker"));
  EXPECT_EQ(lock_holder_pid(target + ".partial"), child);

  PartialDir second(target, policy);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = second.create();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "DestinationBusy") << st.to_string();
  EXPECT_NE(st.message().find("'" + target + "'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("pid " + std::to_string(child)), std::string::npos) << st.to_string();
  EXPECT_LT(s, 2.0);
  EXPECT_TRUE(fs::exists(target + ".partial/marker")) << "the live writer's directory was touched";

  kill_and_reap(child);  // a crashed writer: its .partial stays, its lock is gone
  ASSERT_TRUE(fs::exists(target + ".partial/marker"));
  PartialDir third(target, policy);
  ASSERT_TRUE(third.create().ok());
  EXPECT_FALSE(fs::exists(target + ".partial/marker")) << "the stale leftover was not replaced";
  ASSERT_TRUE(third.commit(false).ok());
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_FALSE(fs::exists(target + ".partial"));
}

TEST_F(PartialDirLock, RefusedLeftoverIsNotReplacedWithoutThePolicyEither) {
  const std::string target = (root_ / "st").string();
  const pid_t child = fork_holder([&](int ready) {
    PartialDir d(target);
    const bool ok = d.create().ok();
    d.release();
    (void)::write(ready, ok ? "y" : "n", 1);
  });
  ASSERT_GT(child, 0);
  Status st = PartialDir(target).create();  // replace_stale = false: still named as busy, not stale
  EXPECT_EQ(st.code(), "DestinationBusy") << st.to_string();
  kill_and_reap(child);
  st = PartialDir(target).create();
  EXPECT_EQ(st.code(), "InvalidArgument") << st.to_string();  // a stale leftover, refused by policy
}

TEST_F(PartialDirLock, TheLockIsHeldUntilCommitAndFollowsTheRename) {
  const std::string target = (root_ / "c").string();
  PartialDir d(target);
  ASSERT_TRUE(d.create().ok());
  EXPECT_EQ(lock_holder_pid(d.path()), ::getpid());
  ASSERT_TRUE(d.commit(false).ok());
  EXPECT_EQ(lock_holder_pid(target), -1) << "released at commit";
}

TEST_F(PartialDirLock, DirLockIsNestedInOneProcessAndRefusedAcross) {
  const std::string dir = (root_ / "run").string();
  fs::create_directories(dir);
  // The child is forked before the lock is taken (a forked child shares its parent's locks) and
  // tries once the parent holds it: refused at once, naming the parent.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    char c = 0;
    if (::read(fds[0], &c, 1) != 1) ::_exit(2);
    auto l = DirLock::try_lock(dir, "run dir");
    const bool named = !l.ok() && l.status().code() == "DestinationBusy" &&
                       l.status().message().find("pid " + std::to_string(::getppid())) != std::string::npos;
    ::_exit(named ? 0 : 1);
  }
  ::close(fds[0]);
  auto a = DirLock::try_lock(dir, "run dir");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = DirLock::try_lock(dir, "run dir");  // the same process: granted (nested)
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  b->unlock();
  ASSERT_EQ(::write(fds[1], "y", 1), 1);
  ::close(fds[1]);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the child was not refused with this pid";
  a->unlock();
  EXPECT_EQ(lock_holder_pid(dir), -1);
}

}  // namespace
}  // namespace ckpt
