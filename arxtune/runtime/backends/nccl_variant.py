"""NCCL variants: NCCL made to use one protocol, algorithm or channel count, named `nccl[proto=LL,channels=4]`.

Pure data (no torch, no NCCL): the sweep's backend, the registry's names and
the tuner-plugin export all read a variant's settings through this one class.
"""

from __future__ import annotations

from dataclasses import dataclass

#: NCCL's protocol and algorithm names (ncclProtoStr, ncclAlgoStr), in NCCL's index order.
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
#: NCCL's MAXCHANNELS on recent releases: no communicator has more.
MAX_CHANNELS = 64
KEYS = ("proto", "algo", "channels")


def _named(value: str, names: tuple[str, ...], key: str) -> str:
    for name in names:
        if value.lower().replace("_", "") == name.lower():
            return name
    raise ValueError(f"{key}={value} is not one of {', '.join(names)}")


@dataclass(frozen=True)
class NcclVariant:
    """What a variant fixes; None leaves that choice to NCCL."""

    proto: str | None = None
    algo: str | None = None
    channels: int | None = None

    @classmethod
    def parse(cls, settings: dict[str, str]) -> "NcclVariant":
        """{'proto': 'll', 'channels': '4'} -> a variant in NCCL's spelling; ValueError names what is wrong."""
        unknown = [k for k in settings if k not in KEYS]
        if unknown:
            raise ValueError(f"nccl variants set {', '.join(KEYS)}, not {', '.join(unknown)}")
        if not settings:
            raise ValueError("an nccl variant sets at least one of proto, algo, channels")
        channels = settings.get("channels")
        if channels is not None and not (channels.isdigit() and 1 <= int(channels) <= MAX_CHANNELS):
            raise ValueError(f"channels={channels} is not a whole number from 1 to {MAX_CHANNELS}")
        return cls(
            _named(settings["proto"], PROTOCOLS, "proto") if "proto" in settings else None,
            _named(settings["algo"], ALGORITHMS, "algo") if "algo" in settings else None,
            int(channels) if channels is not None else None,
        )

    def settings(self) -> dict[str, str]:
        """The canonical settings, in the order of KEYS: what the variant's name shows."""
        values = {"proto": self.proto, "algo": self.algo, "channels": None if self.channels is None else str(self.channels)}
        return {k: v for k, v in values.items() if v is not None}

    def environment(self) -> dict[str, str]:
        """NCCL's variables for the protocol and algorithm; NCCL reads them when it creates a communicator."""
        values = {"NCCL_PROTO": self.proto, "NCCL_ALGO": self.algo}
        return {k: v for k, v in values.items() if v is not None}
