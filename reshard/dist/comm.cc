#include "reshard/dist/comm.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "reshard/dist/comm_wait.h"

namespace ckpt {

using comm_detail::OpInfo;

struct CommAccess {
  static MPI_Comm handle(const Comm& c) { return reinterpret_cast<MPI_Comm>(c.handle_); }
};

namespace {

intptr_t from_mpi(MPI_Comm c) { return reinterpret_cast<intptr_t>(c); }

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <class T> const char* type_name();
template <> const char* type_name<float>() { return "float"; }
template <> const char* type_name<double>() { return "double"; }
template <> const char* type_name<int64_t>() { return "int64"; }

Status no_comm() { return Status::Internal("operation on an empty communicator"); }

// Before any operation: the communicator exists, no failure stops this process, and the count
// fits MPI's int.
Status precheck(const Comm& c, const char* op, int64_t count) {
  if (c.size() == 0) return no_comm();
  CKPT_RETURN_IF_ERROR(comm_detail::failure());
  if (count < 0 || count > INT_MAX)
    return Status::InvalidArgument(std::string(op) + ": element count " + std::to_string(count) +
                                   " out of range (0.." + std::to_string(INT_MAX) + ")");
  return Status::Ok();
}

// Starts one non-blocking MPI operation (`start` fills the request) and waits for it (bounded).
template <class Start>
Status run(const OpInfo& info, Start&& start) {
  MPI_Request req = MPI_REQUEST_NULL;
  CKPT_RETURN_IF_ERROR(comm_detail::mpi_status(start(&req), info.op));
  return comm_detail::wait(&req, 1, info);
}

template <class T>
Status all_reduce(const Comm& c, T* buf, int64_t n, MPI_Op op, const char* name) {
  CKPT_RETURN_IF_ERROR(precheck(c, name, n));
  if (!c.is_mpi() || n == 0) return Status::Ok();
  return run({name, type_name<T>(), c.size(), n}, [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), mpi_type<T>(), op, CommAccess::handle(c), r);
  });
}

// `s` of `root` on every rank of `c` (its length first, then its bytes).
Result<std::string> bcast_string(const Comm& c, int root, std::string s, const char* name) {
  int len = static_cast<int>(s.size());
  MPI_Comm h = CommAccess::handle(c);
  CKPT_RETURN_IF_ERROR(run({name, "int", c.size(), 1}, [&](MPI_Request* r) { return MPI_Ibcast(&len, 1, MPI_INT, root, h, r); }));
  if (c.rank() != root) s.assign(static_cast<size_t>(len), '\0');
  CKPT_RETURN_IF_ERROR(run({name, "char", c.size(), len}, [&](MPI_Request* r) {
    return MPI_Ibcast(s.data(), len, MPI_CHAR, root, h, r);
  }));
  return s;
}


// Comm::exchange under the name `name` (send, recv, sendrecv, exchange): every send posted, then
// every receive, then one bounded wait for all (receives cancelled on error).
template <class T>
Status p2p(const Comm& c, const std::vector<Comm::Send<T>>& sends, const std::vector<Comm::Recv<T>>& recvs, int tag,
           const char* name) {
  int64_t most = 0;
  for (const auto& x : sends) most = std::max(most, x.n);
  for (const auto& x : recvs) most = std::max(most, x.n);
  CKPT_RETURN_IF_ERROR(precheck(c, name, most));
  if (sends.empty() && recvs.empty()) return Status::Ok();
  if (!c.is_mpi()) {  // a one-rank world: only exchanges with itself, the k-th send into the k-th receive
    bool self = sends.size() == recvs.size();
    for (size_t k = 0; self && k < sends.size(); ++k)
      self = sends[k].peer == 0 && recvs[k].peer == 0 && sends[k].n <= recvs[k].n;
    if (!self) return Status::Internal(std::string(name) + " in a one-rank world without MPI");
    for (size_t k = 0; k < sends.size(); ++k)
      if (sends[k].n) std::memmove(recvs[k].buf, sends[k].buf, sizeof(T) * static_cast<size_t>(sends[k].n));
    return Status::Ok();
  }
  MPI_Comm h = CommAccess::handle(c);
  std::vector<MPI_Request> reqs(sends.size() + recvs.size(), MPI_REQUEST_NULL);
  const OpInfo info{name, type_name<T>(), c.size(), most};
  for (size_t k = 0; k < sends.size(); ++k) {
    Status st = comm_detail::mpi_status(MPI_Isend(sends[k].buf, static_cast<int>(sends[k].n), mpi_type<T>(),
                                                  sends[k].peer, tag, h, &reqs[k]), "Isend");
    if (!st.ok()) {
      (void)comm_detail::wait(reqs.data(), static_cast<int>(k), info);  // the sends under way (bounded)
      return st;
    }
  }
  const int first_recv = static_cast<int>(sends.size());
  for (size_t k = 0; k < recvs.size(); ++k) {
    Status st = comm_detail::mpi_status(MPI_Irecv(recvs[k].buf, static_cast<int>(recvs[k].n), mpi_type<T>(),
                                                  recvs[k].peer, tag, h, &reqs[sends.size() + k]), "Irecv");
    if (!st.ok()) {
      // The sends may be under way: wait for them (bounded); receives posted are left to MPI.
      (void)comm_detail::wait(reqs.data(), first_recv, info);
      return st;
    }
  }
  return comm_detail::wait(reqs.data(), static_cast<int>(reqs.size()), info, first_recv);
}
}  // namespace

bool Comm::launched_under_mpi() {
  const char* ws = std::getenv("OMPI_COMM_WORLD_SIZE");
  return ws && *ws;
}

Comm& Comm::world() {
  static Comm w = [] {
    Comm c;
    c.size_ = 1;
    if (!launched_under_mpi()) return c;
    comm_detail::start_mpi(&c.rank_, &c.size_);
    c.mpi_ = true;
    c.handle_ = from_mpi(MPI_COMM_WORLD);
    return c;
  }();
  return w;
}

Comm::Comm(Comm&& o) noexcept
    : rank_(o.rank_), size_(o.size_), mpi_(o.mpi_), owned_(o.owned_), handle_(o.handle_) {
  o.owned_ = false;
  o.size_ = 0;
  o.handle_ = 0;
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    this->~Comm();
    new (this) Comm(std::move(o));
  }
  return *this;
}

Comm::~Comm() {
  // After a failure, operations may still be pending on the communicator: it is left to MPI.
  if (owned_ && mpi_ && comm_detail::failure().ok()) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
      MPI_Comm c = CommAccess::handle(*this);
      MPI_Comm_free(&c);
    }
  }
  owned_ = false;
}

Result<Comm> Comm::split(int color, int key) const {
  CKPT_RETURN_IF_ERROR(precheck(*this, "split", 0));
  Comm c;
  c.size_ = 1;
  if (!mpi_) return c;
  MPI_Comm h = CommAccess::handle(*this);
  // MPI_Comm_split blocks: a bounded barrier first makes sure every rank is there.
  CKPT_RETURN_IF_ERROR(run({"split", "", size_, 0}, [&](MPI_Request* r) { return MPI_Ibarrier(h, r); }));
  MPI_Comm out;
  CKPT_RETURN_IF_ERROR(comm_detail::mpi_status(MPI_Comm_split(h, color, key, &out), "Comm_split"));
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  c.mpi_ = true;
  c.owned_ = true;
  c.handle_ = from_mpi(out);
  MPI_Comm_rank(out, &c.rank_);
  MPI_Comm_size(out, &c.size_);
  return c;
}

template <class T>
Status Comm::all_reduce_sum(T* buf, int64_t n) {
  return all_reduce(*this, buf, n, MPI_SUM, "all_reduce_sum");
}

template <class T>
Status Comm::all_reduce_max(T* buf, int64_t n) {
  return all_reduce(*this, buf, n, MPI_MAX, "all_reduce_max");
}

template <class T>
Status Comm::reduce_scatter_sum(const T* in, T* out, int64_t n) {
  CKPT_RETURN_IF_ERROR(precheck(*this, "reduce_scatter_sum", n));
  if (!mpi_) {
    if (n) std::memcpy(out, in, sizeof(T) * static_cast<size_t>(n));
    return Status::Ok();
  }
  if (n == 0) return Status::Ok();
  return run({"reduce_scatter_sum", type_name<T>(), size_, n}, [&](MPI_Request* r) {
    return MPI_Ireduce_scatter_block(in, out, static_cast<int>(n), mpi_type<T>(), MPI_SUM, CommAccess::handle(*this), r);
  });
}

template <class T>
Status Comm::all_gather(const T* in, T* out, int64_t n) {
  CKPT_RETURN_IF_ERROR(precheck(*this, "all_gather", n));
  if (!mpi_) {
    if (n && in != out) std::memmove(out, in, sizeof(T) * static_cast<size_t>(n));
    return Status::Ok();
  }
  if (n == 0) return Status::Ok();
  const void* src = in == out + static_cast<int64_t>(rank_) * n ? MPI_IN_PLACE : in;
  return run({"all_gather", type_name<T>(), size_, n}, [&](MPI_Request* r) {
    return MPI_Iallgather(src, static_cast<int>(n), mpi_type<T>(), out, static_cast<int>(n), mpi_type<T>(),
                          CommAccess::handle(*this), r);
  });
}

template <class T>
Status Comm::send(const T* buf, int64_t n, int peer, int tag) {
  return sendrecv<T>(buf, n, peer, nullptr, 0, -1, tag);
}

template <class T>
Status Comm::recv(T* buf, int64_t n, int peer, int tag) {
  return sendrecv<T>(nullptr, 0, -1, buf, n, peer, tag);
}

template <class T>
Status Comm::sendrecv(const T* sbuf, int64_t sn, int dst, T* rbuf, int64_t rn, int src, int tag) {
  std::vector<Send<T>> sends;
  std::vector<Recv<T>> recvs;
  if (dst >= 0) sends.push_back({sbuf, sn, dst});
  if (src >= 0) recvs.push_back({rbuf, rn, src});
  return p2p(*this, sends, recvs, tag, dst < 0 ? "recv" : src < 0 ? "send" : "sendrecv");
}

template <class T>
Status Comm::exchange(const std::vector<Send<T>>& sends, const std::vector<Recv<T>>& recvs, int tag) {
  return p2p(*this, sends, recvs, tag, "exchange");
}

Status Comm::barrier() {
  CKPT_RETURN_IF_ERROR(precheck(*this, "barrier", 0));
  if (!mpi_) return Status::Ok();
  return run({"barrier", "", size_, 0}, [&](MPI_Request* r) { return MPI_Ibarrier(CommAccess::handle(*this), r); });
}

Result<std::vector<std::string>> Comm::gather(const std::string& mine) {
  CKPT_RETURN_IF_ERROR(precheck(*this, "gather", static_cast<int64_t>(mine.size())));
  if (!mpi_) return std::vector<std::string>{mine};
  MPI_Comm c = CommAccess::handle(*this);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), displs;
  CKPT_RETURN_IF_ERROR(run({"gather", "int", size_, 1}, [&](MPI_Request* r) {
    return MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, c, r);
  }));
  std::vector<char> all(1);
  if (rank_ == 0) {
    displs.resize(static_cast<size_t>(size_));
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      displs[static_cast<size_t>(i)] = static_cast<int>(total);
      total += lens[static_cast<size_t>(i)];
      if (total > INT_MAX) return Status::InvalidArgument("gather: more than 2 GiB of strings in total");
    }
    all.resize(static_cast<size_t>(total) + 1);
  }
  CKPT_RETURN_IF_ERROR(run({"gather", "char", size_, len}, [&](MPI_Request* r) {
    return MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, c, r);
  }));
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int i = 0; i < size_; ++i)
      out.emplace_back(all.data() + displs[static_cast<size_t>(i)], static_cast<size_t>(lens[static_cast<size_t>(i)]));
  return out;
}

Result<std::string> Comm::broadcast(const std::string& from_root) {
  CKPT_RETURN_IF_ERROR(precheck(*this, "broadcast", static_cast<int64_t>(from_root.size())));
  if (!mpi_) return from_root;
  return bcast_string(*this, 0, rank_ == 0 ? from_root : std::string(), "broadcast");
}

Status Comm::agree(const Status& mine) {
  CKPT_RETURN_IF_ERROR(precheck(*this, "agree", 1));
  if (!mpi_) return mine;
  int64_t bad = mine.ok() ? size_ : rank_;
  CKPT_RETURN_IF_ERROR(run({"agree", "int64", size_, 1}, [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, &bad, 1, MPI_INT64_T, MPI_MIN, CommAccess::handle(*this), r);
  }));
  if (bad == size_) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(std::string text,
                        bcast_string(*this, static_cast<int>(bad), rank_ == bad ? mine.to_json() : std::string(), "agree"));
  return Status::from_json(text);
}

void Comm::fail_all(const Status& why) { comm_detail::fail_local(why); }

Status Comm::failure() { return comm_detail::failure(); }

void Comm::abandon(const Status& why) { comm_detail::abandon(why); }

double Comm::timeout_s() { return comm_detail::timeout_s(); }
double Comm::seconds_waiting() { return comm_detail::seconds_waiting(); }

CommTimeoutScope::CommTimeoutScope(double seconds) : previous_(comm_detail::timeout_s()) {
  comm_detail::set_timeout_s(seconds);
}

CommTimeoutScope::~CommTimeoutScope() { comm_detail::set_timeout_s(previous_); }

#define CKPT_COMM_INSTANTIATE(T)                                              \
  template Status Comm::all_reduce_sum<T>(T*, int64_t);                       \
  template Status Comm::all_reduce_max<T>(T*, int64_t);                       \
  template Status Comm::reduce_scatter_sum<T>(const T*, T*, int64_t);         \
  template Status Comm::all_gather<T>(const T*, T*, int64_t);                 \
  template Status Comm::send<T>(const T*, int64_t, int, int);                 \
  template Status Comm::recv<T>(T*, int64_t, int, int);                       \
  template Status Comm::sendrecv<T>(const T*, int64_t, int, T*, int64_t, int, int);           \
  template Status Comm::exchange<T>(const std::vector<Comm::Send<T>>&, const std::vector<Comm::Recv<T>>&, int);
CKPT_COMM_INSTANTIATE(float)
CKPT_COMM_INSTANTIATE(double)
CKPT_COMM_INSTANTIATE(int64_t)
#undef CKPT_COMM_INSTANTIATE

}  // namespace ckpt
