"""A Qwen-VL-style tokenizer and processor built offline, for verl's dataset loader on CPU.

No tokenizer ships inside an installed package and the hub is out of reach, so the test builds
one with `tokenizers`: a word-level vocabulary (unknown words map to one id; only lengths
matter here) plus Qwen's chat and vision special tokens, and a chat template that renders an
image item as `<|vision_start|><|image_pad|><|vision_end|>` like Qwen-VL's. The image side is
transformers' real Qwen2-VL image processor (PIL backend). The processor class drops Qwen2-VL's
video processor, which needs torchvision.

torchvision: PyPI's wheels link CUDA libraries and fail to import beside the CPU torch of the
test environment (`operator torchvision::nms does not exist`), and no CPU wheel is reachable.
qwen-vl-utils, which verl calls to load images, imports torchvision at the top of its module
but only uses it for video. `import_qwen_vl_utils()` imports the real package and, only when
torchvision cannot be imported, lets that import see a placeholder torchvision for the length
of the import; any use of the placeholder (a video) raises.
"""

from __future__ import annotations

import sys
import types
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer() -> Any:
    """A PreTrainedTokenizerFast with Qwen's special tokens and a Qwen-like chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_processor() -> Any:
    """A Qwen2-VL processor (images only) around `tiny_tokenizer()`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor without its video processor; ProcessorMixin reads the parts from __init__."""

        def __init__(
            self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None
        ) -> None:
            self.image_token = "<|image_pad|>"
            self.video_token = "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageOnlyQwen2VLProcessor(Qwen2VLImageProcessorPil(), tiny_tokenizer(), chat_template=CHAT_TEMPLATE)


class _NoTorchvision(types.ModuleType):
    """Placeholder torchvision: importable, unusable."""

    __version__ = "0.0.0+placeholder"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"torchvision.{name}: torchvision is not importable in this test environment")


def import_qwen_vl_utils() -> types.ModuleType:
    """The real qwen_vl_utils; with a placeholder torchvision during its import when there is none."""
    import pytest

    try:
        import qwen_vl_utils
    except ModuleNotFoundError as exc:
        if exc.name == "qwen_vl_utils":
            pytest.skip("verl's image path needs qwen-vl-utils (verl's verl-core extra)")
    except Exception:  # noqa: BLE001  (a torchvision wheel that cannot load raises RuntimeError)
        pass
    else:
        return qwen_vl_utils
    for name in [m for m in sys.modules if m == "qwen_vl_utils" or m.startswith("qwen_vl_utils.")]:
        del sys.modules[name]  # a half-done import from the attempt above
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "torchvision"}
    placeholders = {name: _NoTorchvision(name) for name in ("torchvision", "torchvision.io", "torchvision.transforms")}
    placeholders["torchvision"].io = placeholders["torchvision.io"]  # type: ignore[attr-defined]
    placeholders["torchvision"].transforms = placeholders["torchvision.transforms"]  # type: ignore[attr-defined]
    placeholders["torchvision.transforms"].InterpolationMode = None  # type: ignore[attr-defined]
    sys.modules.update(placeholders)
    try:
        import qwen_vl_utils
    finally:
        # Nothing else may see the placeholder (transformers probes for torchvision).
        for name in placeholders:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
    return qwen_vl_utils
