"""RAPIDS RMM hook (docs/frameworks.md): wraps the current device resource
in rmm.mr.FailureCallbackResourceAdaptor, whose callback runs outside the
pool's mutex with the GIL taken: it collects garbage once per failing
allocation and asks for one retry. (The pool holds a plain std::mutex
across its upstream cudaMalloc, so the shim itself never collects there.)
"""
import gc

FRAMEWORK_MODULE = "rmm"
_installed = False


def environment(env):
    return []


class _OncePerFailure:
    """True (retry) after the first collection for a request of `nbytes`,
    False the second time in a row, so a truly full device fails."""

    def __init__(self):
        self.last = None

    def __call__(self, nbytes):
        if self.last == nbytes:
            self.last = None
            return False
        self.last = nbytes
        gc.collect()
        return True


def install():
    global _installed
    if _installed:
        return True, "already installed"
    try:
        import rmm.mr as mr
    except ImportError as e:
        return False, "RMM is not installed (%s)" % e
    adaptor = getattr(mr, "FailureCallbackResourceAdaptor", None)
    if adaptor is None:
        return False, "this RMM has no FailureCallbackResourceAdaptor"
    mr.set_current_device_resource(adaptor(mr.get_current_device_resource(), _OncePerFailure()))
    _installed = True
    return True, "FailureCallbackResourceAdaptor installed"
