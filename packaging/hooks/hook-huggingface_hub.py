"""huggingface_hub resolves most of its names lazily (module __getattr__), so list its modules.

Its version checks read package metadata (is hf_xet there?), so carry that metadata too.
"""

from PyInstaller.utils.hooks import collect_submodules, copy_metadata

hiddenimports = collect_submodules(
    "huggingface_hub",
    # The CLI, the inference clients and the framework (torch, tensorflow) serializers are
    # not used to download a GGUF file.
    filter=lambda name: not name.startswith(("huggingface_hub.cli", "huggingface_hub.commands",
                                             "huggingface_hub.inference", "huggingface_hub.serialization._torch",
                                             "huggingface_hub.serialization._tensorflow")),
)
datas = copy_metadata("huggingface_hub")
try:
    datas += copy_metadata("hf_xet")
except Exception:  # hf_xet is optional: without it, downloads use plain HTTP
    pass
