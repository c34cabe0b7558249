"""torch.simdev: the device module PyTorch 2.x asks a renamed PrivateUse1
backend for (torch._register_device_module). torch.device("simdev"),
Module.to, autocast, torch.random.fork_rng and the generated methods look
up these functions by name. One device, always there, synchronous: nothing
to wait for. Random numbers of the device's kernels come from the CPU's
generator (its kernels are the CPU's, through the fallback), so the RNG
state functions are the CPU's."""
import torch


def is_available():
    return True


def device_count():
    return 1


def current_device():
    return 0


def set_device(device):
    index = torch.device(device).index if not isinstance(device, int) else device
    if index not in (None, 0):
        raise ValueError(f"simdev has one device, not {device!r}")


class device:
    """torch.simdev.device(d): selects device d for a block, as
    torch.cuda.device does (storage moves, torch.load's among them, select
    the target device this way). There is one device: nothing to switch."""

    def __init__(self, device):
        set_device(device if device is not None else 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def is_initialized():
    return True


def _is_in_bad_fork():
    return False


def synchronize(device=None):
    pass


# torch.manual_seed calls manual_seed_all here: seeding the CPU's generator
# alone (not torch.manual_seed, which would come back here).
def manual_seed(seed):
    torch.default_generator.manual_seed(seed)


def manual_seed_all(seed):
    torch.default_generator.manual_seed(seed)


def get_rng_state(device="simdev"):
    return torch.get_rng_state()


def set_rng_state(new_state, device="simdev"):
    torch.set_rng_state(new_state)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]
