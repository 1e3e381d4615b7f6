"""The reference implementations, imported from the test-only folder `make parity-deps` fills.

`.parity/` holds FastVideo 0.2.1, transformers and diffusers, pinned and installed without their
dependency lists (tests/parity/requirements.txt), so they never change the project's environment
or its torch. The folder is appended to `sys.path` only here, so nothing of the project resolves
to it.

Two things are arranged around the import, and nothing else is changed in the references:
- FastVideo's top-level `fastvideo/__init__.py` imports its whole inference front end; the package
  is registered as a bare package over the same folder instead, so only the modules compared here
  (and what they import) are executed.
- `fastvideo.utils` imports `torchvision.utils.make_grid`, which no compared code calls. PyPI's
  torchvision does not load beside this torch, so a stand-in module whose `make_grid` raises is
  registered for that import alone and removed again; transformers and diffusers are imported
  first, so they see no torchvision at all.
- FastVideo's pipeline modules cannot be imported without torchvision's transforms, so a method
  compared from one (the x0 conversion of the LingBot World 2 generation stage) is taken from the
  shipped file's source by `fastvideo_method` and compiled as it stands.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

SITE = Path(__file__).resolve().parents[2] / ".parity"


def _site() -> str:
    if not (SITE / ".installed").exists():
        pytest.skip(f"the parity references are not installed in {SITE}: run `make parity-deps`")
    site = str(SITE)
    if site not in sys.path:
        sys.path.append(site)
    return site


def _make_grid_stand_in(*args: object, **kwargs: object) -> None:
    raise RuntimeError("torchvision stand-in: make_grid is not part of any compared code")


def float32_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Attention over q, k, v [B, L, heads, head_dim] in float32, unmasked: what the references'
    CUDA- or FlashAttention-only attention entry points are routed to on the CPU."""
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(1, 2).contiguous()


class Float32LocalAttention(nn.Module):
    """`float32_sdpa` behind FastVideo's `LocalAttention` interface (its CPU platform names no kernel)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: int | None = None,
        softmax_scale: float | None = None,
        causal: bool = False,
        **_: Any,
    ) -> None:
        super().__init__()
        self.scale, self.causal = softmax_scale, causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, freqs_cis: Any = None) -> torch.Tensor:
        assert freqs_cis is None, "the compared paths rotate q and k before attention"
        return float32_sdpa(q, k, v, causal=self.causal, scale=self.scale)


def fastvideo_module(name: str) -> types.ModuleType:
    """A FastVideo module, e.g. `models.dits.lingbotworld2.causal_fast`, imported as shipped."""
    site = _site()
    if "fastvideo" not in sys.modules:
        # What fastvideo.utils imports from them must resolve with torchvision absent.
        importlib.import_module("diffusers.loaders.lora_base")
        importlib.import_module("transformers.modeling_utils")
        package = types.ModuleType("fastvideo")
        package.__path__ = [f"{site}/fastvideo"]
        package.__spec__ = importlib.machinery.ModuleSpec("fastvideo", None, is_package=True)
        sys.modules["fastvideo"] = package
    full = f"fastvideo.{name}"
    if full in sys.modules:
        return sys.modules[full]
    stand_in = "torchvision" not in sys.modules
    if stand_in:
        tv, tv_utils = types.ModuleType("torchvision"), types.ModuleType("torchvision.utils")
        tv_utils.make_grid = _make_grid_stand_in  # type: ignore[attr-defined]
        tv.utils = tv_utils  # type: ignore[attr-defined]
        sys.modules.update({"torchvision": tv, "torchvision.utils": tv_utils})
    try:
        return importlib.import_module(full)
    finally:
        if stand_in:
            sys.modules.pop("torchvision", None)
            sys.modules.pop("torchvision.utils", None)


def reference_module(name: str) -> types.ModuleType:
    """A module of transformers or diffusers from the parity folder, e.g. `transformers`."""
    _site()
    return importlib.import_module(name)


def fastvideo_method(relative_path: str, class_name: str, method: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """`class_name.method` from FastVideo's `relative_path`, compiled from its shipped source with
    `namespace` as its globals; call it with a stand-in for `self`."""
    path = Path(_site()) / "fastvideo" / relative_path
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    item.decorator_list = []
                    code = compile(ast.Module(body=[item], type_ignores=[]), str(path), "exec")
                    scope = dict(namespace)
                    exec(code, scope)
                    function: Callable[..., Any] = scope[method]
                    return function
    raise LookupError(f"{class_name}.{method} not found in {path}")
