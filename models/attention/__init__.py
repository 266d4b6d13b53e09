"""Attention for group convolutions: input (alpha_F), full, channel/spatial-only, rotation (alpha_RH)."""

from .channel import FullChannelAttention, InputChannelAttention
from .full_attentive_conv import AttentiveGroupConv, AttentiveLiftingConv
from .full_attentive_conv_reference import ReferenceAttentiveGroupConv, ReferenceAttentiveLiftingConv
from .input_attentive_conv import InputAttentiveGroupConv, InputAttentiveLiftingConv
from .parts import AttentionParts, AttentiveLayer
from .spatial import FullSpatialAttention, InputSpatialAttention

__all__ = [
    "AttentionParts",
    "AttentiveLayer",
    "AttentiveGroupConv",
    "AttentiveLiftingConv",
    "FullChannelAttention",
    "FullSpatialAttention",
    "InputAttentiveGroupConv",
    "InputAttentiveLiftingConv",
    "InputChannelAttention",
    "InputSpatialAttention",
    "ReferenceAttentiveGroupConv",
    "ReferenceAttentiveLiftingConv",
]
