"""A simulated second device on the CPU (a test helper): catches tensors left on the wrong device without a GPU.

On the CPU a tensor "left on the CPU" cannot be told from one "on the device". :class:`SimulatedDevice`, a torch
function mode, tells them apart by provenance and raises where CUDA would:

* **Tags.** A tensor is ``"device"`` when it was placed on :data:`SIM` (``torch.device("cpu", 0)``): a factory
  called with ``device=SIM``, ``.to(SIM)`` or ``.to(t)`` for a device tensor ``t``, a parameter or buffer of a
  module placed with :func:`place` or moved with ``module.to(SIM)``. It is ``"host"`` when Python code made it on
  the CPU without naming SIM: a factory with no device or ``device="cpu"``, ``.cpu()``, ``.to("cpu")``,
  ``torch.tensor`` / ``as_tensor`` / ``from_numpy`` of Python or NumPy data. It is untagged when its provenance is
  unknown (made in C++, e.g. gradients made by autograd). An op's outputs are ``"device"`` if any tensor input is,
  else ``"host"`` if any is; an in-place op leaves its target's tag alone. The tag is a Python attribute of the
  tensor object.
* **Reported device.** ``Tensor.device`` of a device tensor is SIM, so code that derives a device from a tensor or
  from ``policy.device`` (its parameters' device) makes device tensors (``torch.zeros(n, device=x.device)``).
  Real storage stays on the CPU: SIM is passed to the real op as plain ``cpu``, and every value is real.
* **Mixing.** An op that gets a device tensor and a host tensor with ``ndim > 0`` raises a ``RuntimeError``
  ("Expected all tensors to be on the same device"), naming the op and the host tensor's shape; a 0-dim host
  tensor is allowed, as CUDA allows CPU scalars in CUDA ops. Exempt is what CUDA does across devices
  (:data:`_CROSS_DEVICE`).

Backward runs inside ``Tensor.backward``, which the mode sees as one op: autograd's own ops are not checked (their
devices follow the forward's).
"""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

SIM = torch.device("cpu", 0)
"""The simulated device: a valid device object distinct from ``torch.device("cpu")``."""
DEVICE, HOST = "device", "host"
_TAG = "_simulated_device_tag"
_DEVICE_PROPERTY = torch.Tensor.device  # the getset descriptor whose __get__ the mode sees
_DATA_PROPERTY = torch.Tensor.data
_PARSERS = (torch.device, torch._C._nn._parse_to)  # torch.device(x.device); module.to(device)
# ops that CUDA runs with their tensors on different devices; every op with one tensor argument (cpu, tolist,
# item, numpy, __repr__, __format__, __reduce_ex__ for torch.save) cannot mix and needs no entry
_CROSS_DEVICE = frozenset({
    "copy_",  # copies between devices
    "to",  # .to(other): other names the target device
    "__setitem__",  # basic indexing copies; index tensors and index_put_ values: _check_indexing
    "_has_compatible_shallow_copy_type",  # module.to / .cpu compares a parameter with its moved copy
})


def tag_of(t: torch.Tensor) -> str | None:
    """``"device"``, ``"host"`` or ``None`` (unknown provenance)."""
    return getattr(t, _TAG, None)


def _set_tag(t: torch.Tensor, tag: str | None) -> None:
    if tag is not None:
        setattr(t, _TAG, tag)


def _is_sim(x) -> bool:
    """``x`` is SIM, as a device object or a string (``"cpu:0"``)."""
    return x == SIM if isinstance(x, torch.device) else isinstance(x, str) and x.replace(" ", "") == "cpu:0"


def _strip(x):
    """SIM as plain ``cpu``; anything else unchanged."""
    return torch.device("cpu") if _is_sim(x) else x


def _tensors(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def _target(name: str, args, kwargs) -> str | None:
    """The tag a placement names: ``device=`` / ``.to(device)`` / ``.to(tensor)`` / ``.cpu()``; else None."""
    if name == "cpu":
        return HOST
    candidates = [*args[1:], kwargs.get("other"), kwargs.get("device")] if name == "to" else [kwargs.get("device")]
    for c in candidates:
        if isinstance(c, torch.Tensor):
            return tag_of(c)
        if _is_sim(c):
            return DEVICE
        if isinstance(c, torch.device) or (isinstance(c, str) and c.startswith("cpu")):
            return HOST
    return None


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


class SimulatedDevice(TorchFunctionMode):
    """Torch function mode of the simulated device (module docstring): tags, ``Tensor.device``, mixing errors.

    ``torch.from_numpy`` and ``torch.frombuffer`` bypass torch function modes; inside the mode they are wrapped so
    that their tensors are host tensors too."""

    _UNSEEN_FACTORIES = ("from_numpy", "frombuffer")

    def __enter__(self):
        self._saved = {name: getattr(torch, name) for name in self._UNSEEN_FACTORIES}
        for name, real in self._saved.items():
            setattr(torch, name, _host_factory(real))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(torch, name, real)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a tensor property
            owner = getattr(func, "__self__", None)
            if owner is _DEVICE_PROPERTY:
                return SIM if tag_of(args[0]) == DEVICE else func(*args)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and tag_of(out) is None:  # .data, .grad, .T, ...
                _set_tag(out, tag_of(args[0]))
            return out
        if name == "__set__" and getattr(func, "__self__", None) is _DATA_PROPERTY:  # p.data = t: p moves to t's device
            func(*args)
            _set_tag(args[0], tag_of(args[1]))
            return None
        if func in _PARSERS:  # they return the device they are given, to code that places tensors with it
            return func(*args, **kwargs)
        inputs = _tensors((args, kwargs), [])
        self._check(func, name, args, inputs)
        out = func(*[_strip(a) for a in args], **{k: _strip(v) for k, v in kwargs.items()})
        tag = placed = _target(name, args, kwargs)
        if tag is None:
            tags = {tag_of(t) for t in inputs}
            tag = DEVICE if DEVICE in tags else HOST if HOST in tags or not inputs else None
        return self._tagged(out, tag, inputs, transfer=placed is not None)

    @staticmethod
    def _check(func, name: str, args, inputs: list) -> None:
        if name in ("__getitem__", "__setitem__"):
            _check_indexing(name, *args)
        if name in _CROSS_DEVICE or name == "__getitem__":
            return
        host = [t for t in inputs if tag_of(t) == HOST and t.ndim > 0]
        if host and any(tag_of(t) == DEVICE for t in inputs):
            where = getattr(func, "__qualname__", name) or repr(func)
            raise RuntimeError(f"Expected all tensors to be on the same device, but {where} got tensors on the "
                               f"simulated device {SIM} and a host tensor {_describe(host[0])} (device vs host).")

    @staticmethod
    def _tagged(out, tag: str | None, inputs: list, transfer: bool):
        if isinstance(out, torch.Tensor):
            if any(out is t for t in inputs) and tag_of(out) is not None:
                if not transfer or tag_of(out) == tag:  # in place (or a no-op): the target stays where it is
                    return out
                out = out.view_as(out)  # a transfer real torch did without a copy (.to, as_tensor): a new object
            _set_tag(out, tag)
        elif isinstance(out, (list, tuple)):
            for t in _tensors(out, []):
                if not any(t is i for i in inputs):
                    _set_tag(t, tag)
        return out


def _check_indexing(name: str, target: torch.Tensor, index, value=None) -> None:
    """As CUDA: a host index tensor may index a device tensor, not vice versa; with an index tensor (or list),
    ``__setitem__`` is ``index_put_``, which moves a 0-dim value to the target's device and no other (basic
    indexing copies from anywhere)."""
    index_tensors = _tensors(index, [])
    if tag_of(target) == HOST and target.ndim > 0 and any(tag_of(t) == DEVICE for t in index_tensors):
        raise RuntimeError(f"Expected all tensors to be on the same device: {name} indexes a host tensor "
                           f"{_describe(target)} with an index on the simulated device {SIM} (host vs device).")
    parts = index if isinstance(index, tuple) else (index,)
    advanced = bool(index_tensors) or any(isinstance(i, list) for i in parts)
    if advanced and isinstance(value, torch.Tensor) and value.ndim > 0 \
            and {tag_of(target), tag_of(value)} == {DEVICE, HOST}:
        raise RuntimeError(f"Expected all tensors to be on the same device, but __setitem__ (index_put_) writes "
                           f"{_describe(value)} ({tag_of(value)}) into {_describe(target)} ({tag_of(target)}).")


def _host_factory(real):
    def make(*args, **kwargs):
        out = real(*args, **kwargs)
        _set_tag(out, HOST)
        return out

    return make


def place(module: nn.Module) -> nn.Module:
    """Tag every parameter and buffer of ``module`` as on :data:`SIM` (LoRA adapters included), and those of a
    policy's KL reference copy (``Policy._reference``, not a submodule); returns ``module``."""
    tensors = [module.parameters(), module.buffers()]
    for m in module.modules():
        for ref in getattr(m, "_reference", None) or []:
            tensors += [ref.parameters(), ref.buffers()]
    for t in itertools.chain(*tensors):
        _set_tag(t, DEVICE)
    return module


@contextlib.contextmanager
def simulated_device(*modules: nn.Module):
    """:func:`place` ``modules``, then run the block inside :class:`SimulatedDevice`."""
    for m in modules:
        place(m)
    with SimulatedDevice():
        yield SIM
