// The native operator set: what cannot go through the generic path because
// it creates, reshapes or moves storage (factories, views, resize, set_,
// copies across devices, reading a scalar). Registered with
// TORCH_LIBRARY_IMPL(aten, PrivateUse1, ...).
#include "OpenRegNativeOps.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "../runtime/OpenRegCachingAllocator.h"
#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegFunctions.h"
#include "../runtime/OpenRegHooks.h"
#include "../runtime/OpenRegHostAllocator.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegKernelTensor.h"
#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {
std::atomic<SharedMemoryKeeper> shared_memory_keeper{nullptr};
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const size_t old_bytes = storage->nbytes();
  c10::Device device = storage->device();
  c10::DeviceGuard guard(device);
  c10::DataPtr data = new_bytes > 0 ? storage->allocator()->allocate(new_bytes) : c10::DataPtr(nullptr, device);
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0 && storage->data() != nullptr)
    OPENREG_CHECK(orMemcpyAsync(data.get(), storage->data(), keep, orMemcpyDeviceToDevice,
                                current_stream_handle(device.index())));
  if (storage->data() != nullptr) {
    auto keeper = shared_memory_keeper.load(std::memory_order_acquire);
    if (keeper != nullptr) keeper(storage);  // keeps the memory other processes map
  }
  // No materialization of a copy-on-write storage (set_data_ptr would copy what is let go of).
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(new_bytes);
}

void set_shared_memory_keeper(SharedMemoryKeeper keeper) { shared_memory_keeper.store(keeper); }

namespace {

// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory
// (its default): new memory is filled with NaN (integers: their largest value), as the CPU's and
// CUDA's empty and resize_ do. Without it openreg's empty returned whatever the caching allocator's
// block held, so a program that is deterministic on the CPU and CUDA was not on openreg.
bool fill_uninitialized() {
  return C10_UNLIKELY(at::globalContext().deterministicAlgorithms() &&
                      at::globalContext().deterministicFillUninitializedMemory());
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (fill_uninitialized() && t.numel() > 0) at::native::fill_empty_deterministic_(t);
  return t;
}

void ensure_storage(const at::Tensor& self) {
  const size_t needed =
      at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");  // CUDA's refusal
  c10::OptionalDeviceGuard guard(device.has_value() && device->has_index() ? device : std::nullopt);
  return filled_if_deterministic(at::detail::empty_generic(size, allocator::get(),
                                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                           c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  c10::OptionalDeviceGuard guard(device.has_value() && device->has_index() ? device : std::nullopt);
  return filled_if_deterministic(at::detail::empty_strided_generic(size, stride, allocator::get(),
                                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                                   c10::dtype_or_default(dtype)));
}

// Forward-mode AD stands an operand without a tangent in for a ZeroTensor (no storage, the ZeroTensor
// key: `0 * inf` is 0 and nothing is allocated). On the generic path it became an ordinary tensor of
// zeros, so a tangent met an inf of the primal as NaN (a masked softmax's jvp), and each one took
// device memory. As CPU and CUDA make it, with openreg's device.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "_efficientzerotensor: only strided tensors, got ",
              *layout);
  c10::OptionalDeviceGuard guard(device.has_value() && device->has_index() ? device : std::nullopt);  // checks it
  // One allocator per device, never destroyed: the storage keeps a pointer to it (a resize_ of the
  // tensor asks it again; ATen's own, on the stack, leaves that pointer dangling).
  static std::mutex mu;
  static auto* allocators = new std::map<c10::DeviceIndex, std::unique_ptr<at::native::ZeroTensorAllocator>>();
  at::native::ZeroTensorAllocator* zeros = nullptr;
  {
    const c10::DeviceIndex index = current_device();
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = (*allocators)[index];
    if (!slot)
      slot = std::make_unique<at::native::ZeroTensorAllocator>(c10::Device(c10::DeviceType::PrivateUse1, index));
    zeros = slot.get();
  }
  const auto keys =
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, zeros, keys, c10::dtype_or_default(dtype), std::nullopt);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  at::detail::check_size_nonnegative(C10_AS_INTARRAYREF_SLOW(size));
  auto* impl = self.unsafeGetTensorImpl();
  // To its own sizes: strides stay as they are (a transposed tensor stays transposed), as on the CPU.
  if (self.sizes() != C10_AS_INTARRAYREF_SLOW(size)) impl->set_sizes_contiguous(C10_AS_INTARRAYREF_SLOW(size));
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  const int64_t old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  ensure_storage(self);
  // The bytes a growing resize_ adds, as on the CPU and CUDA (see fill_uninitialized).
  if (fill_uninitialized()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  c10::DeviceGuard guard(self.device());
  const c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  // No strides (set_(storage, offset, size)) means contiguous, as on the CPU.
  const c10::IntArrayRef strides = stride.empty() ? c10::IntArrayRef() : C10_AS_INTARRAYREF_SLOW(stride);
  // The CPU's checks (same device, offset >= 0, sizes and strides of one length), then its storage swap.
  at::detail::check_size_nonnegative(sizes);
  // The CPU computes the storage it needs from the caller's strides, which refuses a negative one
  // ("Storage size calculation overflowed with sizes=[3] and strides=[-1]"); TensorImpl replaces
  // negative strides with contiguous ones, so the tensor read other elements, even past its storage.
  // Before checkSetStorage, which swaps the storage in (a caught refusal left the tensor's old sizes
  // on the new, smaller storage); its own refusals, which the CPU makes first, come first.
  if (!strides.empty() && strides.size() == sizes.size() && offset.expect_int() >= 0)
    (void)at::detail::computeStorageNbytes(sizes, strides, self.dtype().itemsize(), offset.expect_int());
  at::native::checkSetStorage(self, std::move(source), offset.expect_int(), sizes, strides);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset.expect_int());
  if (strides.empty())
    impl->set_sizes_contiguous(sizes);
  else
    impl->set_sizes_and_strides(sizes, strides);
  ensure_storage(self);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {c10::SymInt(n)}, {c10::SymInt(1)});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(), source.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());  // the new storage belongs to self's device, not the current one
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator::get(), /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {c10::SymInt(0)}, {c10::SymInt(1)});
}

bool is_contiguous_same(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() && !a.is_conj() && !b.is_conj() &&
         !a.is_neg() && !b.is_neg();
}

// Copy between two openreg tensors, possibly on two devices.
void copy_device_to_device(const at::Tensor& dst, const at::Tensor& src) {
  c10::DeviceGuard guard(dst.device());
  auto dst_stream = getCurrentOpenRegStream(dst.device().index());
  if (src.device() != dst.device()) {
    // Order the copy after src's producer, and src's later users after the copy.
    auto src_stream = getCurrentOpenRegStream(src.device().index());
    c10::Event ready(c10::DeviceType::PrivateUse1);
    ready.record(src_stream.unwrap());
    ready.block(dst_stream.unwrap());
    allocator::recordStream(src.storage().data_ptr(), dst_stream);
  }
  if (is_contiguous_same(dst, src)) {
    OPENREG_CHECK(
        orMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), src.nbytes(), orMemcpyDeviceToDevice, dst_stream.handle()));
  } else {
    OPENREG_CHECK(::openreg::launch(
        dst_stream.handle(), "openreg::strided_copy",
        [dst = KernelTensorArg(dst), src = KernelTensorArg(src)] { dst.materialize().copy_(src.materialize()); }));
  }
  if (src.device() != dst.device()) {
    c10::Event done(c10::DeviceType::PrivateUse1);
    done.record(dst_stream.unwrap());
    done.block(getCurrentOpenRegStream(src.device().index()).unwrap());
  }
}

// A view's conjugate and negative bits (1: conj, 2: neg), and a view of `t` with such bits.
int bits_of(const at::Tensor& t) { return (t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0); }
at::Tensor with_bits(at::Tensor t, int bits) {
  if (bits & 1) t = t.conj();
  return (bits & 2) ? at::_neg_view(t) : t;
}

// Byte for byte, whatever the bits say: `nbytes` from src's first element to dst's (the same dtype
// and layout). A pinned source or destination with non_blocking is not waited for; pageable memory
// always is, by the runtime (its buffer may be reused when the call returns).
void memcpy_to_device(const at::Tensor& dst, const at::Tensor& src, size_t nbytes, bool non_blocking,
                      const OpenRegStream& stream) {
  OPENREG_CHECK(orMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), nbytes, orMemcpyHostToDevice, stream.handle()));
  if (host_allocator::is_pinned(src.const_data_ptr())) {
    if (non_blocking)
      host_allocator::record_stream(src.const_data_ptr(), src.storage().data_ptr().get_context(), stream);
    else
      stream.synchronize();
  }
}

void memcpy_to_host(const at::Tensor& dst, const at::Tensor& src, size_t nbytes, bool non_blocking,
                    const OpenRegStream& stream) {
  OPENREG_CHECK(orMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), nbytes, orMemcpyDeviceToHost, stream.handle()));
  if (!non_blocking)
    stream.synchronize();
  else if (host_allocator::is_pinned(dst.const_data_ptr()))  // the copy may still write it
    host_allocator::record_stream(dst.const_data_ptr(), dst.storage().data_ptr().get_context(), stream);
}

// Host and device copies that convert (dtype, conjugate or negative bits) or lay out make on the
// device exactly the copy the CPU's copy_ makes, with both sides' dtypes, bits and (dense) strides:
// the CPU picks its kernel by them, and it cannot negate every dtype (a negative view into a negative
// uint16 view negates nothing; a plain uint16 staging tensor between them needed a neg the CPU does
// not have), nor does its float16<->float32 contiguous fast path apply a negative bit. Host staging
// without the bits refused pairs the CPU copies and, host to device, negated a view in the source's
// dtype (int8 -128 into int16 gave -128 where copy_ gives 128) (hunt36d, review36).
// Host to device: the source's bytes go over as they are (gathered on the host first if it is not
// dense), into device memory of its dtype, bits and strides. From pinned memory with non_blocking
// nothing waits, and the copy can be captured into a graph: it converted on the host into pageable
// memory, which waited, and a capture refused it saying to use pinned memory (hunt36d).
void copy_host_to_device(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(dst.device());
  auto stream = getCurrentOpenRegStream(dst.device().index());
  if (is_contiguous_same(dst, src)) return memcpy_to_device(dst, src, src.nbytes(), non_blocking, stream);
  const int bits = bits_of(src);
  at::Tensor host = src;
  if (!src.is_non_overlapping_and_dense()) {  // expanded, or with gaps: its elements, bits kept
    host = with_bits(at::empty(src.sizes(), src.options()), bits);
    host.copy_(src);  // the same dtype and bits: nothing is applied
  }
  at::Tensor bytes = at::empty_strided(host.sizes(), host.strides(), host.options().device(dst.device()));
  memcpy_to_device(bytes, host, host.nbytes(), non_blocking, stream);
  copy_device_to_device(dst, with_bits(bytes, bits));
}

// Device to host: the device copies into memory of dst's dtype, bits and (if dense) strides, whose
// bytes then come over as they are; into plain pinned memory with non_blocking without waiting.
void copy_device_to_host(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(src.device());
  auto stream = getCurrentOpenRegStream(src.device().index());
  if (is_contiguous_same(dst, src)) return memcpy_to_host(dst, src, src.nbytes(), non_blocking, stream);
  const int bits = bits_of(dst);
  const bool dense = dst.is_non_overlapping_and_dense();
  const auto options = src.options().dtype(dst.dtype());
  at::Tensor staged =
      with_bits(dense ? at::empty_strided(dst.sizes(), dst.strides(), options) : at::empty(dst.sizes(), options), bits);
  copy_device_to_device(staged, src);
  if (dense) return memcpy_to_host(dst, staged, dst.nbytes(), non_blocking, stream);
  at::Tensor host = with_bits(at::empty(dst.sizes(), dst.options()), bits);
  memcpy_to_host(host, staged, host.nbytes(), false, stream);
  dst.copy_(host);  // the same dtype and bits: nothing is applied
}

// A copy the CPU's copy_ has no kernel for is refused at the call with the CPU's
// NotImplementedError, as CUDA refuses it: a conversion to or from bits8, uint1..7, int1..7 or
// float4_e2m1fn_x2, and for those dtypes any copy that is not a plain memcpy (a transposed or
// broadcast one). It used to return an unwritten tensor and fail the device's copy kernel, the error
// surfacing at some later synchronising call. The CPU's own copy_ of a transposed 2 x 2 tensor takes
// the kernel the device's copy takes; asked once per pair of dtypes that copies, and at each call of
// a refused pair, so that it throws the CPU's error.
// The probe carries both sides' conjugate and negative bits: a negative view copied into a dtype
// the CPU cannot negate (uint16, bool, float8: the CPU's copy negates in dst's dtype) is refused by
// the CPU at the call; probed without them it was accepted, and the device's copy failed later
// (hunt36d).
void check_copy(const at::Tensor& dst, const at::Tensor& src) {
  const c10::ScalarType from = src.scalar_type(), to = dst.scalar_type();
  if (is_contiguous_same(dst, src)) return;                  // a memcpy
  if (c10::isQIntType(from) || c10::isQIntType(to)) return;  // quantized: OpenRegQuantized.cpp
  constexpr int n = static_cast<int>(c10::ScalarType::NumOptions);
  static std::atomic<bool> copies[n][n][4][4] = {};
  const int src_bits = bits_of(src), dst_bits = bits_of(dst);
  check_cpu_accepts(copies[static_cast<int>(from)][static_cast<int>(to)][src_bits][dst_bits], [&] {
    with_bits(at::empty({2, 2}, at::TensorOptions().dtype(to)), dst_bits)
        .copy_(with_bits(at::zeros({2, 2}, at::TensorOptions().dtype(from)).t(), src_bits));
  });
}

bool is_same_data(const at::Tensor& a, const at::Tensor& b) {
  return a.is_alias_of(b) && a.storage_offset() == b.storage_offset() && a.sizes().equals(b.sizes()) &&
         a.strides().equals(b.strides()) && a.scalar_type() == b.scalar_type() && a.is_conj() == b.is_conj() &&
         a.is_neg() == b.is_neg();
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // The CPU's broadcast check (TensorIterator's, with its messages), before anything else: an
  // empty dst returned first, so copying a tensor of another shape into it passed silently.
  if (self.sizes() != dst.sizes()) {
    const auto shape = at::infer_size_dimvector(dst.sizes(), self.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (dst.numel() == 0) return dst;
  // Two views of the same data: nothing to do, before any overlap check, as ATen's copy_ (an
  // expanded view copied into an equal one was refused for its internal overlap; hunt36d).
  if (is_same_data(dst, self)) return dst;
  // copy_ reaches _copy_from before the overlap checks the CPU's copy runs: run them here, at
  // the call (they compare addresses only, so they work on device tensors from the host). The
  // source is checked as given, not broadcast: an expanded tensor's overlap cannot be told, and a
  // broadcast source partly overlapping dst passed and read what the copy had overwritten (hunt36d).
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
  at::Tensor src = self;
  if (src.sizes() != dst.sizes()) src = src.expand_as(dst);
  // The CPU's copy warns here, on the host; a device kernel cannot (its warnings are dropped). A
  // bool keeps "nonzero", imaginary part included: no warning, as the CPU's.
  if (src.is_complex() && !dst.is_complex() && dst.scalar_type() != at::kBool)
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  if (src.is_privateuseone() || dst.is_privateuseone()) check_copy(dst, src);
  if (src.is_privateuseone()) ready_for_launch(src);
  if (dst.is_privateuseone()) ready_for_launch(dst);
  if (src.is_privateuseone() && dst.is_privateuseone())
    copy_device_to_device(dst, src);
  else if (dst.is_privateuseone())
    copy_host_to_device(dst, src, non_blocking);
  else if (src.is_privateuseone())
    copy_device_to_host(dst, src, non_blocking);
  else
    dst.copy_(src, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

// Whether `self` may take `from`'s data in place (param.data = t, and Module.to(), which keeps
// the parameter objects when it may). PyTorch's answer knows only its own dense backends, so an
// openreg tensor and a CPU one were "incompatible": Module.to("openreg") then made new Parameters,
// and an optimizer built before it went on updating the old CPU ones. Dense strided tensors of
// openreg and of the CPU are compatible, as CUDA's are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() && (t.is_cpu() || t.is_privateuseone());
  };
  return dense(self) && dense(from);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  copy_device_to_host(host, self.reshape({}), false);
  return at::_local_scalar_dense(host);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  allocator::recordStream(self.storage().data_ptr(), OpenRegStream(stream));
}

}  // namespace

at::Tensor empty_strided_on(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                            c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  return empty_strided(size, stride, dtype, std::nullopt, std::nullopt, std::nullopt);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("record_stream", record_stream);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// Quantized openreg tensors (OpenRegQuantized.cpp) take a storage (torch.load) and record streams the same way.
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("record_stream", record_stream);
}

}  // namespace c10::openreg
