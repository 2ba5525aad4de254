"""Engine profiles: how models are loaded, and which one works on this machine.

Most machines run the standard profile. When the engine process dies during a load or the
first decode after it (a native crash in llama.cpp: an AMX kernel, a GPU driver), the window
offers the next, safer profile; the one that then works is remembered per machine and
llama.cpp build, so the next start uses it without asking. The CLI reads the same memory.
"""

from __future__ import annotations

import hashlib
import platform
import time
from dataclasses import dataclass, replace

from ... import paths

MEMORY_FILE = "engine-profile.json"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    extra_buffer_types: bool = True  # llama.cpp's repacked weights (AMX, AArch64, ...)
    gpu_layers_fraction: float = 1.0  # of the layers the user asked for on the GPU

    def apply(self, options):
        """``options`` (a LoadOptions) as this profile loads them."""
        def fewer(layers: int | None) -> int | None:
            if self.gpu_layers_fraction >= 1.0:
                return layers
            if layers is None or layers < 0:  # "all": llama.cpp caps at the model's own count
                layers = 1000
            return int(layers * self.gpu_layers_fraction)
        return replace(options, extra_buffer_types=self.extra_buffer_types,
                       target_gpu_layers=fewer(options.target_gpu_layers),
                       draft_gpu_layers=fewer(options.draft_gpu_layers))


PROFILES = (
    Profile("standard", "all of llama.cpp's fast paths"),
    Profile("safe", "no extra buffer types (llama.cpp's repacked weights)", extra_buffer_types=False),
    Profile("safe, fewer GPU layers", "no extra buffer types, half the layers on the GPU",
            extra_buffer_types=False, gpu_layers_fraction=0.5),
)
STANDARD = PROFILES[0]


def by_name(name: str) -> Profile:
    for profile in PROFILES:
        if profile.name == name:
            return profile
    return STANDARD


def safer_than(profile: Profile, gpu: bool) -> Profile | None:
    """The next profile to try after ``profile`` crashed; None when there is none left."""
    later = PROFILES[PROFILES.index(profile) + 1:]
    later = [p for p in later if gpu or p.gpu_layers_fraction >= 1.0]  # fewer GPU layers helps only a GPU
    return later[0] if later else None


def machine_key() -> str:
    """This machine and this llama.cpp build: a profile that worked is remembered for both."""
    from . import cpu_settings, native

    build = hashlib.sha256(native.system_info().encode()).hexdigest()[:12]
    return (f"{platform.system()} {platform.machine()} · {cpu_settings.cpu_name()} · "
            f"llama-cpp-python {native.llama_cpp_version()} · {build}")


def _memory() -> dict:
    return paths.read_json_object(paths.data_dir() / MEMORY_FILE) or {}


def remembered() -> tuple[Profile, str]:
    """The profile to use on this machine, and why (empty for the standard one)."""
    entry = _memory().get(machine_key())
    if not isinstance(entry, dict) or not isinstance(entry.get("profile"), str):
        return STANDARD, ""
    profile = by_name(entry["profile"])
    why = entry.get("why") if isinstance(entry.get("why"), str) else ""
    return profile, why


def remember(profile: Profile, why: str) -> None:
    memory = _memory()
    memory[machine_key()] = {"profile": profile.name, "why": why, "at": time.strftime("%Y-%m-%d %H:%M")}
    paths.write_json_atomic(paths.data_dir() / MEMORY_FILE, memory, indent=1)


def describe(profile: Profile, why: str = "") -> str:
    """One line for the CLI and the doctor."""
    if profile is STANDARD:
        return "standard"
    return f"{profile.name} ({profile.description})" + (f"; remembered because {why}" if why else "")
