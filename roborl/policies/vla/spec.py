"""The settings of a VLA policy (config section `policy.vla`): backbone sizes or checkpoint paths,
fine-tuning mode, dtype and the heads. Plain data, saved as JSON beside the weights."""
from __future__ import annotations

from dataclasses import dataclass, field

FINETUNE_MODES = ("frozen", "lora", "full")
READOUTS = ("pooled", "attention")
ACTION_HEADS = ("lm", "decoder")
RATIOS = ("action", "token")
TOKENIZERS = ("char", "word")
DTYPES = ("float32", "bfloat16")
LANGUAGE_MODELS = ("qwen2", "llama", "gemma")


@dataclass
class VLASpec:
    # pretrained parts (local directories, never a hub id); None builds a tiny model from the sizes below
    vision_path: str | None = None  # a SigLIP checkpoint: config.json + *.safetensors
    language_path: str | None = None  # a causal LM checkpoint: config.json + *.safetensors + tokenizer files
    # tiny backbone built from scratch
    image_size: int = 64  # the vision encoder's input; env images are resized to it
    patch_size: int = 16  # pixels per side of a vision patch
    vision_hidden: int = 64  # width of the vision encoder
    vision_layers: int = 2  # its transformer layers
    vision_heads: int = 2  # its attention heads
    language_model: str = "qwen2"  # qwen2 | llama | gemma
    hidden: int = 64  # width of the language model
    layers: int = 2  # its transformer layers
    heads: int = 2  # its attention heads
    tokenizer: str = "char"  # char | word (tiny backbones only; a language_path brings its own)
    # prompt
    prompt: str = "{instruction}"  # its template, e.g. "In: What action should the robot take to {instruction}?\nOut:"
    max_text_tokens: int = 64  # instructions are padded / truncated to this many tokens
    # fine-tuning
    finetune: str = "full"  # frozen (heads / expert only) | lora (adapters on the LM attention) | full
    lora_rank: int = 8  # r of the LoRA adapters (finetune: lora)
    lora_alpha: int = 16  # their scale α (the update is scaled by α / r)
    lora_dropout: float = 0.0  # dropout on the adapters' input
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])  # adapted modules
    dtype: str = "float32"  # float32 | bfloat16 (backbone; heads and expert stay float32)
    # heads
    value_hidden: list[int] = field(default_factory=lambda: [64])  # the value head's hidden sizes
    detach_value: bool = False  # the value loss does not train the backbone
    # token VLA
    bins: int = 256  # per action dimension, uniform over [-1, 1], the last `bins` ids of the vocabulary
    action_tokens: int = 256  # action ids the tiny tokenizers reserve (≥ bins for the lm head; a decoder has its own)
    temperature: float = 1.0  # of the sampling distribution (and so of its log-probs)
    action_head: str = "lm"  # lm (the LM predicts the action tokens) | decoder (policies/vla/action_decoder.py)
    decoder_width: int = 128  # action_head decoder: its width
    decoder_layers: int = 2  # its transformer layers
    decoder_heads: int = 4  # its attention heads
    decoder_pooled: bool = False  # the decoder also reads the flow expert's pooled features at every token
    ratio: str = "action"  # PPO/GRPO ratio per executed action (its tokens' product) | per token (RLinf's token level)
    # flow VLA: the action expert (a policies/denoisers network conditioned on pooled backbone features)
    expert: str = "mlp"  # mlp | unet
    expert_hidden: list[int] = field(default_factory=lambda: [128, 128])  # widths of the expert's hidden layers
    readout: str = "pooled"  # pooled (last token ⊕ mean) | attention (+ learned queries over every prefix token)
    readout_queries: int = 4  # learned queries of the attention readout
    bc_samples: int = 8  # (τ, ε) pairs per demonstration in the BC loss; one backbone pass serves them all

    def check(self) -> None:
        """One-line errors for values no model can be built from."""
        if self.finetune not in FINETUNE_MODES:
            raise ValueError(f"policy.vla.finetune '{self.finetune}' is unknown; available: "
                             f"{', '.join(FINETUNE_MODES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"policy.vla.dtype '{self.dtype}' is unknown; available: {', '.join(DTYPES)}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"policy.vla.tokenizer '{self.tokenizer}' is unknown; available: {', '.join(TOKENIZERS)}")
        if self.language_model not in LANGUAGE_MODELS:
            raise ValueError(f"policy.vla.language_model '{self.language_model}' is unknown; available: "
                             f"{', '.join(LANGUAGE_MODELS)}")
        if self.readout not in READOUTS:
            raise ValueError(f"policy.vla.readout '{self.readout}' is unknown; available: {', '.join(READOUTS)}")
        if self.action_head not in ACTION_HEADS:
            raise ValueError(f"policy.vla.action_head '{self.action_head}' is unknown; available: "
                             f"{', '.join(ACTION_HEADS)}")
        if self.ratio not in RATIOS:
            raise ValueError(f"policy.vla.ratio '{self.ratio}' is unknown; available: {', '.join(RATIOS)}")
        if self.decoder_layers < 1 or self.decoder_heads < 1 or self.decoder_width % self.decoder_heads:
            raise ValueError(f"policy.vla.decoder_layers and decoder_heads must be at least 1 and decoder_width a "
                             f"multiple of decoder_heads, got {self.decoder_layers}, {self.decoder_width}, "
                             f"{self.decoder_heads}")
        if self.readout_queries < 1:
            raise ValueError(f"policy.vla.readout_queries must be at least 1, got {self.readout_queries}")
        if self.image_size % self.patch_size:
            raise ValueError(f"policy.vla.image_size ({self.image_size}) must be a multiple of patch_size "
                             f"({self.patch_size})")
        if self.bins < 2:
            raise ValueError(f"policy.vla.bins must be at least 2, got {self.bins}")
        if self.action_head == "lm" and not self.language_path and self.bins > self.action_tokens:
            raise ValueError(f"policy.vla.bins ({self.bins}) must be at most policy.vla.action_tokens "
                             f"({self.action_tokens}), the action ids the tokenizer reserves")
        if self.temperature <= 0:
            raise ValueError(f"policy.vla.temperature must be positive, got {self.temperature}")
        if "{instruction}" not in self.prompt:
            raise ValueError(f"policy.vla.prompt must contain '{{instruction}}', got {self.prompt!r}")
