"""The engine's words, one place each: how to speculate, who drafted, why a generation ended,
which model of a pair, where a model runs.

``str`` enums (Python 3.10 has no ``StrEnum``): each member equals its old plain string,
so JSON output, stored conversations and string comparisons are unchanged.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A str enum that prints, formats and hashes as its value on every Python from 3.10."""

    __str__ = str.__str__  # 3.11 made f"{member}" print "Class.NAME"
    __format__ = str.__format__
    __hash__ = str.__hash__  # a member finds the same dict entry as its string


class Mode(Word):
    """What the user asks for; the order is the CLI's ``--mode`` choices."""

    AUTO = "auto"  # the measured policy picks the drafter and k, or plain decoding
    OFF = "off"  # plain decoding
    DRAFT = "draft"  # the draft model, always
    LOOKUP = "lookup"  # prompt lookup, always
    MTP = "mtp"  # the target's own multi-token prediction (NextN) head, always


class Source(Word):
    """Who proposed a cycle's draft."""

    MODEL = "model"
    LOOKUP = "lookup"
    MEMORY = "memory"  # prompt lookup in what this machine wrote and read before (ngrammemory)
    MTP = "mtp"  # the target's own NextN head
    PREDICTION = "prediction"  # the client's expected output (OpenAI Predicted Outputs)
    GRAMMAR = "grammar"  # the text the answer's grammar forces next (a schema's keys)
    NONE = "none"  # nothing drafted: a plain step


class Finish(Word):
    """Why a generation ended."""

    EOG = "eog"
    MAX_TOKENS = "max_tokens"
    STOPPED = "stopped"
    CONTEXT_FULL = "context_full"


class Role(Word):
    """Which of a pair a model is: the one whose distribution the answer follows, or its drafter."""

    TARGET = "target"
    DRAFT = "draft"


class Device(Word):
    """Where a model's layers run. ``ModelFacts.backend`` is the label shown for it, made from it
    (``backend_label``); code routes on this, never on the label."""

    CPU = "CPU"
    CUDA = "CUDA"
    METAL = "Metal"
    VULKAN = "Vulkan"
    ROCM = "ROCm"  # (llama.cpp's HIP build names its device so)
    SYCL = "SYCL"
    OPENCL = "OpenCL"
    GPU = "GPU"  # a GPU backend not named above: the label keeps ggml's own name
    RPC = "RPC"  # RPC workers take the layers (local GPUs, where there are, after them)

    @classmethod
    def of_gpu(cls, name: str) -> "Device":
        """The member for a GPU backend as ggml names it ('CUDA', 'Metal', ...); GPU for another."""
        return next((d for d in cls if d.value.lower() == name.lower() and d not in (cls.CPU, cls.RPC)), cls.GPU)
