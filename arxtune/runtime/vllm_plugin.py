"""arxtune's vLLM plugin: calibrated thresholds pick a backend per collective call.

vLLM loads `register` (entry point `arxtune` in the `vllm.general_plugins`
group) once in every process: the engine and each worker. It makes the
current platform name a subclass of the platform's own device communicator
(CudaCommunicator on GPUs, so vLLM's graph-capture checks still pass;
CpuCommunicator on CPU). vLLM builds one communicator per process group; in
the tensor-parallel group ("tp:*") the subclass

- loads the thresholds file ($ARXTUNE_THRESHOLDS, else
  arxtune.runtime.communicator.default_thresholds_path()), checks it fits the group
  (format version, world size, the model's dtype) and that every rank of the
  group loaded the same file,
- builds arxtune.runtime.router's router for the group (the same one the bundled
  communicator uses): the file's eager and graph tables, ARXTUNE_OVERRIDES,
  the backends its ranges name (other than the baseline and vLLM's own
  "vllm_*") opened with the options the file recorded, and the fingerprint
  check,
- logs one line: mode tables, capacity, fingerprint status, overrides, and
  which (mode, op, dtype, bytes) ranges it takes.

Per call, all_reduce, all_gather, reduce_scatter (dim 0) and the sequence-
parallel hooks custom_all_gather / custom_reduce_scatter go to the backend the
router picks for (op, dtype, bytes): from the graph table while a CUDA graph
is being captured (only backends that can be captured), else the eager table,
and only within the backend's capacity. Everything else, every other group,
and every range that names the thresholds' baseline or a vLLM communicator
goes to vLLM's own code (super()) unchanged. Sizes follow arxtune.runtime.ops:
all_reduce by one rank's input bytes, all_gather by the gathered bytes,
reduce_scatter by its input bytes; a range includes its lower bound and
excludes its upper bound.

No file, a bad file, a file that does not fit, ranks that disagree, or a
backend that cannot start: one warning and vLLM's own behaviour for the
affected ranges, never an exception at start-up. So is, while vLLM runs
batch-invariant (VLLM_BATCH_INVARIANT=1, read through vllm.envs), a file with
a range that leaves vLLM's path for a backend not known to give the
baseline's bits there (`arxtune calibrate --invariant` writes files without
one).

Switches (environment variables, the same on every rank):
- ARXTUNE_THRESHOLDS: the thresholds file (default ~/.config/arxtune/thresholds.json,
  where `arxtune calibrate RUN --install` writes).
- ARXTUNE_VLLM_DISABLE=1: do not install the communicator at all.
- ARXTUNE_OVERRIDES, ARXTUNE_FINGERPRINT: see arxtune.runtime.router.
- ARXTUNE_VLLM_LOG: what the plugin's logger "vllm.arxtune" says: info (default:
  the start-up line and warnings), calls (also one INFO line per TP collective
  call: op, dtype, bytes, who took it), warning (fallback warnings only),
  error (nothing unless something breaks).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter

from arxtune.runtime.ops import OP_SPECS
from arxtune.runtime import env

log = logging.getLogger("vllm.arxtune")  # a child of vLLM's logger: vLLM's handler and format

ENV_DISABLE = env.VLLM_DISABLE.name
ENV_LOG = env.VLLM_LOG.name
#: The name the platform hands out once the plugin is registered; resolved lazily by __getattr__ below.
WRAPPER_NAME = "ArxtuneDeviceCommunicator"
WRAPPER_QUALNAME = f"{__name__}.{WRAPPER_NAME}"
#: Process groups the plugin takes calls for (vLLM unique_name "tp:N").
GROUP_PREFIX = "tp"
#: Counter key for calls left to vLLM's own code.
VLLM_PATH = "vllm"

_base_qualname: str | None = None
_wrapper: type | None = None


_log_calls = False


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _configure_log(setting: str) -> None:
    """ARXTUNE_VLLM_LOG: info (vLLM's level) | calls | warning | error; unknown values read as info."""
    global _log_calls
    setting = setting.strip().lower()
    _log_calls = setting == "calls"
    log.setLevel({"calls": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}.get(setting, logging.NOTSET))


def register() -> None:
    """The vllm.general_plugins entry point; safe to call more than once per process, never raises."""
    if _truthy(env.VLLM_DISABLE.get()):
        log.info("arxtune: %s=1, vLLM's own communicator is used", ENV_DISABLE)
        return
    try:
        _install()
    except Exception as exc:  # vLLM calls plugins unguarded: a failure here would stop vLLM
        log.warning("arxtune: not installed (%s: %s); vLLM's own communicator is used", type(exc).__name__, exc)


def _install() -> None:
    global _base_qualname
    _configure_log(env.VLLM_LOG.get())
    from vllm.platforms import current_platform

    base = current_platform.get_device_communicator_cls()
    if base == WRAPPER_QUALNAME:
        return
    _base_qualname = base

    def get_device_communicator_cls() -> str:
        # vLLM's stateless (elastic EP) coordinator asserts it gets exactly CudaCommunicator.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return base if caller == "vllm.distributed.stateless_coordinator" else WRAPPER_QUALNAME

    current_platform.get_device_communicator_cls = get_device_communicator_cls
    log.debug("arxtune: device communicators are %s over %s", WRAPPER_QUALNAME, base)


def __getattr__(name: str):
    """Build the wrapper class the first time vLLM resolves WRAPPER_QUALNAME in this process."""
    global _wrapper
    if name != WRAPPER_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _wrapper is None:
        if _base_qualname is None:
            raise AttributeError(f"{WRAPPER_QUALNAME} exists only after {__name__}.register() ran in this process")
        from vllm.utils.import_utils import resolve_obj_by_qualname

        _wrapper = wrap(resolve_obj_by_qualname(_base_qualname))
    return _wrapper


def wrap(base: type) -> type:
    """A subclass of vLLM's communicator class `base` that routes calls by the thresholds."""
    return type(
        f"Arxtune{base.__name__}",
        (ArxtuneRouting, base),
        {"__module__": __name__, "__qualname__": WRAPPER_NAME, "__doc__": ArxtuneRouting.__doc__},
    )


class ArxtuneRouting:
    """Thresholds-driven dispatch in front of vLLM's device communicator (see arxtune.runtime.vllm_plugin)."""

    arxtune_dispatch = None  # arxtune.runtime.dispatch.Dispatch, or None: vLLM's path for everything

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arxtune_dispatch = None
        if self.unique_name.split(":")[0] != GROUP_PREFIX or self.world_size < 2:  # type: ignore[attr-defined]
            return
        self.arxtune_dispatch = setup_dispatch(self)

    @property
    def arxtune_routes(self):
        """What start-up decided (arxtune.runtime.dispatch.Started), or None."""
        return self.arxtune_dispatch.started if self.arxtune_dispatch else None

    @property
    def arxtune_calls(self) -> Counter:
        """Calls so far by (op, backend), "vllm" for vLLM's own path; empty outside the TP group."""
        return self.arxtune_dispatch.router.calls if self.arxtune_dispatch else Counter()

    def _arxtune_pick(self, op: str, tensor, eligible: bool = True):
        """The backend for this call, or None for vLLM's path (`eligible` False: only vLLM can do it)."""
        dispatch = self.arxtune_dispatch
        if dispatch is None:
            return None
        if not eligible:
            dispatch.router.count(op)
            if _log_calls:
                log.info("arxtune: %s %s %s along another dim -> %s", op, tensor.dtype, tuple(tensor.shape), VLLM_PATH)
            return None
        backend = dispatch.pick(op, tensor)
        if _log_calls:
            nbytes = OP_SPECS[op].tensor_nbytes(tensor.nbytes, self.world_size)  # type: ignore[attr-defined]
            log.info("arxtune: %s %s %d bytes -> %s", op, tensor.dtype, nbytes, backend.name if backend is not None else VLLM_PATH)
        return backend

    def all_reduce(self, input_):
        backend = self._arxtune_pick("all_reduce", input_)
        if backend is None:
            return super().all_reduce(input_)  # type: ignore[misc]
        return self.arxtune_dispatch.run(backend, "all_reduce", input_)

    def all_gather(self, input_, dim: int = -1):
        backend = self._arxtune_pick("all_gather", input_, eligible=input_.dim() > 0)
        if backend is None:
            return super().all_gather(input_, dim)  # type: ignore[misc]
        dim = dim + input_.dim() if dim < 0 else dim
        gathered = self.arxtune_dispatch.run(backend, "all_gather", input_)
        if dim == 0:
            return gathered
        # (world, *shape) with the world axis moved in front of `dim`, then merged with it.
        shape = tuple(input_.shape)
        moved = gathered.view(self.world_size, *shape).movedim(0, dim)  # type: ignore[attr-defined]
        return moved.reshape(*shape[:dim], self.world_size * shape[dim], *shape[dim + 1 :])  # type: ignore[attr-defined]

    def reduce_scatter(self, input_, dim: int = -1):
        dim = dim + input_.dim() if dim < 0 else dim
        eligible = input_.dim() > 0 and dim == 0 and input_.shape[0] % self.world_size == 0  # type: ignore[attr-defined]
        backend = self._arxtune_pick("reduce_scatter", input_, eligible)
        if backend is None:
            return super().reduce_scatter(input_, dim)  # type: ignore[misc]
        return self.arxtune_dispatch.run(backend, "reduce_scatter", input_)

    def custom_all_gather(self, input_):
        """Sequence-parallel gather along dim 0; None hands the call back to vLLM's caller."""
        backend = self._arxtune_pick("all_gather", input_, eligible=input_.dim() > 0)
        if backend is not None:
            return self.arxtune_dispatch.run(backend, "all_gather", input_)
        inner = getattr(super(), "custom_all_gather", None)
        return inner(input_) if inner is not None else None

    def custom_reduce_scatter(self, input_):
        """Sequence-parallel reduce-scatter along dim 0; None hands the call back to vLLM's caller."""
        eligible = input_.dim() > 0 and input_.shape[0] % self.world_size == 0  # type: ignore[attr-defined]
        backend = self._arxtune_pick("reduce_scatter", input_, eligible)
        if backend is not None:
            return self.arxtune_dispatch.run(backend, "reduce_scatter", input_)
        inner = getattr(super(), "custom_reduce_scatter", None)
        return inner(input_) if inner is not None else None

    def destroy(self):
        if self.arxtune_dispatch is not None:
            self.arxtune_dispatch.close()
            self.arxtune_dispatch = None
        inner = getattr(super(), "destroy", None)
        if inner is not None:
            inner()


# ---- start-up: load, agree across the group, open backends, say what is taken ----


def setup_dispatch(comm):
    """The dispatch for one TP communicator, or None (vLLM's path for everything) after one warning."""
    try:
        return _open_dispatch(comm)
    except Exception as exc:  # start-up must not crash vLLM; the reason is logged
        _say(comm, logging.WARNING, f"set-up failed ({type(exc).__name__}: {exc})")
        return None


def _say(comm, level: int, what: str, everything_to_vllm: bool | None = None) -> None:
    """One line per group (from its rank 0); a warning says what happens instead."""
    if comm.rank_in_group != 0:
        return
    if everything_to_vllm is None:
        everything_to_vllm = level >= logging.WARNING
    tail = f"; every call uses vLLM's {_base_name(comm)}" if everything_to_vllm else ""
    log.log(level, "arxtune: %s (world %d): %s%s", comm.unique_name, comm.world_size, what, tail)


def _base_name(comm) -> str:
    return next((c.__name__ for c in type(comm).__mro__[1:] if c is not ArxtuneRouting and c.__module__ != __name__), "communicator")


def _model_dtype():
    """The model's dtype when vLLM has a config in this process, else None."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        return getattr(getattr(config, "model_config", None), "dtype", None)
    except Exception:
        return None


def serves_itself(baseline: str, name: str) -> bool:
    """Whether vLLM's own communicator serves a range naming `name` (the file's baseline or one of vLLM's)."""
    from arxtune.runtime.backends import framework

    return name == baseline or framework(name) == "vllm"


def batch_invariant() -> bool:
    """Whether vLLM runs in its batch-invariant mode (results independent of how requests are batched)."""
    try:
        import vllm.envs as vllm_envs

        return bool(vllm_envs.VLLM_BATCH_INVARIANT)
    except Exception:  # a vLLM without the mode
        return False


def invariance_problem(thresholds, world_size: int, native) -> str:
    """Why the file cannot serve vLLM's batch-invariant mode ('' when it can): a range that leaves vLLM's path
    for a backend whose results may differ from the baseline's in the last bit, so a token's result would depend
    on the batch (the message size) that carried it."""
    if not batch_invariant():
        return ""
    loose = thresholds.not_bitwise(world_size, native)
    if not loose:
        return ""
    return (
        f"vLLM runs batch-invariant and the thresholds route {len(loose)} range(s) to backends not known to give "
        f"{thresholds.baseline}'s bits ({loose[0]}{', ...' if len(loose) > 1 else ''}); "
        "write the file with `arxtune calibrate RUN --invariant`"
    )


def read_thresholds(world_size: int, model_dtype=None):
    """(thresholds, path, why not): the file for this group, or the reason it cannot be used."""
    from arxtune.runtime import dispatch

    thresholds, path, why = dispatch.read_thresholds(world_size, None, model_dtype)
    return (None if why else thresholds), path, why


def _open_dispatch(comm):
    started_s = time.perf_counter()
    from arxtune.runtime import dispatch
    from arxtune.runtime.group import GroupContext

    device = comm.device
    ctx = GroupContext(
        comm.rank_in_group, comm.world_size, device.index or 0, device, comm.cpu_group, comm.device_group if device.type == "cuda" else None
    )
    loaded = dispatch.load_for_group(ctx, None, _model_dtype())
    if loaded.why:
        _say(comm, logging.WARNING, loaded.why)
        return None
    thresholds = loaded.usable

    def native(name: str) -> bool:  # ranges vLLM's own communicator already serves
        return serves_itself(thresholds.baseline, name)

    refused = invariance_problem(thresholds, comm.world_size, native)
    if refused:  # the same on every rank: one file (agreed above), and vLLM's mode is the engine's
        _say(comm, logging.WARNING, refused)
        return None
    routes = dispatch.Dispatch(ctx, loaded, dispatch.Caller(own_path=VLLM_PATH, own_framework="vllm"))
    started = routes.started
    taken = started.router.takes_anything
    if started.problems:
        _say(
            comm,
            logging.WARNING,
            "; ".join(started.problems) + ("; those ranges use vLLM's path" if taken else ""),
            everything_to_vllm=not taken,
        )
    if not taken:
        routes.close()
        if not started.problems:
            ladder = f" ({started.ladder.line})" if started.ladder is not None else ""
            _say(
                comm,
                logging.INFO,
                f"the thresholds in {loaded.path} give every range to vLLM's {_base_name(comm)}{ladder}"
                f"; set up in {time.perf_counter() - started_s:.2f} s",
            )
        return None
    run_ids = ", ".join(r.run_id for r in thresholds.runs)
    _say(
        comm,
        logging.INFO,
        f"{started.line}; everything else goes to vLLM's {_base_name(comm)} "
        f"(thresholds {loaded.path}{f', runs {run_ids}' if run_ids else ''}); set up in {time.perf_counter() - started_s:.2f} s",
    )
    return routes
