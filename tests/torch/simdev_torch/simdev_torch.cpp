// simdev_torch: PyTorch's PrivateUse1 device backed by the simulated
// accelerator (tests/simdev). One source for Debian's PyTorch 1.13 (the
// device is "privateuseone": no renaming before 2.0) and PyPI's 2.x (the
// package renames it "simdev"; this file registers the PrivateUse1 hooks that
// torch.accelerator and the generic 2.x code paths ask for). TORCH_VERSION_MAJOR
// picks the few declarations that differ.
//
// Owns: the device's c10::Allocator (simdevMalloc; simdevFree in the
// DataPtr's deleter, so a tensor's device memory lives exactly as long as its
// storage: a tensor kept only by a reference cycle holds it until Python's
// collector runs), a device guard for one device, and the kernels the
// dispatcher cannot do without: the factories, the copies between host and
// device, resizing, the views, set_. Every other operator goes through the
// boxed fallback (`fallback` below): the CPU's kernel on host mirrors of
// the device tensors, one per device storage so that aliasing tensors stay
// aliased (Mirrors), and what it wrote copied back.
//
// Never: dereferences a device pointer. simdev memory faults on a host load
// or store (tests/simdev/simdev.h); every byte moves with simdevMemcpy or
// simdevMemset. No lock of its own: simdev's calls are thread-safe and the
// allocator keeps no state.
//
// Why each kernel is here (tests/integration/test_torch_backend.py shows
// what happens without the first ones):
//   empty.memory_format, empty_strided: the device's tensors come from
//     them; without them the fallback runs the CPU's factory and moves its
//     tensor to the device with the device's factory, the fallback again,
//     until the stack runs out (SIGSEGV);
//   _copy_from: every copy into or out of the device; without it
//     `.to(device)` finds no kernel (the CPU has no _copy_from);
//   as_strided, view, _reshape_alias: views without a trip to the host (the
//     fallback makes the same views, from a host copy of the span);
//   _copy_from_and_resize, resize_: the fallback writes out= results the
//     CPU's kernel resized back through them;
//   set_: storage copies (torch.save) view a device storage as a tensor;
//   _has_compatible_shallow_copy_type: Module.to(device) keeps the module's
//     Parameter objects, as on CUDA.
// And the operators whose CPU kernel does not exist, so the fallback cannot
// serve them: PyTorch routes an out-of-tree device to them where CUDA has
// its own kernels (tests/torch_examples/train.py runs each):
//   convolution_overrideable, convolution_backward_overrideable: every
//     nn.Conv*d (at::_convolution picks the "overrideable" backend for any
//     device it does not know); computed by the CPU's convolution;
//   _thnn_fused_lstm_cell, _thnn_fused_lstm_cell_backward_impl: nn.LSTM
//     takes CUDA's fused cell on PrivateUse1; the same arithmetic on the host.
//
// SIMDEV_TORCH_OMIT (read once, when the library is loaded) names kernels to
// leave unregistered, comma-separated: empty_strided, views, copy_from,
// convolution. It exists to demonstrate the failures above; unset,
// everything is registered.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#endif

#include <cstdlib>
#include <cstring>
#include <string>

#include "simdev.h"

#if TORCH_VERSION_MAJOR >= 2
// 2.x: optional is std::optional, and an allocator's allocate() is not const
// (it may keep statistics); copy_data is how storages clone device bytes.
template <class T> using Opt = std::optional<T>;
#define SIMDEV_ALLOCATE_CONST
#define INTS(x) C10_AS_INTARRAYREF_SLOW(x) // a symbolic size fails naming this line
#else
template <class T> using Opt = c10::optional<T>;
#define SIMDEV_ALLOCATE_CONST const
#define INTS(x) c10::asIntArrayRefSlow(x)
#endif

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
    c10::DataPtr allocate(size_t n) SIMDEV_ALLOCATE_CONST override
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
#if TORCH_VERSION_MAJOR >= 2
    void copy_data(void *dest, const void *src, size_t count) const override;
#endif
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

#if TORCH_VERSION_MAJOR >= 2
void SimdevAllocator::copy_data(void *dest, const void *src, size_t count) const
{
    memcpy_checked(dest, src, count, simdevMemcpyDeviceToDevice);
}
#endif

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

// Gives a storage `bytes` of device memory, its first bytes kept.
void resize_storage(c10::StorageImpl *st, size_t bytes)
{
    TORCH_CHECK(st->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = g_alloc.allocate(bytes);
    memcpy_checked(fresh.get(), st->data(), std::min(bytes, st->nbytes()),
                   simdevMemcpyDeviceToDevice);
    st->set_data_ptr_noswap(std::move(fresh));
    st->set_nbytes(bytes);
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
    resize_storage(st, need);
}

bool is_dev(const at::Tensor &t) { return t.defined() && t.device().type() == kDev; }

// A device tensor's bytes in its storage: [first, last + 1).
std::pair<size_t, size_t> byte_span(const at::Tensor &t)
{
    size_t lo = (size_t)t.storage_offset() * t.element_size();
    return {lo, lo + span_elems(t) * t.element_size()};
}

// ---- host mirrors -----------------------------------------------------------
//
// The CPU's kernels compute on host copies of device tensors. Tensors that
// share device memory must share host memory too, or an operator whose
// arguments alias computes something else than on the CPU:
// _foreach_add_([x, x], 1) would add 1 to each of two copies (the CPU adds
// 2), x[1:].copy_(x[:-1]) would run where the CPU refuses the overlap. So
// each device storage an operator touches gets one host buffer holding its
// bytes at the same offsets (the span its tensors cover; the rest is never
// read), and each device tensor a host tensor of the same dtype, sizes,
// strides and storage offset on it: the CPU's kernel sees the aliasing the
// device has, and raises or computes as it does on the CPU. What it wrote
// goes back from there.
class Mirrors {
public:
    // First every device tensor the kernel will see: the spans to copy.
    void note(const at::Tensor &dev)
    {
        if (!is_dev(dev) || dev.numel() == 0)
            return;
        auto [lo, hi] = byte_span(dev);
        Entry &e = entry(dev.storage());
        e.lo = std::min(e.lo, lo);
        e.hi = std::max(e.hi, hi);
    }

    // Then the host tensor of each (the same one for the same tensor, as
    // the CPU's kernel would be given the same one twice); others as given.
    at::Tensor host(const at::Tensor &dev)
    {
        if (!is_dev(dev))
            return dev;
        for (auto &[d, h] : tensors_)
            if (d.unsafeGetTensorImpl() == dev.unsafeGetTensorImpl())
                return h;
        at::TensorOptions cpu = dev.options().device(at::kCPU);
        at::Tensor h;
        if (dev.numel() == 0) {
            h = at::empty_strided(dev.sizes(), dev.strides(), cpu);
        } else {
            Entry &e = entry(dev.storage());
            if (!e.host) {
                e.host = c10::Storage(c10::Storage::use_byte_size_t(), e.hi, at::getCPUAllocator(),
                                      /*resizable=*/true);
                memcpy_checked(bytes(e.host) + e.lo, bytes(e.dev) + e.lo, e.hi - e.lo,
                               simdevMemcpyDeviceToHost);
            }
            h = at::empty({0}, cpu).set_(e.host, dev.storage_offset(), dev.sizes(), dev.strides());
        }
        tensors_.emplace_back(dev, h);
        return h;
    }

    // After the kernel: it wrote `dev` through its host tensor. A written
    // tensor the kernel gave another shape (an out= argument resized) is
    // copied back whole, resized on the device too.
    void wrote(const at::Tensor &dev)
    {
        if (!is_dev(dev))
            return;
        at::Tensor h = host(dev);
        bool same = h.sizes() == dev.sizes() && h.strides() == dev.strides() &&
            h.storage_offset() == dev.storage_offset();
        if (same && dev.numel() == 0)
            return;
        Entry *e = same ? find(dev.storage()) : nullptr;
        if (e && h.storage().unsafeGetStorageImpl() == e->host.unsafeGetStorageImpl()) {
            auto [lo, hi] = byte_span(dev);
            e->wlo = std::min(e->wlo, lo);
            e->whi = std::max(e->whi, hi);
        } else {
            reshaped_.emplace_back(dev, h);
        }
    }

    void write_back()
    {
        for (Entry &e : entries_)
            if (e.whi > e.wlo)
                memcpy_checked(bytes(e.dev) + e.wlo, bytes(e.host) + e.wlo, e.whi - e.wlo,
                               simdevMemcpyHostToDevice);
        for (auto &[d, h] : reshaped_)
            at::_copy_from_and_resize(h, d);
    }

    // The device tensor a tensor the kernel returned stands for: an
    // argument's own (an in-place operator returns its argument), or a view
    // of a device storage (the kernel made a view of a host tensor); else
    // none.
    at::Tensor device_of(const at::Tensor &h) const
    {
        for (auto &[d, x] : tensors_)
            if (x.unsafeGetTensorImpl() == h.unsafeGetTensorImpl())
                return d;
        for (const Entry &e : entries_) {
            if (!e.host || h.storage().unsafeGetStorageImpl() != e.host.unsafeGetStorageImpl())
                continue;
            if (at::detail::computeStorageNbytes(h.sizes(), h.strides(), h.element_size(),
                                                 h.storage_offset()) > e.dev.nbytes())
                break; // the kernel grew the host buffer: a copy, not a view
            at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
                c10::Storage(e.dev), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), h.dtype());
            v.unsafeGetTensorImpl()->set_sizes_and_strides(h.sizes(), h.strides(),
                                                           h.storage_offset());
            return v;
        }
        return {};
    }

private:
    struct Entry {
        c10::Storage dev, host;
        size_t lo = SIZE_MAX, hi = 0;   // the bytes of dev the kernel's tensors span
        size_t wlo = SIZE_MAX, whi = 0; // the bytes they were written in
    };
    static char *bytes(const c10::Storage &s) { return static_cast<char *>(s.data_ptr().get()); }
    Entry *find(const c10::Storage &s)
    {
        for (Entry &e : entries_)
            if (e.dev.unsafeGetStorageImpl() == s.unsafeGetStorageImpl())
                return &e;
        return nullptr;
    }
    Entry &entry(const c10::Storage &s)
    {
        if (Entry *e = find(s))
            return *e;
        entries_.push_back(Entry{s, {}});
        return entries_.back();
    }
    std::vector<Entry> entries_;
    std::vector<std::pair<at::Tensor, at::Tensor>> tensors_;  // (device tensor, host tensor)
    std::vector<std::pair<at::Tensor, at::Tensor>> reshaped_; // written, given another shape
};

// ---- kernels ------------------------------------------------------------

at::Tensor empty_memory_format(c10::SymIntArrayRef size, Opt<at::ScalarType> dtype,
                               Opt<at::Layout> layout, Opt<at::Device> device,
                               Opt<bool> pin_memory,
                               Opt<at::MemoryFormat> memory_format)
{
    (void)layout, (void)device, (void)pin_memory;
    return at::detail::empty_generic(INTS(size), &g_alloc,
                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         Opt<at::ScalarType> dtype, Opt<at::Layout> layout,
                         Opt<at::Device> device, Opt<bool> pin_memory)
{
    (void)layout, (void)device, (void)pin_memory;
    return at::detail::empty_strided_generic(INTS(size),
                                             INTS(stride), &g_alloc,
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
    if (is_dev(self) && is_dev(dst) &&
        self.storage().unsafeGetStorageImpl() == dst.storage().unsafeGetStorageImpl()) {
        // Within one storage the tensors may overlap: the CPU's copy_ on one
        // host mirror of it checks the overlap (x[1:].copy_(x[:-1]) raises)
        // and reads and writes in the CPU's order.
        Mirrors m;
        m.note(self);
        m.note(dst);
        m.host(dst).copy_(m.host(self));
        m.wrote(dst);
        m.write_back();
        return dst;
    }
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
                          Opt<at::MemoryFormat> memory_format)
{
    TORCH_CHECK(!memory_format || *memory_format == at::MemoryFormat::Contiguous ||
                    *memory_format == at::MemoryFormat::Preserve,
                "simdev resize_: only contiguous tensors");
    resize_device(self, INTS(size));
    return self;
}

at::Tensor as_strided(const at::Tensor &self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      Opt<c10::SymInt> storage_offset)
{
    Opt<int64_t> off;
    if (storage_offset)
        off = storage_offset->expect_int();
    return at::native::as_strided_tensorimpl(self, INTS(size),
                                             INTS(stride), off);
}

at::Tensor view(const at::Tensor &self, c10::SymIntArrayRef size)
{
    return at::native::view(self, INTS(size));
}

at::Tensor reshape_alias(const at::Tensor &self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride)
{
    return at::native::_reshape_alias(self, INTS(size),
                                      INTS(stride));
}

// set_: a tensor onto a storage. Storage copies (UntypedStorage.copy_ and
// .cpu(), through which torch.save writes every storage and torch.load
// moves them back) view both storages as tensors with set_: through the
// fallback the CPU's set_ would be handed the device's storage and refuse it.
at::Tensor &set_geometry(at::Tensor &self, const c10::Storage &source, int64_t offset,
                         at::IntArrayRef sizes, at::IntArrayRef given_strides)
{
    at::native::checkSetStorage(self, source, offset, sizes, given_strides);
    // No strides given: contiguous.
    std::vector<int64_t> strides(sizes.size(), 1);
    if (given_strides.size() == sizes.size())
        strides = given_strides.vec();
    else
        for (size_t d = sizes.size(); d-- > 1;)
            strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
    // A storage too small for the geometry grows, as CUDA's set_ grows it.
    size_t need = at::detail::computeStorageNbytes(sizes, strides, self.element_size(), offset);
    c10::StorageImpl *st = self.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (need > st->nbytes())
        resize_storage(st, need);
    self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    return self;
}

at::Tensor &set_storage_offset(at::Tensor &self, c10::Storage source, c10::SymInt offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride)
{
    return set_geometry(self, source, offset.expect_int(), INTS(size), INTS(stride));
}

at::Tensor &set_storage(at::Tensor &self, c10::Storage source)
{
    int64_t n = (int64_t)(source.nbytes() / self.element_size());
    return set_geometry(self, source, 0, {n}, {});
}

at::Tensor &set_tensor(at::Tensor &self, const at::Tensor &source)
{
    if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl())
        return self;
    return set_geometry(self, source.storage(), source.storage_offset(), source.sizes(),
                        source.strides());
}

at::Tensor &set_empty(at::Tensor &self)
{
    c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &g_alloc, /*resizable=*/true);
    return set_geometry(self, empty, 0, {0}, {});
}

// Module.to(device) keeps a module's Parameter objects and swaps their data
// (param.data = moved) where torch._has_compatible_shallow_copy_type says a
// CPU tensor's data can be swapped for the moved one's; else it makes new
// Parameters, and an optimizer built before .to() updates the old CPU
// tensors. PyTorch's own answer (TensorImpl::has_compatible_shallow_copy_type)
// counts dense tensors of the CPU, CUDA and a few in-tree devices alike,
// not PrivateUse1's, and leaves a PrivateUse1 backend to answer in this
// operator (dispatched on the device's key whenever one of the two is the
// device's): a dense tensor of this device is as interchangeable with a
// dense one of the CPU as CUDA's.
bool dense(const at::Tensor &t)
{
    c10::DispatchKeySet ks = t.key_set();
    return ks.has(c10::DispatchKey::Dense) &&
        (ks.has_backend(c10::BackendComponent::CPUBit) ||
         ks.has_backend(c10::BackendComponent::PrivateUse1Bit));
}

bool has_compatible_shallow_copy_type(const at::Tensor &self, const at::Tensor &from)
{
    return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
        (dense(self) && dense(from));
}

// ---- kernels without a CPU counterpart ---------------------------------------
//
// Each runs the CPU's operator on host copies (Tensor::cpu() goes through
// _copy_from) and moves the results to the device: the arithmetic is the
// CPU's, so a model computes what it computes on the CPU.

at::Tensor host(const at::Tensor &t) { return t.defined() ? t.cpu() : t; }
at::Tensor device_copy(const at::Tensor &t) { return t.defined() ? t.to(kDevice) : t; }

// The integer lists are int[] on 1.13 and SymInt[] on 2.x; the dispatcher
// takes an IntArrayRef kernel for both (it unpacks concrete SymInts).
at::Tensor convolution_overrideable(const at::Tensor &input, const at::Tensor &weight,
                                    const Opt<at::Tensor> &bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation,
                                    bool transposed, at::IntArrayRef output_padding,
                                    int64_t groups)
{
    Opt<at::Tensor> bias_h;
    if (bias && bias->defined())
        bias_h = host(*bias);
    return device_copy(at::convolution(host(input), host(weight), bias_h, stride, padding,
                                       dilation, transposed, output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
convolution_backward_overrideable(const at::Tensor &grad_output, const at::Tensor &input,
                                  const at::Tensor &weight, at::IntArrayRef stride,
                                  at::IntArrayRef padding, at::IntArrayRef dilation,
                                  bool transposed, at::IntArrayRef output_padding, int64_t groups,
                                  std::array<bool, 3> output_mask)
{
    // The bias's gradient is the output gradient summed: its size is the
    // output channels, which the weight's shape gives (transposed: dim 1,
    // per group).
    int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
    std::vector<int64_t> bias_sizes{out_channels};
    at::OptionalIntArrayRef bias_opt;
    if (output_mask[2])
        bias_opt = at::IntArrayRef(bias_sizes);
    auto r = at::convolution_backward(host(grad_output), host(input), host(weight), bias_opt,
                                      stride, padding, dilation, transposed, output_padding,
                                      groups, output_mask);
    return {device_copy(std::get<0>(r)), device_copy(std::get<1>(r)),
            device_copy(std::get<2>(r))};
}

// CUDA's fused LSTM cell (aten/src/ATen/native/cuda/RNN.cu), on the host:
// the gates are input_gates + hidden_gates (+ both biases), chunked in the
// order input, forget, cell, output; the workspace keeps the activated gates
// for the backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor>
fused_lstm_cell(const at::Tensor &input_gates, const at::Tensor &hidden_gates, const at::Tensor &cx,
                const Opt<at::Tensor> &input_bias, const Opt<at::Tensor> &hidden_bias)
{
    at::Tensor gates = host(input_gates) + host(hidden_gates);
    if (input_bias && input_bias->defined())
        gates = gates + host(*input_bias) + host(*hidden_bias);
    auto g = gates.chunk(4, 1);
    at::Tensor i = g[0].sigmoid(), f = g[1].sigmoid(), c = g[2].tanh(), o = g[3].sigmoid();
    at::Tensor cy = f * host(cx) + i * c;
    at::Tensor hy = o * cy.tanh();
    return {device_copy(hy), device_copy(cy), device_copy(at::cat({i, f, c, o}, 1))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
fused_lstm_cell_backward(const Opt<at::Tensor> &grad_hy, const Opt<at::Tensor> &grad_cy,
                         const at::Tensor &cx, const at::Tensor &cy, const at::Tensor &workspace,
                         bool has_bias)
{
    auto w = host(workspace).chunk(4, 1);
    const at::Tensor &i = w[0], &f = w[1], &c = w[2], &o = w[3];
    at::Tensor cy_h = host(cy), cx_h = host(cx);
    // An output nobody used has no gradient: zero.
    at::Tensor ghy = grad_hy && grad_hy->defined() ? host(*grad_hy) : at::zeros_like(cy_h);
    at::Tensor gcy = grad_cy && grad_cy->defined() ? host(*grad_cy) : at::zeros_like(cy_h);
    at::Tensor tcy = cy_h.tanh();
    at::Tensor gc_total = ghy * o * (1 - tcy * tcy) + gcy;
    at::Tensor gi = gc_total * c * i * (1 - i);
    at::Tensor gf = gc_total * cx_h * f * (1 - f);
    at::Tensor gg = gc_total * i * (1 - c * c);
    at::Tensor go = ghy * tcy * o * (1 - o);
    at::Tensor grad_gates = at::cat({gi, gf, gg, go}, 1);
    at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
    return {device_copy(grad_gates), device_copy(gc_total * f), device_copy(grad_bias)};
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

#if TORCH_VERSION_MAJOR >= 2
    // torch.accelerator.synchronize() and the profiler: simdev's calls are
    // synchronous, nothing is ever pending.
    void synchronizeDevice(c10::DeviceIndex) const override {}
#endif
};

#if TORCH_VERSION_MAJOR >= 2
// What 2.x asks a PrivateUse1 backend besides its kernels: torch.accelerator
// (isAvailable, deviceCount), pinned-memory queries, storage resizing from
// Python (UntypedStorage.resize_), the primary context autograd checks, and
// a generator. The device has no generator of its own: its random kernels
// (dropout, randn, ...) run on the CPU through the fallback and draw from the
// CPU's default generator, the one handed out here.
struct SimdevHooks final : at::PrivateUse1HooksInterface {
    bool isBuilt() const override { return true; }
    bool isAvailable() const override { return true; }
    bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
    c10::DeviceIndex deviceCount() const override { return 1; }
    c10::DeviceIndex getCurrentDevice() const override { return 0; }
    at::Device getDeviceFromPtr(void *) const override { return kDevice; }
    bool isPinnedPtr(const void *) const override { return false; }
    c10::Allocator *getPinnedMemoryAllocator() const override
    {
        return at::getCPUAllocator();
    }
    const at::Generator &getDefaultGenerator(c10::DeviceIndex) const override
    {
        return at::detail::getDefaultCPUGenerator();
    }
    void resizePrivateUse1Bytes(const c10::Storage &storage, size_t newsize) const override
    {
        resize_storage(storage.unsafeGetStorageImpl(), newsize);
    }
};

SimdevHooks g_hooks;

// scaled_dot_product_attention asks the device's _fused_sdp_choice_stub
// which kernel to run, and takes the math decomposition where a device has
// none: the CPU picks its flash kernel, which sums in another order. The
// CPU's choice (it reads only shapes, dtypes and flags) keeps the device on
// the CPU's kernel, which the fallback then runs.
int64_t sdp_choice(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   const std::optional<at::Tensor> &mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa)
{
    return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   q, k, v, mask, dropout_p, is_causal, scale,
                                                   enable_gqa);
}

// Registered when the library is loaded (torch.ops.load_library), before
// any tensor of the device exists.
const bool g_hooks_registered = [] {
    at::RegisterPrivateUse1HooksInterface(&g_hooks);
    return true;
}();
#endif

} // namespace

#if TORCH_VERSION_MAJOR >= 2
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &sdp_choice);
}
#endif

namespace {

} // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimdevGuard);
// Storages made without a factory (UntypedStorage(n, device=...)) take the
// device type's registered allocator.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_alloc);

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
    m.impl("set_.source_Storage", TORCH_FN(set_storage));
    m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
    m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
    m.impl("set_", TORCH_FN(set_empty));
    m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
    if (!omitted("views")) {
        m.impl("as_strided", TORCH_FN(as_strided));
        m.impl("view", TORCH_FN(view));
        m.impl("_reshape_alias", TORCH_FN(reshape_alias));
    }
    if (!omitted("convolution")) {
        m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
        m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
    }
    m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
    m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
}

// The same answer above autograd (the answer has no gradient), where
// Python's call lands: once the backend has its own kernel the composite
// one no longer serves AutogradPrivateUse1, and 1.13 has no fallback
// there.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m)
{
    m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

// The operators with both a CPU kernel and a CompositeExplicitAutograd one:
// a backend without its own kernel gets the composite (a decomposition that
// rounds differently: nn.LayerNorm's output differed from the CPU's in the
// last bit), not the fallback. These are sent to the CPU kernel by name.
// So are the reducing losses whose composite calls their out= variant with
// the reduced (0-d) output: the CPU's out= kernel first broadcasts into it
// and warns "An output with one or more elements was resized" on every
// F.mse_loss / F.smooth_l1_loss, which the CPU's own call never does.
static void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    for (const char *name :
         {"native_layer_norm", "native_group_norm", "addr", "mse_loss", "smooth_l1_loss"})
        m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

namespace {

bool written(const c10::Argument &a)
{
    const c10::AliasInfo *ai = a.alias_info();
    if (!ai)
        return false;
    if (ai->isWrite())
        return true;
    for (const c10::AliasInfo &inner : ai->containedTypes())
        if (inner.isWrite())
            return true;
    return false;
}

// Calls f on each tensor an argument holds: a tensor, or a list of tensors
// or of optional tensors (index's indices).
template <class F> void each_tensor(const c10::IValue &v, F f)
{
    if (v.isTensor()) {
        f(v.toTensor());
    } else if (v.isTensorList()) {
        for (const at::Tensor &t : v.toTensorList())
            f(t);
    } else if (v.isOptionalTensorList()) {
        for (Opt<at::Tensor> t : v.toOptionalTensorList())
            if (t)
                f(*t);
    }
}

// The value with each tensor replaced by f's: lists are new ones (the
// caller's list is left as it was).
template <class F> c10::IValue map_tensors(const c10::IValue &v, F f)
{
    if (v.isTensor())
        return f(v.toTensor());
    if (v.isTensorList()) {
        c10::List<at::Tensor> out;
        for (const at::Tensor &t : v.toTensorList())
            out.push_back(f(t));
        return out;
    }
    if (v.isOptionalTensorList()) {
        c10::List<Opt<at::Tensor>> out;
        for (Opt<at::Tensor> t : v.toOptionalTensorList())
            out.push_back(t ? Opt<at::Tensor>(f(*t)) : Opt<at::Tensor>());
        return out;
    }
    return v;
}

// The boxed fallback: every operator the device has no kernel for runs the
// CPU's kernel on host mirrors of its device tensors (Mirrors: aliasing
// arguments stay aliased), arguments in lists included (the optimizers'
// in-place foreach kernels write lists: _foreach_add_, _foreach_addcdiv_,
// ...); a device argument (a factory's) becomes the CPU. The written
// arguments go back, and the results come back as device tensors: the
// argument itself where the kernel returned its argument (in-place and out=
// operators), a view of the device storage where it returned a view of
// one, a given CPU tensor as itself, anything else copied to the device.
// (at::native::cpu_fallback copies each argument separately, and not those
// in a written list.)
} // namespace

static void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack)
{
    const auto &args = op.schema().arguments();
    size_t first = stack->size() - args.size();
    Mirrors m;
    for (size_t i = 0; i < args.size(); i++)
        each_tensor((*stack)[first + i], [&](const at::Tensor &t) { m.note(t); });
    std::vector<at::Tensor> written_args, given_cpu;
    for (size_t i = 0; i < args.size(); i++) {
        c10::IValue &v = (*stack)[first + i];
        bool w = written(args[i]);
        each_tensor(v, [&](const at::Tensor &t) {
            if (w)
                written_args.push_back(t);
            if (t.defined() && !is_dev(t))
                given_cpu.push_back(t);
        });
        v = map_tensors(v, [&](const at::Tensor &t) { return m.host(t); });
        if (v.isDevice() && v.toDevice().type() == kDev)
            v = c10::Device(at::kCPU);
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    for (const at::Tensor &t : written_args)
        m.wrote(t);
    m.write_back();
    size_t rets = op.schema().returns().size();
    for (size_t i = stack->size() - rets; i < stack->size(); i++)
        (*stack)[i] = map_tensors((*stack)[i], [&](const at::Tensor &h) {
            if (!h.defined())
                return h;
            at::Tensor d = m.device_of(h);
            if (d.defined())
                return d;
            for (const at::Tensor &c : given_cpu)
                if (c.unsafeGetTensorImpl() == h.unsafeGetTensorImpl())
                    return h;
            return device_copy(h);
        });
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m)
{
    m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}
