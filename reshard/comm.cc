#include "reshard/comm.h"

#include <mpi.h>

#include <cstdlib>
#include <cstring>

namespace ckpt {

namespace {

void comm_finalize_mpi() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

MPI_Comm as_mpi(intptr_t h) { return reinterpret_cast<MPI_Comm>(h); }
intptr_t from_mpi(MPI_Comm c) { return reinterpret_cast<intptr_t>(c); }

Status mpi_status(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::Error("Mpi", std::string("MPI ") + op + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }

Status no_comm() { return Status::Internal("operation on an empty communicator"); }

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
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit(comm_finalize_mpi);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c.rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &c.size_);
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
  if (owned_ && mpi_) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
      MPI_Comm c = as_mpi(handle_);
      MPI_Comm_free(&c);
    }
  }
  owned_ = false;
}

Result<Comm> Comm::split(int color, int key) const {
  if (size_ == 0) return no_comm();
  Comm c;
  c.size_ = 1;
  if (!mpi_) return c;
  MPI_Comm out;
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Comm_split(as_mpi(handle_), color, key, &out), "Comm_split"));
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
  if (size_ == 0) return no_comm();
  if (!mpi_ || n == 0) return Status::Ok();
  return mpi_status(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), mpi_type<T>(), MPI_SUM, as_mpi(handle_)),
                    "Allreduce");
}

template <class T>
Status Comm::all_reduce_max(T* buf, int64_t n) {
  if (size_ == 0) return no_comm();
  if (!mpi_ || n == 0) return Status::Ok();
  return mpi_status(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), mpi_type<T>(), MPI_MAX, as_mpi(handle_)),
                    "Allreduce");
}

template <class T>
Status Comm::reduce_scatter_sum(const T* in, T* out, int64_t n) {
  if (size_ == 0) return no_comm();
  if (!mpi_) {
    if (n) std::memcpy(out, in, sizeof(T) * static_cast<size_t>(n));
    return Status::Ok();
  }
  return mpi_status(MPI_Reduce_scatter_block(in, out, static_cast<int>(n), mpi_type<T>(), MPI_SUM, as_mpi(handle_)),
                    "Reduce_scatter_block");
}

template <class T>
Status Comm::all_gather(const T* in, T* out, int64_t n) {
  if (size_ == 0) return no_comm();
  if (!mpi_) {
    if (n && in != out) std::memmove(out, in, sizeof(T) * static_cast<size_t>(n));
    return Status::Ok();
  }
  const void* src = in == out + static_cast<int64_t>(rank_) * n ? MPI_IN_PLACE : in;
  return mpi_status(MPI_Allgather(src, static_cast<int>(n), mpi_type<T>(), out, static_cast<int>(n), mpi_type<T>(),
                                  as_mpi(handle_)),
                    "Allgather");
}

template <class T>
Status Comm::send(const T* buf, int64_t n, int peer, int tag) {
  if (size_ == 0 || !mpi_) return no_comm();
  return mpi_status(MPI_Send(buf, static_cast<int>(n), mpi_type<T>(), peer, tag, as_mpi(handle_)), "Send");
}

template <class T>
Status Comm::recv(T* buf, int64_t n, int peer, int tag) {
  if (size_ == 0 || !mpi_) return no_comm();
  return mpi_status(MPI_Recv(buf, static_cast<int>(n), mpi_type<T>(), peer, tag, as_mpi(handle_), MPI_STATUS_IGNORE),
                    "Recv");
}

template <class T>
Status Comm::sendrecv(const T* sbuf, int64_t sn, int dst, T* rbuf, int64_t rn, int src, int tag) {
  if (size_ == 0 || !mpi_) return no_comm();
  return mpi_status(MPI_Sendrecv(sbuf, dst < 0 ? 0 : static_cast<int>(sn), mpi_type<T>(), dst < 0 ? MPI_PROC_NULL : dst, tag,
                                 rbuf, src < 0 ? 0 : static_cast<int>(rn), mpi_type<T>(), src < 0 ? MPI_PROC_NULL : src, tag,
                                 as_mpi(handle_), MPI_STATUS_IGNORE),
                    "Sendrecv");
}

Status Comm::barrier() {
  if (size_ == 0) return no_comm();
  if (!mpi_) return Status::Ok();
  return mpi_status(MPI_Barrier(as_mpi(handle_)), "Barrier");
}

Result<std::vector<std::string>> Comm::gather(const std::string& mine) {
  if (size_ == 0) return no_comm();
  if (!mpi_) return std::vector<std::string>{mine};
  MPI_Comm c = as_mpi(handle_);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), displs;
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, c), "Gather"));
  std::vector<char> all(1);
  if (rank_ == 0) {
    displs.resize(static_cast<size_t>(size_));
    int total = 0;
    for (int i = 0; i < size_; ++i) {
      displs[static_cast<size_t>(i)] = total;
      total += lens[static_cast<size_t>(i)];
    }
    all.resize(static_cast<size_t>(total) + 1);
  }
  CKPT_RETURN_IF_ERROR(mpi_status(
      MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, c), "Gatherv"));
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int i = 0; i < size_; ++i)
      out.emplace_back(all.data() + displs[static_cast<size_t>(i)], static_cast<size_t>(lens[static_cast<size_t>(i)]));
  return out;
}

Result<std::string> Comm::broadcast(const std::string& from_root) {
  if (size_ == 0) return no_comm();
  if (!mpi_) return from_root;
  MPI_Comm c = as_mpi(handle_);
  int len = static_cast<int>(from_root.size());
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(&len, 1, MPI_INT, 0, c), "Bcast"));
  std::string s = rank_ == 0 ? from_root : std::string(static_cast<size_t>(len), '\0');
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(s.data(), len, MPI_CHAR, 0, c), "Bcast"));
  return s;
}

Status Comm::agree(const Status& mine) {
  if (size_ == 0) return no_comm();
  if (!mpi_) return mine;
  int64_t bad = mine.ok() ? size_ : rank_;
  CKPT_RETURN_IF_ERROR(mpi_status(
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT64_T, MPI_MIN, as_mpi(handle_)), "Allreduce"));
  if (bad == size_) return Status::Ok();
  std::string text = rank_ == bad ? mine.to_json() : std::string();
  int len = static_cast<int>(text.size());
  MPI_Comm c = as_mpi(handle_);
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(&len, 1, MPI_INT, static_cast<int>(bad), c), "Bcast"));
  text.resize(static_cast<size_t>(len));
  CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(text.data(), len, MPI_CHAR, static_cast<int>(bad), c), "Bcast"));
  return Status::from_json(text);
}

void Comm::fail_all(const Status& why) {
  (void)why;  // basic version: the caller exits; mpirun ends the job
}

#define CKPT_COMM_INSTANTIATE(T)                                              \
  template Status Comm::all_reduce_sum<T>(T*, int64_t);                       \
  template Status Comm::all_reduce_max<T>(T*, int64_t);                       \
  template Status Comm::reduce_scatter_sum<T>(const T*, T*, int64_t);         \
  template Status Comm::all_gather<T>(const T*, T*, int64_t);                 \
  template Status Comm::send<T>(const T*, int64_t, int, int);                 \
  template Status Comm::recv<T>(T*, int64_t, int, int);                       \
  template Status Comm::sendrecv<T>(const T*, int64_t, int, T*, int64_t, int, int);
CKPT_COMM_INSTANTIATE(float)
CKPT_COMM_INSTANTIATE(double)
CKPT_COMM_INSTANTIATE(int64_t)
#undef CKPT_COMM_INSTANTIATE

Result<LayoutGroups> LayoutGroups::make(Comm& world, const Layout& layout) {
  if (world.size() != layout.world_size())
    return Status::Error("WorldSizeMismatch", "the layout " + layout.to_string() + " needs " +
                                                  std::to_string(layout.world_size()) + " ranks (tp*pp*dp), but " +
                                                  std::to_string(world.size()) + " were started (mpirun -np)");
  LayoutGroups g;
  const int r = world.rank(), tp = layout.tp, dp = layout.dp, pp = layout.pp;
  g.tp_rank = r % tp;
  g.dp_rank = (r / tp) % dp;
  g.pp_rank = r / (tp * dp);
  CKPT_ASSIGN_OR_RETURN(g.tp, world.split(g.pp_rank * dp + g.dp_rank, g.tp_rank));
  CKPT_ASSIGN_OR_RETURN(g.dp, world.split(g.pp_rank * tp + g.tp_rank, g.dp_rank));
  CKPT_ASSIGN_OR_RETURN(g.pp, world.split(g.dp_rank * tp + g.tp_rank, g.pp_rank));
  CKPT_ASSIGN_OR_RETURN(g.model, world.split(g.dp_rank, r));
  const bool end_stage = pp > 1 && (g.pp_rank == 0 || g.pp_rank == pp - 1);
  const int emb_color = end_stage ? g.dp_rank * tp + g.tp_rank : dp * tp + r;
  CKPT_ASSIGN_OR_RETURN(g.embedding, world.split(emb_color, g.pp_rank));
  return g;
}

}  // namespace ckpt
