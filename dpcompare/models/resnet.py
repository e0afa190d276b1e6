"""torchvision ResNets, adapted to the input's channel count. torchvision is an optional extra."""

from __future__ import annotations

from torch import nn

from dpcompare.errors import ConfigError


def import_torchvision(what: str):  # noqa: ANN201
    try:
        # lazy: an optional dependency, tried where it is used
        import torchvision
    except Exception as e:  # noqa: BLE001  (CPU torch + CUDA torchvision wheels fail with OSError/RuntimeError)
        raise ConfigError(f"{what} needs torchvision, which does not import here ({type(e).__name__}); "
                          "set up the full flavour (`make setup`; the lean DPCOMPARE_FLAVOUR=cpu has none) or install "
                          "a torchvision matching your torch: pip install -e '.[vision]'") from None
    return torchvision


def resnet(arch: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    tv = import_torchvision(f"model {arch}")
    model = getattr(tv.models, arch)(weights=None, num_classes=num_classes)
    if input_shape[0] != 3:
        model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model
