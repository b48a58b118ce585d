"""Factories of the demo repository's models: transformers architectures with random weights.

No download: the builder seeds torch before calling a factory, so the same seed gives the same
weights in every build and in the tests' reference models. Each factory returns a module in eval
mode whose forward takes tensors in the recipe's input order and returns plain tensors (Triton
backends and exporters cannot use Hugging Face ``ModelOutput`` objects).
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, ResNetConfig, ResNetForImageClassification


class ImageClassifier(torch.nn.Module):
    """``pixel_values`` FP32 [batch, 3, H, W] -> ``logits`` FP32 [batch, num_labels]."""

    def __init__(self, model: ResNetForImageClassification) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


class TextEncoder(torch.nn.Module):
    """``input_ids`` INT64 and ``attention_mask`` INT32 [batch, sequence] -> hidden states and pooled.

    The mask arrives as INT32 (what clients commonly send) and is cast here, inside the graph.
    """

    def __init__(self, model: BertModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask.to(torch.int64))
        return out.last_hidden_state, out.pooler_output


def resnet18() -> torch.nn.Module:
    """ResNet-18 layout (basic blocks, depths 2-2-2-2, widths 64-512), 1000 classes, ~11.7 M params."""
    config = ResNetConfig(
        num_channels=3,
        embedding_size=64,
        hidden_sizes=[64, 128, 256, 512],
        depths=[2, 2, 2, 2],
        layer_type="basic",
        hidden_act="relu",
        num_labels=1000,  # type: ignore[call-arg]  # a PretrainedConfig keyword the subclass stubs omit
    )
    return ImageClassifier(ResNetForImageClassification(config)).eval()


def bert_tiny() -> torch.nn.Module:
    """BERT encoder: hidden 128, 2 layers, 2 heads, vocab 1000, up to 512 tokens.

    Eager attention: plain MatMul/Softmax in the exported graph, which every ONNX Runtime execution
    provider and TensorRT handle (the SDPA path exports too, on torch 2.13, with the same results).
    """
    config = BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        attn_implementation="eager",  # type: ignore[call-arg]  # a PretrainedConfig keyword the subclass stubs omit
    )
    return TextEncoder(BertModel(config)).eval()
