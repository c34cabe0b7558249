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
// device, resizing, and the views. Every other operator goes through the
// boxed CPU fallback (at::native::cpu_fallback): inputs copied to the host
// through _copy_from, the CPU kernel, results copied back.
//
// Never: dereferences a device pointer. simdev memory faults on a host load
// or store (tests/simdev/simdev.h); every byte moves with simdevMemcpy or
// simdevMemset. No lock of its own: simdev's calls are thread-safe and the
// allocator keeps no state.
//
// Why each kernel is here (PyTorch fails silently where one of the first
// six is missing; tests/integration/test_torch_backend.py shows each failure):
//   empty.memory_format, empty_strided: without them the catch-all runs the
//     CPU factory, and `.to(device)` returns a CPU tensor;
//   as_strided, view, _reshape_alias: without them a view is a copy, and
//     writes through it are lost;
//   _copy_from: without it the fallback hands device storage to CPU kernels,
//     which read device memory (SIGSEGV);
//   _copy_from_and_resize, resize_: the fallback writes out= results and
//     in-place results back through them.
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
#include <ATen/native/CPUFallback.h>
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

// The operators with both a CPU kernel and a CompositeExplicitAutograd one:
// a backend without its own kernel gets the composite (a decomposition that
// rounds differently: nn.LayerNorm's output differed from the CPU's in the
// last bit), not the fallback. These are sent to the CPU kernel by name.
static void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    for (const char *name : {"native_layer_norm", "native_group_norm", "addr"})
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

bool on_device(const c10::IValue &v)
{
    return v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kDev;
}

// The boxed fallback. at::native::cpu_fallback copies back the tensors an
// operator writes, but not those inside a tensor list: the optimizers'
// in-place foreach kernels (_foreach_add_, _foreach_addcdiv_, ...: every
// PyTorch 2.x optimizer's default on this device, foreach=True on 1.13)
// would update host copies and lose the result. Operators with a written
// tensor list run here instead: every device tensor in the arguments is
// replaced by a host copy, the CPU kernel runs, the written ones are copied
// back. (cpu_fallback's extra parameters in 2.x also have defaults the
// boxed signature cannot carry.)
} // namespace

static void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack)
{
    const auto &args = op.schema().arguments();
    bool list_written = false;
    for (const c10::Argument &a : args)
        if (a.type()->kind() == c10::TypeKind::ListType && written(a))
            list_written = true;
    if (!list_written) {
        at::native::cpu_fallback(op, stack);
        return;
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> back; // (device tensor, its host copy)
    size_t first = stack->size() - args.size();
    for (size_t i = 0; i < args.size(); i++) {
        c10::IValue &v = (*stack)[first + i];
        bool w = written(args[i]);
        if (on_device(v)) {
            at::Tensor h = to_host(v.toTensor());
            if (w)
                back.emplace_back(v.toTensor(), h);
            v = h;
        } else if (v.isTensorList()) {
            c10::List<at::Tensor> in = v.toTensorList(), out;
            for (const at::Tensor &t : in) {
                if (t.defined() && t.device().type() == kDev) {
                    at::Tensor h = to_host(t);
                    if (w)
                        back.emplace_back(t, h);
                    out.push_back(h);
                } else {
                    out.push_back(t);
                }
            }
            v = out;
        }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    for (auto &[dev, h] : back)
        write_device(dev, h);
    // Results: tensors and lists of tensors the CPU kernel made, moved to
    // the device (an in-place foreach kernel returns nothing).
    const auto &rets = op.schema().returns();
    size_t rfirst = stack->size() - rets.size();
    for (size_t i = 0; i < rets.size(); i++) {
        c10::IValue &v = (*stack)[rfirst + i];
        if (v.isTensor() && v.toTensor().defined()) {
            v = device_copy(v.toTensor());
        } else if (v.isTensorList()) {
            c10::List<at::Tensor> out;
            for (const at::Tensor &t : v.toTensorList())
                out.push_back(device_copy(t));
            v = out;
        }
    }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m)
{
    m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}
