// simdev_torch: PyTorch's PrivateUse1 device ("privateuseone", PyTorch 1.13
// has no renaming) backed by the simulated accelerator (tests/simdev).
//
// Owns: the device's c10::Allocator (simdevMalloc; simdevFree in the
// DataPtr's deleter, so a tensor's device memory lives exactly as long as its
// storage: a tensor kept only by a reference cycle holds it until Python's
// collector runs), a device guard for one device, and the kernels the
// dispatcher cannot do without: the factories, the copies between host and
// device, resizing, and the views. Every other operator goes through the
// boxed CPU fallback (at::native::cpu_fallback): inputs copied to the host
// through _copy_from, the CPU kernel, results copied back.
//
// Never: dereferences a device pointer. simdev memory faults on a host load
// or store (tests/simdev/simdev.h); every byte moves with simdevMemcpy or
// simdevMemset. No lock of its own: simdev's calls are thread-safe and the
// allocator keeps no state.
//
// Why each kernel is here (PyTorch 1.13 fails silently where one is missing;
// tests/integration/test_torch_backend.py shows each failure):
//   empty.memory_format, empty_strided: without them the catch-all runs the
//     CPU factory, and `.to(device)` returns a CPU tensor;
//   as_strided, view, _reshape_alias: without them a view is a copy, and
//     writes through it are lost;
//   _copy_from: without it the fallback hands device storage to CPU kernels,
//     which read device memory (SIGSEGV);
//   _copy_from_and_resize, resize_: the fallback writes out= results and
//     in-place results back through them.
//
// SIMDEV_TORCH_OMIT (read once, when the library is loaded) names kernels to
// leave unregistered, comma-separated: empty_strided, views, copy_from. It
// exists to demonstrate the failures above; unset, everything is registered.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "simdev.h"

namespace {

constexpr c10::DeviceType kDev = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kDev, 0);

// ---- memory -----------------------------------------------------------

void simdev_delete(void *p)
{
    // A deleter cannot throw; simdevFree only fails on a pointer it never
    // handed out, which a storage never holds.
    (void)simdevFree(p);
}

struct SimdevAllocator final : c10::Allocator {
    c10::DataPtr allocate(size_t n) const override
    {
        void *p = nullptr;
        if (n) {
            simdevError_t e = simdevMalloc(&p, n);
            if (e == simdevErrorMemoryAllocation)
                TORCH_CHECK_WITH(OutOfMemoryError, false, "simdev: out of memory allocating ",
                                 n, " bytes (simdevMalloc: ", simdevGetErrorString(e), ")");
            TORCH_CHECK(e == simdevSuccess, "simdevMalloc(", n, "): ", simdevGetErrorString(e));
        }
        return {p, p, &simdev_delete, kDevice};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &simdev_delete; }
};

SimdevAllocator g_alloc;

void memcpy_checked(void *dst, const void *src, size_t n, int kind)
{
    if (!n)
        return;
    simdevError_t e = simdevMemcpy(dst, src, n, kind);
    TORCH_CHECK(e == simdevSuccess, "simdevMemcpy(", n, " bytes, kind ", kind, "): ",
                simdevGetErrorString(e));
}

// The bytes a strided tensor spans, from its first element (strides are
// never negative in PyTorch).
size_t span_elems(const at::Tensor &t)
{
    if (t.numel() == 0)
        return 0;
    size_t last = 0;
    for (int64_t d = 0; d < t.dim(); d++)
        last += (size_t)(t.size(d) - 1) * (size_t)t.stride(d);
    return last + 1;
}

// A host copy of a device tensor: its span read with simdevMemcpy, viewed
// with the same sizes and strides.
at::Tensor to_host(const at::Tensor &dev)
{
    size_t n = span_elems(dev);
    at::Tensor flat = at::empty({(int64_t)n}, dev.options().device(at::kCPU));
    memcpy_checked(flat.data_ptr(), dev.data_ptr(), n * dev.element_size(),
                   simdevMemcpyDeviceToHost);
    return flat.as_strided(dev.sizes(), dev.strides(), 0);
}

// Writes `src` (host or device, any dtype) into the device tensor `dst`.
void write_device(const at::Tensor &dst, const at::Tensor &src)
{
    size_t n = span_elems(dst);
    size_t bytes = n * dst.element_size();
    if (src.device().type() == kDev && src.scalar_type() == dst.scalar_type() &&
        src.sizes() == dst.sizes() && src.strides() == dst.strides() &&
        dst.is_non_overlapping_and_dense()) {
        memcpy_checked(dst.data_ptr(), src.data_ptr(), bytes, simdevMemcpyDeviceToDevice);
        return;
    }
    at::Tensor host_src = src.device().type() == kDev ? to_host(src) : src;
    // A dense destination is written whole; one with holes in its span is
    // read first so the holes keep their bytes.
    at::Tensor staging = dst.is_non_overlapping_and_dense()
        ? at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(at::kCPU))
        : to_host(dst);
    staging.copy_(host_src);
    memcpy_checked(dst.data_ptr(), staging.data_ptr(), bytes, simdevMemcpyHostToDevice);
}

// Grows a device tensor's storage (contents kept) and sets contiguous sizes.
void resize_device(const at::Tensor &t, c10::IntArrayRef size)
{
    c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    impl->set_sizes_contiguous(size);
    size_t need = (size_t)(impl->storage_offset() + impl->numel()) * t.element_size();
    c10::StorageImpl *st = impl->unsafe_storage().unsafeGetStorageImpl();
    if (impl->numel() == 0 || need <= st->nbytes())
        return;
    c10::DataPtr fresh = g_alloc.allocate(need);
    memcpy_checked(fresh.get(), st->data(), st->nbytes(), simdevMemcpyDeviceToDevice);
    st->set_data_ptr_noswap(std::move(fresh));
    st->set_nbytes(need);
}

// ---- kernels ------------------------------------------------------------

at::Tensor empty_memory_format(c10::SymIntArrayRef size, c10::optional<at::ScalarType> dtype,
                               c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                               c10::optional<bool> pin_memory,
                               c10::optional<at::MemoryFormat> memory_format)
{
    (void)layout, (void)device, (void)pin_memory;
    return at::detail::empty_generic(c10::asIntArrayRefSlow(size), &g_alloc,
                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         c10::optional<at::ScalarType> dtype, c10::optional<at::Layout> layout,
                         c10::optional<at::Device> device, c10::optional<bool> pin_memory)
{
    (void)layout, (void)device, (void)pin_memory;
    return at::detail::empty_strided_generic(c10::asIntArrayRefSlow(size),
                                             c10::asIntArrayRefSlow(stride), &g_alloc,
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             c10::dtype_or_default(dtype));
}

// self -> dst; at least one of them is on this device.
at::Tensor copy_from(const at::Tensor &self, const at::Tensor &dst, bool non_blocking)
{
    (void)non_blocking; // simdev's copies are synchronous
    TORCH_CHECK(self.sizes() == dst.sizes() || self.numel() == dst.numel() ||
                    dst.numel() == 0,
                "simdev _copy_from: sizes ", self.sizes(), " and ", dst.sizes(), " differ");
    if (dst.numel() == 0)
        return dst;
    at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand_as(dst);
    if (dst.device().type() == kDev) {
        write_device(dst, src);
    } else {
        at::Tensor host = to_host(src);
        dst.copy_(host);
    }
    return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor &self, const at::Tensor &dst)
{
    if (dst.sizes() != self.sizes()) {
        TORCH_CHECK(dst.device().type() == kDev,
                    "simdev _copy_from_and_resize: resizing a ", dst.device(), " tensor");
        resize_device(dst, self.sizes());
    }
    return copy_from(self, dst, false);
}

const at::Tensor &resize_(const at::Tensor &self, c10::SymIntArrayRef size,
                          c10::optional<at::MemoryFormat> memory_format)
{
    TORCH_CHECK(!memory_format || *memory_format == at::MemoryFormat::Contiguous ||
                    *memory_format == at::MemoryFormat::Preserve,
                "simdev resize_: only contiguous tensors");
    resize_device(self, c10::asIntArrayRefSlow(size));
    return self;
}

at::Tensor as_strided(const at::Tensor &self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      c10::optional<c10::SymInt> storage_offset)
{
    c10::optional<int64_t> off;
    if (storage_offset)
        off = storage_offset->expect_int();
    return at::native::as_strided_tensorimpl(self, c10::asIntArrayRefSlow(size),
                                             c10::asIntArrayRefSlow(stride), off);
}

at::Tensor view(const at::Tensor &self, c10::SymIntArrayRef size)
{
    return at::native::view(self, c10::asIntArrayRefSlow(size));
}

at::Tensor reshape_alias(const at::Tensor &self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride)
{
    return at::native::_reshape_alias(self, c10::asIntArrayRefSlow(size),
                                      c10::asIntArrayRefSlow(stride));
}

bool omitted(const char *kernel)
{
    const char *list = std::getenv("SIMDEV_TORCH_OMIT");
    if (!list)
        return false;
    std::string s = std::string(",") + list + ",";
    return s.find(std::string(",") + kernel + ",") != std::string::npos;
}

// ---- the device guard: one device, index 0, nothing to switch ---------------

struct SimdevGuard final : c10::impl::DeviceGuardImplInterface {
    c10::DeviceType type() const override { return kDev; }
    c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
    c10::Device getDevice() const override { return kDevice; }
    void setDevice(c10::Device d) const override
    {
        TORCH_CHECK(d.index() <= 0, "simdev has one device: ", d);
    }
    void uncheckedSetDevice(c10::Device) const noexcept override {}
    c10::Stream getStream(c10::Device) const noexcept override
    {
        return c10::Stream(c10::Stream::DEFAULT, kDevice);
    }
    c10::Stream exchangeStream(c10::Stream) const noexcept override
    {
        return c10::Stream(c10::Stream::DEFAULT, kDevice);
    }
    // One device: autograd runs this device's backward on a worker thread
    // of its own (PyTorch's engine starts one per device).
    c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

} // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimdevGuard);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    if (!omitted("empty_strided")) {
        m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
        m.impl("empty_strided", TORCH_FN(empty_strided));
    }
    if (!omitted("copy_from"))
        m.impl("_copy_from", TORCH_FN(copy_from));
    m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
    m.impl("resize_", TORCH_FN(resize_));
    if (!omitted("views")) {
        m.impl("as_strided", TORCH_FN(as_strided));
        m.impl("view", TORCH_FN(view));
        m.impl("_reshape_alias", TORCH_FN(reshape_alias));
    }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m)
{
    m.fallback(torch::CppFunction::makeFromBoxedFunction<&at::native::cpu_fallback>());
}
