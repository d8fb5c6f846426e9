// Ascend (torch_npu) ops of the compute-ops extension, registered as torch operators in the
// `rtp_llm_npu` namespace when librtp_compute_ops.so is loaded:
//
//   torch.ops.rtp_llm_npu.copy_blocks(src, dst, src_block_ids, dst_block_ids, synchronize=False)
//   torch.ops.rtp_llm_npu.mem_get_info(device=-1) -> (free_bytes, total_bytes)
//   torch.ops.rtp_llm_npu.allocator_stats(device=-1) -> {name: value}
//
// Only functions that libtorch_npu.so / libascendcl.so export are called (no EXEC_NPU_CMD, no
// torch_npu internals), so the extension links with -Wl,--no-undefined; see
// 3rdparty/torch_npu/torch_npu_configure.bzl.
#include <cstdint>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "third_party/acl/inc/acl/acl_rt.h"
#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUEvent.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace rtp_llm::ops::npu {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;  // torch_npu's device type

void check_acl(aclError err, const char* call) {
  if (err != ACL_SUCCESS) {
    const char* msg = aclGetRecentErrMsg();
    TORCH_CHECK(false, call, " failed with ACL error ", err, ": ", msg ? msg : "(no message)");
  }
}

c10::Device npu_device(int64_t index) {
  if (index < 0) {
    return c10::impl::getDeviceGuardImpl(kNpu)->getDevice();
  }
  return c10::Device(kNpu, static_cast<c10::DeviceIndex>(index));
}

std::vector<int64_t> block_ids(const at::Tensor& ids, const char* name, int64_t num_blocks) {
  TORCH_CHECK(ids.dim() == 1 && ids.device().is_cpu(), "copy_blocks: ", name, " must be a 1-D CPU tensor");
  TORCH_CHECK(ids.scalar_type() == at::kInt || ids.scalar_type() == at::kLong, "copy_blocks: ", name,
              " must be int32 or int64, got ", ids.scalar_type());
  const at::Tensor ids64 = ids.to(at::kLong).contiguous();
  const int64_t* p = ids64.const_data_ptr<int64_t>();
  std::vector<int64_t> out(p, p + ids64.numel());
  for (int64_t id : out) {
    TORCH_CHECK(id >= 0 && id < num_blocks, "copy_blocks: ", name, " holds block ", id, ", outside [0, ",
                num_blocks, ")");
  }
  return out;
}

// Copies blocks src[src_block_ids[i]] -> dst[dst_block_ids[i]] (dim 0 indexes blocks) on the
// current NPU stream of the device tensor, so the copies are ordered after the kernels already
// queued there (the step that wrote the KV blocks) and before those queued later. One side is
// an NPU tensor, the other a pinned host tensor (or both on the same NPU). With synchronize,
// the host waits for an event recorded after the copies (not for the whole stream): only then
// may it read a device-to-host destination or overwrite a host-to-device source.
void copy_blocks(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& src_block_ids,
                 const at::Tensor& dst_block_ids, bool synchronize) {
  TORCH_CHECK(src.dim() >= 1 && dst.dim() >= 1, "copy_blocks: src and dst must be [num_blocks, ...]");
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "copy_blocks: src is ", src.scalar_type(), " but dst is ",
              dst.scalar_type());
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous(), "copy_blocks: src and dst must be contiguous");
  TORCH_CHECK(src.sizes().slice(1) == dst.sizes().slice(1), "copy_blocks: block shapes differ: src ", src.sizes(),
              ", dst ", dst.sizes());
  const bool src_npu = src.device().type() == kNpu;
  const bool dst_npu = dst.device().type() == kNpu;
  TORCH_CHECK(src_npu || dst_npu, "copy_blocks: one of src and dst must be an NPU tensor (got ", src.device(),
              " and ", dst.device(), ")");
  const at::Tensor& npu = src_npu ? src : dst;
  aclrtMemcpyKind kind = ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (src_npu && dst_npu) {
    TORCH_CHECK(src.device() == dst.device(), "copy_blocks: src on ", src.device(), " but dst on ", dst.device());
  } else {
    const at::Tensor& host = src_npu ? dst : src;
    TORCH_CHECK(host.device().is_cpu(), "copy_blocks: the host side must be a CPU tensor, got ", host.device());
    // Asynchronous copies from/to pageable memory would be staged synchronously by ACL (or
    // fault); pinned memory comes from torch_npu's host allocator (tensor.pin_memory()).
    TORCH_CHECK(host.is_pinned(npu.device()), "copy_blocks: the host tensor must be pinned (tensor.pin_memory())");
    kind = src_npu ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_HOST_TO_DEVICE;
  }
  const std::vector<int64_t> from = block_ids(src_block_ids, "src_block_ids", src.size(0));
  const std::vector<int64_t> to = block_ids(dst_block_ids, "dst_block_ids", dst.size(0));
  TORCH_CHECK(from.size() == to.size(), "copy_blocks: ", from.size(), " src_block_ids but ", to.size(),
              " dst_block_ids");
  if (from.empty()) {
    return;
  }

  const c10::DeviceGuard guard(npu.device());
  const c10_npu::NPUStream stream = c10_npu::getCurrentNPUStream(npu.device().index());
  // stream() first drains torch_npu's task queue, so ops it has queued but not yet launched
  // reach the stream before these copies.
  const aclrtStream acl_stream = stream.stream();
  const size_t block_bytes = static_cast<size_t>(src.numel() / src.size(0)) * src.element_size();
  const auto* src_base = static_cast<const char*>(src.const_data_ptr());
  auto* dst_base = static_cast<char*>(dst.mutable_data_ptr());
  // Runs of consecutive ids on both sides become one copy (allocators hand out runs).
  for (size_t i = 0; i < from.size();) {
    size_t n = 1;
    while (i + n < from.size() && from[i + n] == from[i] + static_cast<int64_t>(n) &&
           to[i + n] == to[i] + static_cast<int64_t>(n)) {
      ++n;
    }
    const size_t bytes = n * block_bytes;
    check_acl(aclrtMemcpyAsync(dst_base + to[i] * block_bytes, bytes, src_base + from[i] * block_bytes, bytes, kind,
                               acl_stream),
              "aclrtMemcpyAsync");
    i += n;
  }
  if (synchronize) {
    c10_npu::NPUEvent done;
    done.record(stream);
    done.synchronize();
  }
}

// Free and total device memory (bytes) as the ACL runtime reports them: what other processes
// and torch_npu's cache hold counts as used.
std::tuple<int64_t, int64_t> mem_get_info(int64_t device) {
  const c10::DeviceGuard guard(npu_device(device));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  check_acl(aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total_bytes), "aclrtGetMemInfo");
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

// torch_npu caching allocator's statistics of one device (the aggregate over its pools), as
// torch.npu.memory_stats names them: "<stat>.<current|peak|allocated|freed>".
c10::Dict<std::string, int64_t> allocator_stats(int64_t device) {
  c10_npu::NPUCachingAllocator::NPUAllocator* allocator = c10_npu::NPUCachingAllocator::allocator.load();
  TORCH_CHECK(allocator != nullptr, "allocator_stats: torch_npu's caching allocator is not set up (import torch_npu first)");
  const c10::Device dev = npu_device(device);
  const c10_npu::NPUCachingAllocator::DeviceStats stats = allocator->getDeviceStats(dev.index());
  const auto aggregate = static_cast<size_t>(c10_npu::NPUCachingAllocator::StatType::AGGREGATE);
  c10::Dict<std::string, int64_t> out;
  auto add = [&](const std::string& name, const c10_npu::NPUCachingAllocator::Stat& s) {
    out.insert(name + ".current", s.current);
    out.insert(name + ".peak", s.peak);
    out.insert(name + ".allocated", s.allocated);
    out.insert(name + ".freed", s.freed);
  };
  add("allocation", stats.allocation[aggregate]);
  add("segment", stats.segment[aggregate]);
  add("active", stats.active[aggregate]);
  add("allocated_bytes", stats.allocated_bytes[aggregate]);
  add("reserved_bytes", stats.reserved_bytes[aggregate]);
  add("active_bytes", stats.active_bytes[aggregate]);
  add("requested_bytes", stats.requested_bytes[aggregate]);
  out.insert("num_alloc_retries", stats.num_alloc_retries);
  out.insert("num_ooms", stats.num_ooms);
  return out;
}

}  // namespace

TORCH_LIBRARY(rtp_llm_npu, m) {
  m.def("copy_blocks(Tensor src, Tensor(a!) dst, Tensor src_block_ids, Tensor dst_block_ids, bool synchronize=False) -> ()",
        &copy_blocks);
  m.def("mem_get_info(int device=-1) -> (int, int)", &mem_get_info);
  m.def("allocator_stats(int device=-1) -> Dict(str, int)", &allocator_stats);
}

}  // namespace rtp_llm::ops::npu
