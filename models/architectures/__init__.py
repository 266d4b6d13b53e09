"""The paper's architectures, registered by name (see ``models.list_models()``)."""

from ..registry import register_model
from .rot_mnist import RotMNISTCNN, RotMNISTConfig

__all__ = ["RotMNISTCNN", "RotMNISTConfig"]


def _register_rot_mnist() -> None:
    variants = {
        "z2cnn": (dict(group=None, channels=20), "Z2CNN: planar CNN baseline"),
        "p4cnn": (dict(), "P4CNN: p4 group CNN (Cohen & Welling 2016)"),
        "a_p4cnn": (dict(attention="full"), "alpha-P4CNN: full attentive group convolutions"),
        "ach_p4cnn": (dict(attention="channel"), "alpha_CH-P4CNN: channel attention only"),
        "asp_p4cnn": (dict(attention="spatial"), "alpha_SP-P4CNN: spatial attention only"),
        "fa_p4cnn": (dict(attention="input"), "alpha_F-P4CNN: attention on each layer's input"),
        "arh_p4cnn": (dict(attention="rotation"), "alpha_RH-P4CNN: attention over rotations (co-attentive)"),
    }
    for width in (11, 15, 19):
        variants[f"big{width}_p4cnn"] = (dict(channels=width), f"P4CNN with {width} channels")
    for name, (fields, description) in variants.items():
        register_model(
            name, RotMNISTCNN, RotMNISTConfig(**fields),
            dataset="rot_mnist", input_size=28, description=description,
        )


_register_rot_mnist()
