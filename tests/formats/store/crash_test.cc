// Crash consistency: tests/tools/store_crash_writer is SIGKILLed at random moments (20 trials by
// default, 200 with CKPT_LONG=1). After every kill `latest` names a checkpoint that opens,
// verifies and holds the data of its step; `.partial` directories are never taken for one; a
// restarted writer continues past the leftovers.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "formats/store/run_dir.h"
#include "formats/store/store_reader.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt::store {
namespace {

float crash_value(int64_t s, int t, int64_t i) { return static_cast<float>(s * 1000003 + t * 7919 + i % 100003); }

// Element box `elem` of `tensor` (one float), from a piece that holds it.
float read_element(StoreReader& r, const std::string& tensor, const Box& elem) {
  for (size_t p = 0; p < r.pieces().size(); ++p) {
    if (r.pieces()[p].tensor != tensor) continue;
    for (const Box& b : r.pieces()[p].region.boxes()) {
      if (intersect(b, elem) != elem) continue;
      float v = -1;
      Status st = r.read(p, elem, &v);
      EXPECT_TRUE(st.ok()) << st.to_string();
      return v;
    }
  }
  ADD_FAILURE() << "no piece holds " << elem.to_string() << " of " << tensor;
  return -1;
}

pid_t spawn(const std::string& tool, const std::string& run, const char* codec) {
  pid_t pid = fork();
  if (pid == 0) {
    execl(tool.c_str(), tool.c_str(), run.c_str(), "1000000", codec, static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

void check_latest(const std::string& run, int trial) {
  auto dir = resolve_checkpoint(run);
  if (!dir.ok()) {
    // Killed before the very first commit: there must be no `latest` at all.
    ASSERT_FALSE(std::filesystem::exists(run + "/latest")) << dir.status().to_string();
    return;
  }
  ASSERT_EQ(dir->find(".partial"), std::string::npos);
  auto r = StoreReader::open(*dir);
  ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status().to_string();
  auto rep = (*r)->verify();
  ASSERT_TRUE(rep.ok()) << "trial " << trial << ": " << rep.failures[0].status.to_string();
  const int64_t step = (*r)->metadata()["trainer"]["step"].get<int64_t>();
  EXPECT_EQ(*dir, run + "/" + step_dir_name(step));
  // Content: a few elements of every tensor, each read from the piece that holds it.
  for (int t = 0; t < 2; ++t) {
    const auto& meta = (*r)->tensors()[static_cast<size_t>(t)];
    int64_t n = 1;
    for (auto d : meta.shape) n *= d;
    for (int64_t i : {int64_t{0}, n / 3, n / 2 + 77, n - 1}) {
      Shape off(meta.shape.size()), ext(meta.shape.size(), 1);
      int64_t rem = i;
      for (size_t d = meta.shape.size(); d-- > 0;) off[d] = rem % meta.shape[d], rem /= meta.shape[d];
      const float v = read_element(**r, meta.name, Box{off, ext});
      EXPECT_EQ(v, crash_value(step, t, i)) << meta.name << "[" << i << "] step " << step;
    }
  }
}

TEST(CrashConsistency, SigkillAtRandomMoments) {
  const std::string tool = std::string(CKPT_BINARY_DIR) + "/store_crash_writer";
  ASSERT_TRUE(std::filesystem::exists(tool)) << tool << " not built";
  const bool long_run = std::getenv("CKPT_LONG") != nullptr;
  const int trials = long_run ? 200 : 20;
  const std::string run = testing::temp_dir("crash");
  std::mt19937_64 rng(12345);
  int with_latest = 0;
  for (int trial = 0; trial < trials; ++trial) {
    pid_t pid = spawn(tool, run, trial % 3 == 2 ? "shuffle+zstd" : "none");
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 250000));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) << "writer failed, status " << status;
    check_latest(run, trial);
    if (std::filesystem::exists(run + "/latest")) ++with_latest;
    // A .partial directory never resolves as a checkpoint.
    for (const auto& e : std::filesystem::directory_iterator(run))
      if (is_partial_name(e.path().filename().string())) {
        EXPECT_FALSE(resolve_checkpoint(e.path().string()).ok());
      }
  }
  EXPECT_GT(with_latest, trials / 2);
  std::filesystem::remove_all(run);
}

}  // namespace
}  // namespace ckpt::store
