#include "parallel/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"

namespace oasis {
namespace {

// Makes `device` current for the scope and restores the previous device after it.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    OASIS_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) OASIS_CUDA_CHECK(cudaSetDevice(device));
  }
  ~ScopedDevice() { cudaSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

std::string NcclMessage(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  std::string m = what + " -> " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') m += std::string(" (") + last + ")";
  return m;
}

Status NcclStatus(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  return r == ncclSuccess ? Status::Ok() : Internal("NCCL: " + NcclMessage(r, what, comm));
}

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI64:
      return ncclInt64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:  // moved as bytes, never reduced
    case DType::kF8E5M2:
      return ncclUint8;
    case DType::kI16:
      break;
  }
  OASIS_CHECK(false) << "no NCCL type for " << DTypeName(d);
  return ncclUint8;
}

void LogVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess) {
      spdlog::info("NCCL {}.{}.{} (built against {}.{}.{}); NCCL_NVLS_ENABLE=0", v / 10000,
                   v / 100 % 100, v % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    }
  });
}

}  // namespace

void NcclCommunicator::DisableNvlsMulticast() {
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  if (before != nullptr && std::strcmp(before, "0") != 0) {
    spdlog::warn(
        "NCCL_NVLS_ENABLE={} overridden to 0: NVLink multicast stays off on shared GPU hosts",
        before);
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
}

StatusOr<ncclUniqueId> NcclCommunicator::NewUniqueId() {
  DisableNvlsMulticast();
  ncclUniqueId id;
  OASIS_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return id;
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int rank, int size, int device,
                                   StreamSource stream)
    : handle_(std::make_shared<Handle>()),
      rank_(rank),
      size_(size),
      device_(device),
      stream_(std::move(stream)) {
  handle_->comm.store(comm);
  handle_->rank = rank;
  handle_->device = device;
}

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(int rank, int size,
                                                                     const ncclUniqueId& id,
                                                                     int device,
                                                                     StreamSource stream) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("NCCL rank " + std::to_string(rank) + " outside a group of " +
                           std::to_string(size));
  }
  if (!stream) return InvalidArgument("NcclCommunicator needs a stream source");
  DisableNvlsMulticast();
  LogVersionOnce();
  OASIS_RETURN_IF_ERROR(
      cuda::ToStatus(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  ncclComm_t comm = nullptr;
  OASIS_RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&comm, size, id, rank),
                                   "ncclCommInitRank(rank " + std::to_string(rank) + " of " +
                                       std::to_string(size) + ", device " + std::to_string(device) +
                                       ")"));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, rank, size, device, std::move(stream)));
}

StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateGroup(
    const std::vector<int>& devices, std::vector<StreamSource> streams) {
  const int n = static_cast<int>(devices.size());
  if (n < 1) return InvalidArgument("an NCCL group needs at least one device");
  if (streams.size() != devices.size()) return InvalidArgument("one stream source per NCCL rank");
  for (const StreamSource& s : streams) {
    if (!s) return InvalidArgument("NcclCommunicator needs a stream source");
  }
  OASIS_ASSIGN_OR_RETURN(ncclUniqueId id, NewUniqueId());
  LogVersionOnce();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  {
    int previous = 0;
    OASIS_RETURN_IF_ERROR(cuda::ToStatus(cudaGetDevice(&previous), "cudaGetDevice"));
    Status st = NcclStatus(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n && st.ok(); ++r) {
      st = cuda::ToStatus(cudaSetDevice(devices[static_cast<size_t>(r)]),
                          "cudaSetDevice(" + std::to_string(devices[static_cast<size_t>(r)]) + ")");
      if (st.ok()) {
        st = NcclStatus(ncclCommInitRank(&comms[static_cast<size_t>(r)], n, id, r),
                        "ncclCommInitRank(rank " + std::to_string(r) + " of " + std::to_string(n) +
                            ", device " + std::to_string(devices[static_cast<size_t>(r)]) + ")");
      }
    }
    // The group must be closed even after a failure inside it.
    const Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd (communicator initialisation of " +
                                                      std::to_string(n) + " ranks)");
    cudaSetDevice(previous);
    if (st.ok()) st = end;
    if (!st.ok()) {
      for (ncclComm_t c : comms) {
        if (c != nullptr) ncclCommAbort(c);
      }
      return st;
    }
  }
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int r = 0; r < n; ++r) {
    out.emplace_back(new NcclCommunicator(comms[static_cast<size_t>(r)], r, n,
                                          devices[static_cast<size_t>(r)],
                                          std::move(streams[static_cast<size_t>(r)])));
  }
  return out;
}

NcclCommunicator::~NcclCommunicator() {
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::timed_mutex> lock(handle_->mu);
    comm = handle_->comm.exchange(nullptr);  // nullptr when aborted
  }
  if (comm == nullptr) return;
  ScopedDevice dev(device_);
  const ncclResult_t r = ncclCommDestroy(comm);
  if (r != ncclSuccess)
    spdlog::warn("NCCL rank {}: {}", rank_, NcclMessage(r, "ncclCommDestroy", nullptr));
}

void NcclCommunicator::Check(ncclResult_t r, const char* what, ncclComm_t comm) const {
  if (r == ncclSuccess) return;
  throw NcclError("NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                  " (device " + std::to_string(device_) + "): " + NcclMessage(r, what, comm));
}

void NcclCommunicator::AllReduceSum(Tensor& t) {
  OASIS_CHECK(t.device() == Device::kCuda)
      << "NcclCommunicator::AllReduceSum needs a device tensor, got " << t.ToString();
  OASIS_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16)
      << "AllReduceSum needs an F32, BF16 or F16 tensor, got " << t.ToString();
  if (t.numel() == 0) return;
  std::lock_guard<std::timed_mutex> lock(handle_->mu);
  const ncclComm_t comm = handle_->comm.load();
  if (comm == nullptr) return;  // aborted: the step is failing anyway
  Check(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), NcclType(t.dtype()),
                      ncclSum, comm, stream()),
        "ncclAllReduce", comm);
}

void NcclCommunicator::AllGather(const Tensor& in, Tensor& out) {
  OASIS_CHECK(in.ndim() >= 1 && out.ndim() == in.ndim() && out.dtype() == in.dtype() &&
              out.dim(0) == in.dim(0) * size_ && out.numel() == in.numel() * size_)
      << "AllGather " << in.ToString() << " into " << out.ToString() << " over " << size_
      << " ranks";
  OASIS_CHECK(in.device() == Device::kCuda && out.device() == Device::kCuda)
      << "NcclCommunicator::AllGather needs device tensors";
  if (in.numel() == 0) return;
  std::lock_guard<std::timed_mutex> lock(handle_->mu);
  const ncclComm_t comm = handle_->comm.load();
  if (comm == nullptr) return;
  Check(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()), NcclType(in.dtype()),
                      comm, stream()),
        "ncclAllGather", comm);
}

void NcclCommunicator::Barrier() {
  if (barrier_buf_.data() == nullptr) {
    ScopedDevice dev(device_);
    auto buf = cuda::DeviceBuffer::Allocate(sizeof(float));
    OASIS_CHECK(buf.ok()) << buf.status().ToString();
    barrier_buf_ = std::move(*buf);
    OASIS_CUDA_CHECK(cudaMemsetAsync(barrier_buf_.data(), 0, sizeof(float), stream()));
  }
  {
    std::lock_guard<std::timed_mutex> lock(handle_->mu);
    const ncclComm_t comm = handle_->comm.load();
    if (comm == nullptr) return;
    Check(ncclAllReduce(barrier_buf_.data(), barrier_buf_.data(), 1, ncclFloat32, ncclSum, comm,
                        stream()),
          "ncclAllReduce (barrier)", comm);
  }
  const cudaError_t e = cudaStreamSynchronize(stream());
  if (e != cudaSuccess) {
    throw NcclError("NCCL rank " + std::to_string(rank_) + ": barrier stream sync -> " +
                    cudaGetErrorString(e));
  }
  std::lock_guard<std::timed_mutex> lock(handle_->mu);
  const ncclComm_t comm = handle_->comm.load();
  if (comm == nullptr) return;
  ncclResult_t async = ncclSuccess;
  Check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
  Check(async, "asynchronous NCCL error", comm);
}

bool NcclCommunicator::aborted() const { return handle_->aborted.load(std::memory_order_acquire); }

void NcclCommunicator::Abort() { AbortHandle(*handle_); }

std::function<void()> NcclCommunicator::AbortFunction() const {
  return [h = handle_] { AbortHandle(*h); };
}

void NcclCommunicator::AbortHandle(Handle& h) {
  h.aborted.store(true, std::memory_order_release);
  // A rank thread holds the lock only for the host-side enqueue of one collective; if it is
  // stuck inside NCCL itself (waiting for a peer), abort without the lock: the abort flag is
  // what makes that call return.
  std::unique_lock<std::timed_mutex> lock(h.mu, std::defer_lock);
  const bool locked = lock.try_lock_for(std::chrono::seconds(2));
  const ncclComm_t comm = h.comm.exchange(nullptr);
  if (locked) lock.unlock();
  if (comm == nullptr) return;
  const int rank = h.rank, device = h.device;
  spdlog::warn("NCCL rank {}: aborting the communicator", rank);
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  const ncclResult_t r = ncclCommAbort(comm);  // may wait for graphs that captured it to go
  cudaSetDevice(previous);
  if (r != ncclSuccess)
    spdlog::warn("NCCL rank {}: {}", rank, NcclMessage(r, "ncclCommAbort", nullptr));
}

}  // namespace oasis
