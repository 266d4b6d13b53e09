"""The paper's architectures, registered by name (see ``models.list_models()``)."""

from ..registry import register_model
from .allcnnc import AllCNNC, AllCNNCConfig
from .densenet import DenseNet, DenseNetConfig
from .resnet import ResNet44, ResNetConfig
from .rot_mnist import RotMNISTCNN, RotMNISTConfig

__all__ = [
    "AllCNNC", "AllCNNCConfig", "DenseNet", "DenseNetConfig",
    "ResNet44", "ResNetConfig", "RotMNISTCNN", "RotMNISTConfig",
]

_ROT_MNIST = {
    "z2cnn": (dict(group=None, channels=20), "Z2CNN: planar CNN baseline"),
    "p4cnn": (dict(), "P4CNN: p4 group CNN (Cohen & Welling 2016)"),
    "a_p4cnn": (dict(attention="full"), "alpha-P4CNN: full attentive group convolutions"),
    "ach_p4cnn": (dict(attention="channel"), "alpha_CH-P4CNN: channel attention only"),
    "asp_p4cnn": (dict(attention="spatial"), "alpha_SP-P4CNN: spatial attention only"),
    "fa_p4cnn": (dict(attention="input"), "alpha_F-P4CNN: attention on each layer's input"),
    "arh_p4cnn": (dict(attention="rotation"), "alpha_RH-P4CNN: attention over rotations (co-attentive)"),
    **{f"big{w}_p4cnn": (dict(channels=w), f"P4CNN with {w} channels") for w in (11, 15, 19)},
}
_CIFAR10 = {
    "allcnnc": (AllCNNC, AllCNNCConfig(group=None, channels=96), "All-CNN-C"),
    "p4_allcnnc": (AllCNNC, AllCNNCConfig(group="p4", channels=48), "p4-All-CNN-C"),
    "fa_p4_allcnnc": (AllCNNC, AllCNNCConfig(group="p4", channels=48, attention="input"), "alpha_F-p4-All-CNN-C"),
    "p4m_allcnnc": (AllCNNC, AllCNNCConfig(group="p4m", channels=32), "p4m-All-CNN-C"),
    "fa_p4m_allcnnc": (AllCNNC, AllCNNCConfig(group="p4m", channels=32, attention="input"), "alpha_F-p4m-All-CNN-C"),
    "a_p4_allcnnc": (AllCNNC, AllCNNCConfig(group="p4", channels=48, attention="full"), "alpha-p4-All-CNN-C (full)"),
    "a_p4m_allcnnc": (AllCNNC, AllCNNCConfig(group="p4m", channels=32, attention="full"), "alpha-p4m-All-CNN-C (full)"),
    "resnet44": (ResNet44, ResNetConfig(group=None, widths=(32, 64, 128)), "ResNet44"),
    "p4m_resnet44": (ResNet44, ResNetConfig(group="p4m"), "p4m-ResNet44"),
    "fa_p4m_resnet44": (ResNet44, ResNetConfig(group="p4m", attention="input"), "alpha_F-p4m-ResNet44"),
}
_PCAM = {
    "densenet": (DenseNetConfig(group=None, channels=26), "DenseNet (Veeling et al. 2018)"),
    "p4_densenet": (DenseNetConfig(group="p4", channels=13), "p4-DenseNet"),
    "fa_p4_densenet": (DenseNetConfig(group="p4", channels=13, attention="input"), "alpha_F-p4-DenseNet"),
    "p4m_densenet": (DenseNetConfig(group="p4m", channels=9), "p4m-DenseNet"),
    "fa_p4m_densenet": (DenseNetConfig(group="p4m", channels=9, attention="input"), "alpha_F-p4m-DenseNet"),
    "a_p4m_densenet": (DenseNetConfig(group="p4m", channels=9, attention="full"), "alpha-p4m-DenseNet (full)"),
}

for _name, (_fields, _text) in _ROT_MNIST.items():
    register_model(_name, RotMNISTCNN, RotMNISTConfig(**_fields), dataset="rot_mnist", input_size=28, description=_text)
for _name, (_builder, _config, _text) in _CIFAR10.items():
    register_model(_name, _builder, _config, dataset="cifar10", input_size=32, description=_text)
for _name, (_config, _text) in _PCAM.items():
    register_model(_name, DenseNet, _config, dataset="pcam", input_size=96, description=_text)
