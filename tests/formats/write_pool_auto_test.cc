// --io auto's choice in WritePool (formats/io/write_pool.h), driven by writes whose speed the test
// sets per route (the pool times the caller's write function, so a sleep stands for the disk): the
// buffered probe's requests come first and alone, then the direct probe's; the faster way wins only
// with kBufferedMargin; a run whose buffered requests turn slower than the direct probe switches to
// direct once, and says so.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "formats/io/write_pool.h"

namespace ckpt {
namespace {

using Route = WritePool::Route;
constexpr uint64_t kReq = 4096;

// Submits `n` requests of kReq through `pool`, each sleeping as `ms(route, index)` says; returns the
// routes in submit order.
template <class Ms>
std::vector<Route> auto_run(WritePool& pool, int n, Ms ms) {
  WriteGroup group;
  std::mutex mu;
  std::vector<Route> routes(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    char* buf = pool.acquire();
    EXPECT_NE(buf, nullptr);
    pool.submit(group, buf, kReq, [&, i](Route r) {
      {
        std::lock_guard<std::mutex> l(mu);
        routes[static_cast<size_t>(i)] = r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(ms(r, i)));
      return Status::Ok();
    });
  }
  EXPECT_TRUE(group.wait().ok());
  return routes;
}

TEST(WritePoolAuto, BufferedProbeFirstThenDirectProbeThenTheFasterWay) {
  WritePool pool(4, kReq, /*probe_bytes=*/4 * kReq);
  pool.set_auto(true);
  ASSERT_EQ(pool.buffered_probe_bytes(), WritePool::kBufferedProbeRequests * kReq);
  // buffered 80 ms a request, direct 5 ms: direct wins (sleeps only lengthen under load: wide margins)
  auto routes = auto_run(pool, 12, [](Route r, int) { return r == Route::kDirect ? 5 : 80; });
  EXPECT_EQ(routes[0], Route::kBufferedProbe);
  EXPECT_EQ(routes[1], Route::kBufferedProbe);
  for (int i = 2; i < 12; ++i) EXPECT_EQ(routes[static_cast<size_t>(i)], Route::kDirect) << i;
  const WritePool::Choice c = pool.choice();
  EXPECT_TRUE(c.decided);
  EXPECT_EQ(c.route, Route::kDirect);
  EXPECT_GT(c.direct_bytes_per_s, 2 * c.buffered_bytes_per_s);
  EXPECT_FALSE(c.switched);
}

TEST(WritePoolAuto, BufferedWinsOnlyByTheMargin) {
  {  // buffered 1.2x faster than direct: not enough
    WritePool pool(2, kReq, 2 * kReq);
    pool.set_auto(true);
    auto routes = auto_run(pool, 8, [](Route r, int) { return r == Route::kDirect ? 36 : 30; });
    EXPECT_EQ(pool.choice().route, Route::kDirect);
    EXPECT_EQ(routes.back(), Route::kDirect);
  }
  {  // buffered 12x faster: chosen, and the run's buffered requests stay fast: no switch
    WritePool pool(2, kReq, 2 * kReq);
    pool.set_auto(true);
    auto routes = auto_run(pool, 10, [](Route r, int) { return r == Route::kDirect ? 60 : 5; });
    const WritePool::Choice c = pool.choice();
    EXPECT_EQ(c.route, Route::kBuffered);
    EXPECT_FALSE(c.switched);
    EXPECT_GT(c.buffered_run_bytes_per_s, c.direct_bytes_per_s);
    for (size_t i = 4; i < routes.size(); ++i) EXPECT_EQ(routes[i], Route::kBuffered) << i;
  }
}

TEST(WritePoolAuto, ARunWhoseBufferedWritesTurnSlowSwitchesToDirectOnce) {
  WritePool pool(2, kReq, /*probe_bytes=*/2 * kReq);
  pool.set_auto(true);
  // probes: buffered 5 ms, direct 60 ms -> buffered; then the run's buffered requests take 200 ms
  auto routes = auto_run(pool, 14, [](Route r, int i) { return r == Route::kDirect ? 60 : i < 2 ? 5 : 200; });
  const WritePool::Choice c = pool.choice();
  EXPECT_TRUE(c.switched);
  EXPECT_EQ(c.route, Route::kDirect);
  EXPECT_GT(c.buffered_run_bytes_per_s, 0);
  EXPECT_LT(c.buffered_run_bytes_per_s, c.direct_bytes_per_s);
  EXPECT_EQ(routes[4], Route::kBuffered);
  EXPECT_EQ(routes.back(), Route::kDirect);  // after the switch, never buffered again
  size_t first_direct = 4;
  while (first_direct < routes.size() && routes[first_direct] != Route::kDirect) ++first_direct;
  for (size_t i = first_direct; i < routes.size(); ++i) EXPECT_EQ(routes[i], Route::kDirect) << i;
}

// The run's buffered requests overlap without a pause (staggered lengths: one always in flight), as in
// a busy copy: their rate still counts the time they are in flight, and the switch still comes.
TEST(WritePoolAuto, ASwitchAlsoComesWhenTheRunNeverDrains) {
  WritePool pool(4, kReq, /*probe_bytes=*/2 * kReq);
  pool.set_auto(true);
  auto routes = auto_run(pool, 24, [](Route r, int i) { return r == Route::kDirect ? 60 : i < 2 ? 5 : 150 + 40 * (i % 4); });
  const WritePool::Choice c = pool.choice();
  EXPECT_TRUE(c.switched);
  EXPECT_LT(c.buffered_run_bytes_per_s, c.direct_bytes_per_s);
  EXPECT_EQ(routes.back(), Route::kDirect);
}

}  // namespace
}  // namespace ckpt
