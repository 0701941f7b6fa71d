// comm_check: exercises ckpt::Comm (reshard/dist/comm.h) under mpirun, for tests/python/test_comm_mpi.py.
//   comm_check collectives          every collective and point-to-point operation for float,
//                                   double and int64 against a naive expectation computed here
//                                   from known per-rank data; prints "rank R: N checks ok" (or
//                                   "MISMATCH ..." lines, exit 1)
//   comm_check groups T,P,D ...     LayoutGroups::make for each layout (tp,pp,dp); rank 0 prints
//                                   one JSON line per layout: per world rank its pp/dp/tp rank and
//                                   the world ranks of each group, in group order
//   comm_check timeout              rank 0 skips an all_reduce_sum (float, 1000 elements),
//                                   computes (sleeps) 1 s, then waits in a recv that never comes;
//                                   the others time out (and rank 0 learns it from them)
//   comm_check bench                rank 0 prints the mean seconds of all_reduce_sum (float) of
//                                   1e3, 1.6e4, 2.56e5 and 4.096e6 elements (not a check)
//   comm_check fail                 rank 1 fails (fail_all, an Io error) while rank 0 waits in an
//                                   all_reduce and rank 2 in a recv from rank 1; every later
//                                   operation must return the same failure at once
// An error is printed as "comm_check: <status>" on stderr (every rank), then Comm::abandon, then
// exit 4 (I/O kind, as cli's codes) or 2 (invalid argument).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reshard/dist/comm.h"

namespace {

using ckpt::Comm;
using ckpt::Status;

int g_checks = 0, g_bad = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_bad;
    std::fprintf(stderr, "MISMATCH rank %d: %s\n", Comm::world().rank(), what.c_str());
  }
}

int fail(const Status& st) {
  std::fprintf(stderr, "comm_check: %s\n", st.to_string().c_str());
  std::fflush(stderr);
  Comm::abandon(st);
  return st.kind() == ckpt::ErrorKind::kInvalidArgument ? 2 : 4;
}

// The element i of rank r: small integers (exact in float whatever the summation order), int64
// values beyond 32 bits.
template <class T> T val(int r, int64_t i) {
  T v = static_cast<T>(((r + 1) * 37 + i * 11) % 101 - 50);
  if constexpr (sizeof(T) == 8 && !std::is_floating_point_v<T>) v += static_cast<T>(r + 1) << 40;
  return v;
}

template <class T> std::vector<T> data(int r, int64_t n, int64_t first = 0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = val<T>(r, first + i);
  return v;
}

template <class T> void expect(Status st, const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  if (!st.ok()) return check(false, what + ": " + st.to_string());
  size_t bad = 0;
  while (bad < want.size() && got[bad] == want[bad]) ++bad;
  check(got.size() == want.size() && bad == want.size(), what + (bad < want.size() ? " differs at " + std::to_string(bad) : ""));
}

template <class T> void collectives(Comm& w, const char* tn, int64_t n) {
  const int r = w.rank(), s = w.size();
  const std::string at = std::string(tn) + " n=" + std::to_string(n);
  std::vector<T> sum(static_cast<size_t>(n), T(0)), mx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    mx[static_cast<size_t>(i)] = val<T>(0, i);
    for (int q = 0; q < s; ++q) {
      sum[static_cast<size_t>(i)] += val<T>(q, i);
      if (val<T>(q, i) > mx[static_cast<size_t>(i)]) mx[static_cast<size_t>(i)] = val<T>(q, i);
    }
  }
  std::vector<T> b = data<T>(r, n);
  expect(w.all_reduce_sum(b.data(), n), b, sum, "all_reduce_sum " + at);
  b = data<T>(r, n);
  expect(w.all_reduce_max(b.data(), n), b, mx, "all_reduce_max " + at);
  // reduce_scatter: block q of rank p's input = elements [q*n, (q+1)*n) of p's data.
  std::vector<T> in = data<T>(r, s * n), out(static_cast<size_t>(n), T(-1)), rs(static_cast<size_t>(n), T(0));
  for (int64_t i = 0; i < n; ++i)
    for (int q = 0; q < s; ++q) rs[static_cast<size_t>(i)] += val<T>(q, r * n + i);
  expect(w.reduce_scatter_sum(in.data(), out.data(), n), out, rs, "reduce_scatter_sum " + at);
  std::vector<T> all, mine = data<T>(r, n), g(static_cast<size_t>(s * n), T(-1));
  for (int q = 0; q < s; ++q) {
    std::vector<T> d = data<T>(q, n);
    all.insert(all.end(), d.begin(), d.end());
  }
  expect(w.all_gather(mine.data(), g.data(), n), g, all, "all_gather " + at);
  std::vector<T> ip(static_cast<size_t>(s * n), T(-1));
  std::copy(mine.begin(), mine.end(), ip.begin() + r * n);
  expect(w.all_gather(ip.data() + r * n, ip.data(), n), ip, all, "all_gather in place " + at);
  // Ring: send to the next rank, receive from the previous one.
  const int next = (r + 1) % s, prev = (r + s - 1) % s;
  std::vector<T> got(static_cast<size_t>(n), T(-1));
  expect(w.sendrecv(mine.data(), n, next, got.data(), n, prev, 7), got, data<T>(prev, n), "sendrecv ring " + at);
  if (s > 1) {
    std::fill(got.begin(), got.end(), T(-1));
    Status st;
    if (r % 2 == 0) {
      st = w.send(mine.data(), n, next, 8);
      if (st.ok()) st = w.recv(got.data(), n, prev, 8);
    } else {
      st = w.recv(got.data(), n, prev, 8);
      if (st.ok()) st = w.send(mine.data(), n, next, 8);
    }
    expect(st, got, data<T>(prev, n), "send/recv ring " + at);
  }
}

void strings(Comm& w) {
  const int r = w.rank(), s = w.size();
  check(w.barrier().ok(), "barrier");
  auto g = w.gather("rank " + std::to_string(r) + std::string(static_cast<size_t>(r) * 3000, 'x'));
  std::vector<std::string> want;
  if (r == 0)
    for (int q = 0; q < s; ++q) want.push_back("rank " + std::to_string(q) + std::string(static_cast<size_t>(q) * 3000, 'x'));
  check(g.ok() && *g == want, "gather");
  for (const std::string& text : {std::string(), std::string(5000, 'b') + "end"}) {
    auto b = w.broadcast(r == 0 ? text : "not this " + std::to_string(r));
    check(b.ok() && *b == text, "broadcast of " + std::to_string(text.size()) + " bytes");
  }
  check(w.agree(Status::Ok()).ok(), "agree (all ok)");
  // Ranks 1.. fail with their own statuses: everyone gets rank 1's (the lowest failing rank).
  Status mine = r == 0 ? Status::Ok()
                       : Status::Error("PieceOverlap", "from rank " + std::to_string(r)).with_tensor("t" + std::to_string(r));
  Status a = w.agree(mine);
  if (s == 1)
    check(a.ok(), "agree (one rank)");
  else
    check(a.code() == "PieceOverlap" && a.message() == "from rank 1" && a.tensor() == "t1", "agree: " + a.to_string());
}

// Splits into even and odd ranks, ordered by decreasing rank.
void split(Comm& w) {
  auto c = w.split(w.rank() % 2, -w.rank());
  if (!c.ok()) return check(false, "split: " + c.status().to_string());
  std::vector<int64_t> members(static_cast<size_t>(c->size()));
  const int64_t me = w.rank();
  Status st = c->all_gather(&me, members.data(), 1);
  std::vector<int64_t> want;
  for (int q = w.size() - 1; q >= 0; --q)
    if (q % 2 == w.rank() % 2) want.push_back(q);
  expect(st, members, want, "split members");
}

int run_collectives(Comm& w) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{70001}}) {
    collectives<float>(w, "float", n);
    collectives<double>(w, "double", n);
    collectives<int64_t>(w, "int64", n);
  }
  strings(w);
  split(w);
  Status st = w.agree(g_bad ? Status::Error("Mismatch", "mismatches") : Status::Ok());
  std::printf("rank %d of %d (%s): %d checks, %d mismatches\n", w.rank(), w.size(), w.is_mpi() ? "mpi" : "no mpi",
              g_checks, g_bad);
  return g_bad || !st.ok() ? 1 : 0;
}

// The world ranks of `c`'s members, in group order.
ckpt::Result<std::vector<int64_t>> members(ckpt::Comm& c) {
  std::vector<int64_t> m(static_cast<size_t>(c.size()));
  const int64_t me = Comm::world().rank();
  CKPT_RETURN_IF_ERROR(c.all_gather(&me, m.data(), 1));
  return m;
}

int run_groups(Comm& w, int argc, char** argv) {
  for (int a = 2; a < argc; ++a) {
    int tp = 0, pp = 0, dp = 0;
    if (std::sscanf(argv[a], "%d,%d,%d", &tp, &pp, &dp) != 3) return fail(Status::InvalidArgument(argv[a]));
    auto layout = ckpt::Layout::make(tp, pp, dp, 0, 2 * pp);
    if (!layout.ok()) return fail(layout.status());
    auto g = ckpt::LayoutGroups::make(w, *layout);
    if (!g.ok()) return fail(g.status());
    nlohmann::json j = {{"rank", w.rank()}, {"pp_rank", g->pp_rank}, {"dp_rank", g->dp_rank}, {"tp_rank", g->tp_rank}};
    using Named = std::pair<const char*, Comm*>;
    for (const auto& [name, c] : std::initializer_list<Named>{
             {"tp", &g->tp}, {"dp", &g->dp}, {"pp", &g->pp}, {"model", &g->model}, {"embedding", &g->embedding}}) {
      auto m = members(*c);
      if (!m.ok()) return fail(m.status());
      j[name] = *m;
    }
    auto all = w.gather(j.dump());
    if (!all.ok()) return fail(all.status());
    if (w.rank() == 0) {
      nlohmann::json line = {{"layout", argv[a]}, {"ranks", nlohmann::json::array()}};
      for (const std::string& s : *all) line["ranks"].push_back(nlohmann::json::parse(s));
      std::printf("%s\n", line.dump().c_str());
    }
  }
  return 0;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_timeout(Comm& w) {
  std::vector<float> b(1000, 1.0f);
  if (w.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  Status st = w.rank() == 0 ? w.recv(b.data(), 1, 1, 99) : w.all_reduce_sum(b.data(), 1000);
  if (st.ok()) return fail(Status::Internal("the operation succeeded although rank 0 skipped it"));
  return fail(st);
}

int run_fail(Comm& w) {
  if (w.size() < 3) return fail(Status::InvalidArgument("fail needs 3 ranks"));
  std::vector<float> b(1000, 1.0f);
  Status st;
  if (w.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting by then
    w.fail_all(std::move(Status::Io("the disk is on fire").with_file("shard.h5")));
    st = Comm::failure();
  } else if (w.rank() == 0) {
    st = w.all_reduce_sum(b.data(), 1000);
  } else {
    st = w.recv(b.data(), 1000, 1, 5);
  }
  // Later operations return the failure at once.
  const auto t0 = std::chrono::steady_clock::now();
  Status later = w.barrier();
  if (later.to_string() != st.to_string() || since(t0) > 0.5)
    std::fprintf(stderr, "LATER DIFFERS rank %d: %s (%.3f s)\n", w.rank(), later.to_string().c_str(), since(t0));
  return fail(st);
}

int run_bench(Comm& w) {
  for (int64_t n = 1000; n <= 4096000; n *= 16) {
    std::vector<float> b(static_cast<size_t>(n), 1.0f);
    const int reps = n > 100000 ? 5 : 50;
    Status st = w.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < reps && st.ok(); ++k) st = w.all_reduce_sum(b.data(), n);
    if (!st.ok()) return fail(st);
    if (w.rank() == 0) std::printf("all_reduce_sum float n=%lld: %.6f s\n", static_cast<long long>(n), since(t0) / reps);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  Comm& w = Comm::world();
  if (mode == "collectives") return run_collectives(w);
  if (mode == "groups") return run_groups(w, argc, argv);
  if (mode == "timeout") return run_timeout(w);
  if (mode == "fail") return run_fail(w);
  if (mode == "bench") return run_bench(w);
  return fail(Status::InvalidArgument("usage: comm_check collectives | groups T,P,D ... | timeout | fail"));
}
