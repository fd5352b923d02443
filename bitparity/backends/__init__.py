"""Backend registry and run-time selection.

A backend is a package with the names listed in docs/backend-contract.md.
They are imported lazily, so a missing triton or torch_npu only makes its own
backend unavailable.  The default backend follows the input's device unless
`use_backend` has set one.
"""

import contextvars
import importlib

import torch

NAMES = ("cpu", "numpy", "cuda", "ascend", "native")

_modules = {}
# Per thread and per asyncio task: a new thread starts with no backend set, and `with use_backend(...)` in one
# thread or task never changes what another one sees.
_default = contextvars.ContextVar("bitparity_backend", default=None)


def _module(name):
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(f"{__name__}.{name}")
        except ImportError as err:
            _modules[name] = err
    return _modules[name]


def _npu_present():
    npu = getattr(torch, "npu", None)
    return npu is not None and npu.is_available()


def availability(name):
    """(available, reason) of the backend called name."""
    module = _module(name)
    if isinstance(module, ImportError):
        return False, f"cannot be imported: {module}"
    return module.availability()


def device_type(name):
    """The torch device type a backend's tensors live on, here and now."""
    if name == "cuda":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "ascend":
        return "npu" if _npu_present() else "cpu"
    return "cpu"


def backends():
    """Every backend: name, whether it is available, why (or how), and its device type."""
    rows = []
    for name in NAMES:
        available, reason = availability(name)
        rows.append({"name": name, "available": available, "reason": reason,
                     "device": "any" if name == "native" else device_type(name)})
    return rows


def _check_name(name):
    if not isinstance(name, str) or name not in NAMES:
        raise ValueError(f"backend must be one of {', '.join(NAMES)}; got {name!r}")


class use_backend:
    """Set the default backend: `use_backend("cuda")` sets it, `with use_backend("cuda"):` sets it for a block.

    `use_backend(None)` returns to choosing by the input's device. The setting belongs to the calling thread
    (or asyncio task): other threads keep their own, and a new thread starts with none.
    """

    def __init__(self, name):
        if name is not None:
            _check_name(name)
        self._token = _default.set(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _default.reset(self._token)


def current_backend():
    """The name set by use_backend, or None when the default follows the input's device."""
    return _default.get()


def _default_for(device):
    if device.type == "cpu":
        return "cpu" if availability("cpu")[0] else "numpy"
    if device.type == "cuda":
        return "cuda"
    if device.type in ("npu", "privateuseone"):
        return "ascend"
    raise ValueError(f"no bitparity backend for tensors on device {device}")


def resolve(backend, device):
    """The backend module for a call: the name given, else use_backend's, else the device's default."""
    name = backend if backend is not None else (_default.get() or _default_for(device))
    _check_name(name)
    available, reason = availability(name)
    if not available:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    wanted = device_type(name)
    if name != "native" and device.type != wanted:
        raise ValueError(f"backend {name!r} takes {wanted} tensors here; the input is on {device}")
    return _module(name)
